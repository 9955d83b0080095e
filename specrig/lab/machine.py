"""This machine as the lab uses it: where the lab keeps its files (STATE), its login users, the commands it
runs (as root, or as one of its users), the daemons it starts (by pid file), the files it replaces, and
the lab host as the checkout's hosts.yaml names it. Every other part of the lab builds on these.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from specrig.errors import UsageError
from specrig.inventory import Host, load_inventory

STATE = Path("/var/lib/specrig-lab")
#: Login users of the lab and their shells; `specrig` (zsh) is the main one.
USERS = {"specrig": "/usr/bin/zsh", "specrig-bash": "/bin/bash", "specrig-dash": "/bin/dash"}
MAIN_USER = "specrig"


def run_command(*argv: str, user: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run `argv` to its end (as `user`, given one); a failure is UsageError with its last line of output."""
    if user:
        argv = ("runuser", "-u", user, "--", *argv)
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise UsageError(f"lab: `{' '.join(argv)}` failed (exit {result.returncode}): "
                         f"{(result.stderr or result.stdout).strip().splitlines()[-1:] or ''}")
    return result


def require_root(action: str) -> None:
    """UsageError unless this process is root: `action` installs packages, adds users and starts daemons."""
    if os.geteuid() != 0:
        raise UsageError(f"inv {action} must run as root: it installs packages, adds users and starts an sshd",
                         hint="run it with sudo, or as root in a disposable machine")


def apt_install(packages: tuple[str, ...], *, log) -> None:
    """Install Debian packages with apt-get, asking nothing."""
    log(f"installing {', '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run_command("apt-get", "update", "-qq", env=env)
    run_command("apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages, env=env)


def lab_host() -> Host:
    return load_inventory().host("lab")


def running_pid(pid_file: Path) -> int | None:
    """The pid a daemon wrote to `pid_file` (its first word), if that process runs."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if process_running(pid) else None


def stop_pid(pid_file: Path, *, what: str, log, timeout: float = 20) -> None:
    """SIGTERM the daemon of `pid_file`, SIGKILL it after `timeout`, and wait until it is gone (its ports
    closed, so that a restart finds them free); then remove the pid file."""
    pid = running_pid(pid_file)
    if not pid:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while process_running(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    pid_file.unlink(missing_ok=True)
    log(f"stopped {what} (pid {pid})")


def process_running(pid: int) -> bool:
    """Whether `pid` still runs: a daemon's exit leaves a zombie until init reaps it, at its own pace."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def replace_file(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Replace a file at once: a suite reading it meanwhile sees the old or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(temporary, mode)
    os.replace(temporary, path)
