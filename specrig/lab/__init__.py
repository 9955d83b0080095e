"""The lab host: a real OpenSSH sshd on loopback, users with zsh/bash/dash login shells,
and a remote venv holding real speculators and vLLM releases.

Everything lives under STATE (sshd config, host keys, pid, wheel cache) and the lab
users' homes; the system sshd and its config are never touched. `up` is idempotent:
each step checks whether its work is done before doing it.
"""
from __future__ import annotations

import base64
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import paramiko

from specrig.errors import UsageError
from specrig.transport.hostkeys import known_hosts_name, record
from specrig.inventory import Host, load_inventory

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


def up(*, runnable: bool = False, log=print) -> None:
    """Build the lab host (idempotent)."""
    _require_root("lab.up")
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

        # Every pair: the one where the drift was first met (lab-cpu) and a current one (lab-cpu-032).
        for recipe in RECIPES:
            build_runnable_env(user=MAIN_USER, home=Path(pwd.getpwnam(MAIN_USER).pw_dir), python=SYSTEM_PYTHON,
                               log=log, recipe=recipe)
    READY.write_text("runnable\n" if runnable else "analysis\n")
    log(f"lab is up: ssh -p {host.port} -i {client_key} {MAIN_USER}@127.0.0.1 (inv doctor --host lab)")


def down(*, log=print) -> None:
    """Remove what `up` made: the sshd, the users and their homes, keys and known_hosts lines."""
    _require_root("lab.down")
    host = lab_host()
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


def _sshd_config(port: int) -> str:
    return "\n".join([
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {STATE / 'ssh_host_ed25519_key'}",
        f"PidFile {STATE / 'sshd.pid'}",
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


def _sshd_pid() -> int | None:
    try:
        pid = int((STATE / "sshd.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def _ensure_sshd(port: int, log) -> None:
    _ensure_key(STATE / "ssh_host_ed25519_key", comment="specrig-lab-host")
    config = STATE / "sshd_config"
    wanted = _sshd_config(port)
    changed = not config.exists() or config.read_text() != wanted
    config.write_text(wanted)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    _sh(SSHD, "-t", "-f", str(config))
    pid = _sshd_pid()
    if pid and changed:
        os.kill(pid, signal.SIGHUP)  # re-read the config
    if not pid:
        _sh(SSHD, "-f", str(config), "-E", str(STATE / "sshd.log"))
        log(f"started sshd on 127.0.0.1:{port}")
    _wait_listening(port)


def _wait_listening(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise UsageError(f"lab sshd is not listening on 127.0.0.1:{port}; see {STATE / 'sshd.log'}")


def _stop_sshd(log) -> None:
    pid = _sshd_pid()
    if pid:
        os.kill(pid, signal.SIGTERM)
        log(f"stopped sshd (pid {pid})")


def _forget_host_key(host: Host) -> None:
    path = Path(host.known_hosts)
    if path.exists():
        name = known_hosts_name(host.hostname, host.port)
        kept = [line for line in path.read_text().splitlines(keepends=True) if line.split(" ", 1)[0] != name]
        path.write_text("".join(kept))


def _record_host_key(host: Host) -> None:
    """The lab's own host key goes into the project known_hosts: it is trusted by construction."""
    _forget_host_key(host)
    key_type, key_b64 = (STATE / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    key = paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64))
    record(host.known_hosts, known_hosts_name(host.hostname, host.port), key)


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
