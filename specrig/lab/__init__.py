"""The lab host: a real OpenSSH sshd on loopback, users with zsh/bash/dash login shells,
and a remote venv holding real speculators and vLLM releases.

Everything lives under STATE (sshd config, host keys, pid, wheel cache) and the lab
users' homes; the system sshd and its config are never touched. `up` is idempotent:
each step checks whether its work is done before doing it.

The fleet (`up(hosts=N)`): N more lab hosts, `lab-1` ... `lab-N`, each its own sshd on its own
loopback address (127.0.1.n:2222; Linux routes all of 127/8 to lo) with its own config, host key
and pid under STATE/fleet/<n>/, so that one can be stopped or re-keyed while the others work. They
log in as the same users, so they share the environments in ~specrig; each has its own workdir.
hosts.yaml names the first FLEET_SHIPPED of them (group `lab-fleet`); fleet_inventory(), written by
every `up(hosts=N)` beside the client key (.lab/fleet.yaml), names all N.
"""
from __future__ import annotations

import base64
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import paramiko
import yaml

from specrig.errors import UsageError
from specrig.inventory import Host, load_inventory
from specrig.transport.hostkeys import known_hosts_name, record

STATE = Path("/var/lib/specrig-lab")
READY = STATE / "READY"
SSHD = "/usr/sbin/sshd"
#: Login users of the lab and their shells; `specrig` (zsh) is the main one.
USERS = {"specrig": "/usr/bin/zsh", "specrig-bash": "/bin/bash", "specrig-dash": "/bin/dash"}
MAIN_USER = "specrig"
APT_PACKAGES = ("openssh-server", "zsh", "python3-venv")
#: The releases the analysis-only venv holds: the pair where the drift was first met.
ANALYSIS_PACKAGES = ("speculators==0.3.0", "vllm==0.16.0")
SYSTEM_PYTHON = "/usr/bin/python3"
#: The lab's extra hosts lab-1 ... lab-N (`inv lab.up --hosts N`; "fleet" in their paths and group):
#: host n listens on EXTRA_HOST_ADDRESS + n, port FLEET_PORT; its files are under FLEET / str(n).
FLEET = STATE / "fleet"
FLEET_READY = FLEET / "READY"
EXTRA_HOST_ADDRESS = "127.0.1."
FLEET_PORT = 2222
#: `--hosts` goes up to FLEET_MAX; the addresses above it are left to tests' private hosts.
FLEET_MAX = 199
FLEET_GROUP = "lab-fleet"
#: The size of each tmpfs of a private view (start_fleet_host(private=...)): a test's files, not a dataset.
PRIVATE_VIEW_SIZE = "64m"
#: How many fleet hosts hosts.yaml names (lab-1 ... lab-3, group lab-fleet): `inv lab.up --hosts 3`.
FLEET_SHIPPED = 3


def _sh(*argv: str, user: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    if user:
        argv = ("runuser", "-u", user, "--", *argv)
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise UsageError(f"lab: `{' '.join(argv)}` failed (exit {result.returncode}): "
                         f"{(result.stderr or result.stdout).strip().splitlines()[-1:] or ''}")
    return result


def _require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise UsageError(f"inv {action} must run as root: it installs packages, adds users and starts an sshd",
                         hint="run it with sudo, or as root in a disposable machine")


def lab_host() -> Host:
    return load_inventory().host("lab")


def up(*, runnable: bool = False, hosts: int = 0, slurm: bool = False, log=print) -> None:
    """Build the lab host (idempotent); with `hosts`, also fleet hosts 1 ... hosts (up_fleet); with
    `slurm`, also the lab's Slurm cluster, whose login node is the lab host (specrig.lab.slurm)."""
    _require_root("lab.up")
    if not 0 <= hosts <= FLEET_MAX:
        raise UsageError(f"lab.up --hosts {hosts}: give a number of hosts from 1 to {FLEET_MAX} "
                         "(one loopback address each)")
    host = lab_host()
    STATE.mkdir(parents=True, exist_ok=True)
    os.chmod(STATE, 0o755)
    _install_packages(log)
    client_key = Path(host.identity_file)
    _ensure_key(client_key, comment="specrig-lab-client")
    for user, shell in USERS.items():
        _ensure_user(user, shell, client_key.with_suffix(".pub").read_text(), log)
    _ensure_sshd(host.port, log)
    _record_host_key(host)
    _ensure_analysis_venv(log)
    if runnable:
        from specrig.lab.runnable import RECIPES, build_runnable_env

        # Every recipe, in RECIPES' order: the in-process pairs (lab-cpu, lab-cpu-032), then server mode's
        # clients (lab-server, lab-server-08), each building its server's environment first.
        for recipe in RECIPES:
            build_runnable_env(user=MAIN_USER, home=Path(pwd.getpwnam(MAIN_USER).pw_dir), python=SYSTEM_PYTHON,
                               log=log, recipe=recipe)
    # A later `up` without --runnable leaves the runnable environments in place: READY says so still.
    was_runnable = READY.exists() and READY.read_text() == "runnable\n"
    READY.write_text("runnable\n" if runnable or was_runnable else "analysis\n")
    log(f"lab is up: ssh -p {host.port} -i {client_key} {MAIN_USER}@127.0.0.1 (inv doctor --host lab)")
    if hosts:
        up_fleet(hosts, log=log)
    if slurm:
        from specrig.lab import slurm as lab_slurm

        lab_slurm.up(log=log)


def down(*, log=print) -> None:
    """Remove what `up` made: the Slurm cluster, the sshd, the users and their homes, keys and known_hosts
    lines."""
    _require_root("lab.down")
    host = lab_host()
    from specrig.lab import slurm as lab_slurm

    lab_slurm.down(log=log)  # first: its jobs run as the lab's users
    for number in fleet_numbers():
        remove_fleet_host(number, known_hosts=host.known_hosts, log=log)
    if host.identity_file:
        fleet_inventory(host).unlink(missing_ok=True)
        shutil.rmtree(fleet_inventory(host).parent / ".specrig", ignore_errors=True)
    _stop_sshd(log)
    for user in USERS:
        if _user_exists(user):
            subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
            _sh("userdel", "--remove", user)
            log(f"removed user {user}")
    _forget_host_key(host)
    if host.identity_file:
        for path in (Path(host.identity_file), Path(host.identity_file).with_suffix(".pub")):
            path.unlink(missing_ok=True)
    shutil.rmtree(STATE, ignore_errors=True)
    log("lab is down")


def _install_packages(log) -> None:
    if Path(SSHD).exists() and shutil.which("zsh") and _has_venv_module():
        return
    log(f"installing {', '.join(APT_PACKAGES)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _sh("apt-get", "update", "-qq", env=env)
    _sh("apt-get", "install", "-y", "-qq", "--no-install-recommends", *APT_PACKAGES, env=env)


def _has_venv_module() -> bool:
    return subprocess.run([SYSTEM_PYTHON, "-m", "ensurepip", "--version"], capture_output=True).returncode == 0


def _ensure_key(path: Path, *, comment: str) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))


def _user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def _ensure_user(user: str, shell: str, public_key: str, log) -> None:
    if not _user_exists(user):
        _sh("useradd", "--create-home", "--shell", shell, user)
        # useradd leaves the password locked ('!'), and with `UsePAM no` sshd refuses even key login.
        _sh("usermod", "-p", "*", user)
        log(f"added user {user} (login shell {shell})")
    home = Path(pwd.getpwnam(user).pw_dir)
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    authorized = ssh_dir / "authorized_keys"
    # Append rather than overwrite: several checkouts on one machine share the lab users.
    present = authorized.read_text() if authorized.exists() else ""
    if public_key.strip() not in present:
        authorized.write_text(present + public_key.strip() + "\n")
    entry = pwd.getpwnam(user)
    for path in (ssh_dir, authorized):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chmod(authorized, 0o600)


def _sshd_config(port: int, *, address: str = "127.0.0.1", state: Path = STATE) -> str:
    return "\n".join([
        f"Port {port}",
        f"ListenAddress {address}",
        f"HostKey {state / 'ssh_host_ed25519_key'}",
        f"PidFile {state / 'sshd.pid'}",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes yes",
        f"AllowUsers {' '.join(USERS)}",
        # The test suite opens many connections at once.
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "Subsystem sftp internal-sftp",
        "",
    ])


def running_pid(pid_file: Path) -> int | None:
    """The pid a daemon wrote to `pid_file` (its first word), if that process runs."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _running(pid) else None


def stop_pid(pid_file: Path, *, what: str, log, timeout: float = 20) -> None:
    """SIGTERM the daemon of `pid_file`, SIGKILL it after `timeout`, and wait until it is gone (its ports
    closed, so that a restart finds them free); then remove the pid file."""
    pid = running_pid(pid_file)
    if not pid:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _running(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    pid_file.unlink(missing_ok=True)
    log(f"stopped {what} (pid {pid})")


def _sshd_pid(state: Path = STATE) -> int | None:
    return running_pid(state / "sshd.pid")


def _ensure_sshd(port: int, log, *, address: str = "127.0.0.1", state: Path = STATE,
                 private: tuple[Path, ...] = ()) -> None:
    _ensure_key(state / "ssh_host_ed25519_key", comment="specrig-lab-host")
    config = state / "sshd_config"
    wanted = _sshd_config(port, address=address, state=state)
    changed = not config.exists() or config.read_text() != wanted
    config.write_text(wanted)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    _sh(SSHD, "-t", "-f", str(config))
    pid = _sshd_pid(state)
    if pid and changed:
        os.kill(pid, signal.SIGHUP)  # re-read the config
    if not pid:
        _sh(*_private_view(private), SSHD, "-f", str(config), "-E", str(state / "sshd.log"))
        log(f"started sshd on {address}:{port}" + (f", {', '.join(map(str, private))} its own" if private else ""))
    _wait_listening(port, address=address, state=state)


def _private_view(paths: tuple[Path, ...]) -> tuple[str, ...]:
    """The words that start a daemon in a mount namespace of its own where each of `paths` (existing
    directories) is an empty tmpfs owned as the directory is: what the daemon and every login through it
    write there stays in that namespace, unseen by the machine and its other hosts. Propagation is
    private, so nothing mounted here leaks out; the namespace, and its tmpfs, end with its last process.
    Nothing (empty `paths`): the machine's own view."""
    if not paths:
        return ()
    mounts = [f"mount -t tmpfs -o size={PRIVATE_VIEW_SIZE},mode=0755,uid={os.stat(path).st_uid},"
              f"gid={os.stat(path).st_gid} specrig-private \"${index}\"" for index, path in enumerate(paths, 1)]
    script = " && ".join([*mounts, f"shift {len(paths)}", 'exec "$@"'])
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "private-view", *map(str, paths))


def _wait_listening(port: int, timeout: float = 10, *, address: str = "127.0.0.1", state: Path = STATE) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise UsageError(f"lab sshd is not listening on {address}:{port}; see {state / 'sshd.log'}")


def _stop_sshd(log, *, state: Path = STATE) -> None:
    """Stop the sshd whose pid file is under `state` and wait until it is gone (its port closed)."""
    stop_pid(state / "sshd.pid", what="sshd", log=log, timeout=10)


def _running(pid: int) -> bool:
    """Whether `pid` still runs: a daemon's exit leaves a zombie until init reaps it, at its own pace."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _known_hosts_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line if line.endswith("\n") else line + "\n" for line in path.read_text().splitlines(keepends=True)]


def _write_known_hosts(path: Path, lines: list[str]) -> None:
    _replace_file(path, "".join(lines), mode=0o600)


def _replace_file(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Replace a file at once: a suite reading it meanwhile sees the old or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def _forget_names(known_hosts: str | os.PathLike, names: set[str]) -> None:
    path = Path(known_hosts)
    lines = _known_hosts_lines(path)
    kept = [line for line in lines if line.split(" ", 1)[0] not in names]
    if kept != lines:
        _write_known_hosts(path, kept)


def _forget_host_key(host: Host) -> None:
    _forget_names(host.known_hosts, {known_hosts_name(host.hostname, host.port)})


def _public_key(state: Path) -> paramiko.PKey:
    key_type, key_b64 = (state / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    return paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64))


def _set_known_host(known_hosts: str | os.PathLike, name: str, state: Path) -> None:
    """`name` (known_hosts spelling) holds exactly the key of the sshd under `state`. Left alone when it
    already does, so that running `up` again never takes a key away from a suite using the lab."""
    key = _public_key(state)
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    path = Path(known_hosts)
    text = path.read_text() if path.exists() else ""
    lines = _known_hosts_lines(path)
    if [entry for entry in lines if entry.split(" ", 1)[0] == name] == [line]:
        return
    if text.endswith("\n") or not text:
        if not any(entry.split(" ", 1)[0] == name for entry in lines):
            record(str(path), name, key)  # an append: nothing else in the file moves
            return
    _write_known_hosts(path, [entry for entry in lines if entry.split(" ", 1)[0] != name] + [line])


def _record_host_key(host: Host) -> None:
    """The lab's own host key goes into the project known_hosts: it is trusted by construction."""
    _set_known_host(host.known_hosts, known_hosts_name(host.hostname, host.port), STATE)


# ---- the fleet: lab-1 ... lab-N, each its own sshd on its own loopback address ---------------------

def fleet_address(number: int) -> str:
    return f"{EXTRA_HOST_ADDRESS}{number}"


def fleet_state(number: int) -> Path:
    return FLEET / str(number)


def fleet_name(number: int) -> str:
    return f"lab-{number}"


def fleet_entry(number: int, *, identity_file: str = ".lab/client_key") -> dict:
    """Fleet host `number`'s hosts.yaml entry (hosts.yaml ships lab-1 ... lab-FLEET_SHIPPED as these).
    The runnable environments are the main user's, shared; the workdir (runs, outputs) is its own."""
    workdir = f"~/specrig-fleet/{fleet_name(number)}"
    return {
        "hostname": fleet_address(number),
        "port": FLEET_PORT,
        "user": MAIN_USER,
        "identity_file": identity_file,
        "python": "~/venv-cpu/bin/python",
        "workdir": workdir,
        "env": {"VLLM_CPU_KVCACHE_SPACE": 2},
        "extract": {"model": "~/models/tiny-llama", "data": "~/data/tiny-chat.jsonl",
                    "out": f"{workdir}/out/tiny-llama", "tp": 1, "max_len": 1024},
        "description": f"lab fleet host {number} (own sshd and host key), runnable vLLM on the CPU",
    }


def fleet_inventory(host: Host | None = None) -> Path:
    """The inventory naming all N fleet hosts (group lab-fleet), written beside the lab's client key
    (.lab/fleet.yaml, so its `identity_file: client_key` is that key), with its own known_hosts
    (.lab/.specrig/known_hosts): `SPECRIG_HOSTS=.lab/fleet.yaml inv doctor --host lab-fleet`."""
    return Path((host or lab_host()).identity_file).parent / "fleet.yaml"


def fleet_numbers() -> list[int]:
    """The fleet hosts that have files under FLEET (running or not), in order."""
    if not FLEET.is_dir():
        return []
    return sorted(int(entry.name) for entry in FLEET.iterdir() if entry.name.isdigit())


def fleet_size() -> int:
    """N of the last `up(hosts=N)`; 0 when no fleet was built."""
    try:
        return int(FLEET_READY.read_text())
    except (OSError, ValueError):
        return 0


def fleet_host_running(number: int) -> bool:
    return _sshd_pid(fleet_state(number)) is not None


def up_fleet(count: int, *, log=print) -> None:
    """Fleet hosts 1 ... count, idempotently: sshd running, host key recorded in the project known_hosts
    and in fleet_inventory()'s. A larger fleet of an earlier `up` stays whole (whoever uses its hosts
    keeps them): the fleet is then that size; `down` removes it all."""
    _require_root("lab.up --hosts")
    known_hosts = lab_host().known_hosts
    FLEET.mkdir(parents=True, exist_ok=True)
    if fleet_size() > count:
        log(f"the fleet of an earlier `inv lab.up --hosts {fleet_size()}` stays whole (`inv lab.down` removes it)")
    count = max(count, fleet_size())
    for number in range(1, count + 1):
        start_fleet_host(number, log=log)
        _set_known_host(known_hosts, known_hosts_name(fleet_address(number), FLEET_PORT), fleet_state(number))
    _write_fleet_inventory(count)
    FLEET_READY.write_text(f"{count}\n")
    log(f"lab fleet is up: {fleet_name(1)} ... {fleet_name(count)} on {fleet_address(1)} ... "
        f"{fleet_address(count)}:{FLEET_PORT} (inv doctor --host {FLEET_GROUP}"
        + ("" if count == FLEET_SHIPPED else f", with SPECRIG_HOSTS={fleet_inventory()}") + ")")


def start_fleet_host(number: int, *, private: tuple[Path, ...] = (), log=print) -> None:
    """Fleet host `number`'s sshd, started if it is not running (its key made if it has none). With
    `private` (directories), a host that does not share them: its sshd starts in a mount namespace of its
    own where each is an empty tmpfs (_private_view), as a node whose disk those paths are on would be; it
    stops as any other (stop_fleet_host), and the view goes with it. For private hosts of a test (above
    FLEET_MAX), never the shared fleet's: its other users expect lab-1 ... lab-N to share this machine."""
    if not 1 <= number <= 254:
        raise UsageError(f"lab fleet host {number}: numbers go from 1 to 254 (127.0.1.1 ... 127.0.1.254)")
    if private and (number <= FLEET_MAX or fleet_host_running(number)):
        raise UsageError(f"lab fleet host {number}: a private view is for a test's own stopped host, above "
                         f"{FLEET_MAX} (a running sshd keeps the view it started with)")
    state = fleet_state(number)
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o755)
    _ensure_sshd(FLEET_PORT, log, address=fleet_address(number), state=state, private=tuple(private))


def stop_fleet_host(number: int, *, log=print) -> None:
    """Take fleet host `number` down: its sshd stops (connections are refused); its files stay."""
    _stop_sshd(log, state=fleet_state(number))


def rekey_fleet_host(number: int, private_key: str | None = None, *, log=print) -> str:
    """Give fleet host `number` a new host key (fresh, or `private_key`, an OpenSSH private key's text)
    and restart its sshd; known_hosts is left as it was, so clients now meet a changed key. Returns
    the private key it replaced: `rekey_fleet_host(n, old)` puts it back. `up(hosts=N)` records the
    current keys again."""
    state = fleet_state(number)
    key = state / "ssh_host_ed25519_key"
    old = key.read_text()
    with tempfile.TemporaryDirectory(dir=state) as scratch:
        new = Path(scratch) / "key"
        if private_key is None:
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "specrig-lab-host", "-f", str(new))
        else:
            new.write_text(private_key)
            os.chmod(new, 0o600)
            new.with_suffix(".pub").write_text(_sh("ssh-keygen", "-y", "-f", str(new)).stdout)
        stop_fleet_host(number, log=log)
        os.replace(new.with_suffix(".pub"), key.with_suffix(".pub"))
        os.replace(new, key)
    start_fleet_host(number, log=log)
    log(f"re-keyed {fleet_name(number)}")
    return old


def remove_fleet_host(number: int, *, known_hosts: str | os.PathLike | None = None, log=print) -> None:
    """Stop fleet host `number`, delete its files and its line in `known_hosts` (default: the project's)."""
    stop_fleet_host(number, log=log)
    shutil.rmtree(fleet_state(number), ignore_errors=True)
    _forget_names(known_hosts or lab_host().known_hosts, {known_hosts_name(fleet_address(number), FLEET_PORT)})
    log(f"removed lab fleet host {number}")


def _write_fleet_inventory(count: int) -> None:
    """fleet_inventory(): lab-1 ... lab-count and the group, with its own known_hosts holding their keys."""
    hosts = {fleet_name(number): fleet_entry(number, identity_file="client_key") for number in range(1, count + 1)}
    header = ("# Written by `inv lab.up --hosts N`: the lab fleet, every host its own sshd and host key.\n"
              "# Use it with SPECRIG_HOSTS (or specrig --hosts); hosts.yaml names the first "
              f"{FLEET_SHIPPED}.\n")
    text = header + yaml.safe_dump({"hosts": hosts, "groups": {FLEET_GROUP: list(hosts)}}, sort_keys=False)
    path = fleet_inventory()
    _replace_file(path, text)
    lines = []
    for number in range(1, count + 1):
        key = _public_key(fleet_state(number))
        lines.append(f"{known_hosts_name(fleet_address(number), FLEET_PORT)} {key.get_name()} {key.get_base64()}\n")
    _write_known_hosts(path.parent / ".specrig" / "known_hosts", lines)


def _ensure_analysis_venv(log) -> None:
    home = Path(pwd.getpwnam(MAIN_USER).pw_dir)
    venv = home / "venv"
    marker = venv / ".specrig-packages"
    wanted = "\n".join(ANALYSIS_PACKAGES)
    if marker.exists() and marker.read_text() == wanted:
        return
    wheels = STATE / "wheels"
    wheels.mkdir(exist_ok=True)
    log(f"downloading {', '.join(ANALYSIS_PACKAGES)} (--no-deps)")
    _sh("python3", "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels), *ANALYSIS_PACKAGES)
    os.chmod(wheels, 0o755)
    if not (venv / "bin" / "python").exists():
        _sh(SYSTEM_PYTHON, "-m", "venv", str(venv), user=MAIN_USER)
    log(f"installing them into {venv}")
    _sh(str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps", "--no-index", "--find-links", str(wheels),
        *ANALYSIS_PACKAGES, user=MAIN_USER, cwd="/")
    marker.write_text(wanted)
