"""The lab host: a real OpenSSH sshd on loopback, users with zsh/bash/dash login shells,
and a remote venv holding real speculators and vLLM releases.

Everything lives under STATE (sshd config, host keys, pid, wheel cache) and the lab
users' homes; the system sshd and its config are never touched. `up` is idempotent:
each step checks whether its work is done before doing it. With it come, when asked, the lab's
fleet (fleet.py: lab-1 ... lab-N), its Slurm cluster (slurm.py) and the environments that can run
the extraction (runnable.py); `down` removes them all. What every part does on this machine is
machine.py's, an sshd and its host key sshd.py's.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

from specrig.errors import UsageError
from specrig.inventory import Host
from specrig.lab import slurm as lab_slurm
from specrig.lab.fleet import FLEET_MAX, fleet_inventory, fleet_numbers, remove_fleet_host, up_fleet
from specrig.lab.machine import MAIN_USER, STATE, USERS, apt_install, lab_host, require_root, run_command
from specrig.lab.sshd import SSHD, ensure_key, ensure_sshd, forget_names, set_known_host, sshd_config, stop_sshd
from specrig.transport.hostkeys import known_hosts_name

READY = STATE / "READY"
APT_PACKAGES = ("openssh-server", "zsh", "python3-venv")
#: The releases the analysis-only venv holds: the pair where the drift was first met.
ANALYSIS_PACKAGES = ("speculators==0.3.0", "vllm==0.16.0")
SYSTEM_PYTHON = "/usr/bin/python3"
#: benchmarks/device_fleet/setup.py builds its sshds with the lab's config, imported by this name.
_sshd_config = sshd_config


def up(*, runnable: bool = False, hosts: int = 0, slurm: bool = False, log=print) -> None:
    """Build the lab host (idempotent); with `hosts`, also fleet hosts 1 ... hosts (up_fleet); with
    `slurm`, also the lab's Slurm cluster, whose login node is the lab host (specrig.lab.slurm)."""
    require_root("lab.up")
    if not 0 <= hosts <= FLEET_MAX:
        raise UsageError(f"lab.up --hosts {hosts}: give a number of hosts from 1 to {FLEET_MAX} "
                         "(one loopback address each)")
    host = lab_host()
    STATE.mkdir(parents=True, exist_ok=True)
    os.chmod(STATE, 0o755)
    _install_packages(log)
    client_key = Path(host.identity_file)
    ensure_key(client_key, comment="specrig-lab-client")
    for user, shell in USERS.items():
        _ensure_user(user, shell, client_key.with_suffix(".pub").read_text(), log)
    ensure_sshd(host.port, log)
    _record_host_key(host)
    _ensure_analysis_venv(log)
    if runnable:
        from specrig.lab.runnable import build_runnable_envs

        # Every recipe: the in-process pairs (lab-cpu, lab-cpu-032) and server mode's clients (lab-server,
        # lab-server-08) with their server's environment.
        build_runnable_envs(user=MAIN_USER, home=Path(pwd.getpwnam(MAIN_USER).pw_dir), python=SYSTEM_PYTHON, log=log)
    # A later `up` without --runnable leaves the runnable environments in place: READY says so still.
    was_runnable = READY.exists() and READY.read_text() == "runnable\n"
    READY.write_text("runnable\n" if runnable or was_runnable else "analysis\n")
    log(f"lab is up: ssh -p {host.port} -i {client_key} {MAIN_USER}@127.0.0.1 (inv doctor --host lab)")
    if hosts:
        up_fleet(hosts, log=log)
    if slurm:
        lab_slurm.up(log=log)


def down(*, log=print) -> None:
    """Remove what `up` made: the Slurm cluster, the sshd, the users and their homes, keys and known_hosts
    lines."""
    require_root("lab.down")
    host = lab_host()
    lab_slurm.down(log=log)  # first: its jobs run as the lab's users
    for number in fleet_numbers():
        remove_fleet_host(number, known_hosts=host.known_hosts, log=log)
    if host.identity_file:
        fleet_inventory(host).unlink(missing_ok=True)
        shutil.rmtree(fleet_inventory(host).parent / ".specrig", ignore_errors=True)
    stop_sshd(log)
    for user in USERS:
        if _user_exists(user):
            subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
            run_command("userdel", "--remove", user)
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
    apt_install(APT_PACKAGES, log=log)


def _has_venv_module() -> bool:
    return subprocess.run([SYSTEM_PYTHON, "-m", "ensurepip", "--version"], capture_output=True).returncode == 0


def _user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def _ensure_user(user: str, shell: str, public_key: str, log) -> None:
    if not _user_exists(user):
        run_command("useradd", "--create-home", "--shell", shell, user)
        # useradd leaves the password locked ('!'), and with `UsePAM no` sshd refuses even key login.
        run_command("usermod", "-p", "*", user)
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


def _forget_host_key(host: Host) -> None:
    forget_names(host.known_hosts, {known_hosts_name(host.hostname, host.port)})


def _record_host_key(host: Host) -> None:
    """The lab's own host key goes into the project known_hosts: it is trusted by construction."""
    set_known_host(host.known_hosts, known_hosts_name(host.hostname, host.port), STATE)


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
    run_command("python3", "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels), *ANALYSIS_PACKAGES)
    os.chmod(wheels, 0o755)
    if not (venv / "bin" / "python").exists():
        run_command(SYSTEM_PYTHON, "-m", "venv", str(venv), user=MAIN_USER)
    log(f"installing them into {venv}")
    run_command(str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps", "--no-index", "--find-links", str(wheels),
        *ANALYSIS_PACKAGES, user=MAIN_USER, cwd="/")
    marker.write_text(wanted)
