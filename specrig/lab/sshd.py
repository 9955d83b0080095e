"""An sshd of the lab's own, on a loopback address: its config, its host key, starting and stopping it
(optionally in a private view of some directories), and its host key in known_hosts files. The lab host
runs one (STATE), each fleet host another (fleet.py); the system sshd and its config are never touched.
"""
from __future__ import annotations

import base64
import os
import signal
import socket
import time
from pathlib import Path

import paramiko

from specrig.errors import UsageError
from specrig.lab.machine import STATE, USERS, replace_file, run_command, running_pid, stop_pid
from specrig.transport.hostkeys import record

SSHD = "/usr/sbin/sshd"
#: The size of each tmpfs of a private view (fleet.start_fleet_host(private=...)): a test's files, not a dataset.
PRIVATE_VIEW_SIZE = "64m"


def ensure_key(path: Path, *, comment: str) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    run_command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))


def sshd_config(port: int, *, address: str = "127.0.0.1", state: Path = STATE) -> str:
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


def sshd_pid(state: Path = STATE) -> int | None:
    return running_pid(state / "sshd.pid")


def ensure_sshd(port: int, log, *, address: str = "127.0.0.1", state: Path = STATE,
                 private: tuple[Path, ...] = ()) -> None:
    ensure_key(state / "ssh_host_ed25519_key", comment="specrig-lab-host")
    config = state / "sshd_config"
    wanted = sshd_config(port, address=address, state=state)
    changed = not config.exists() or config.read_text() != wanted
    config.write_text(wanted)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    run_command(SSHD, "-t", "-f", str(config))
    pid = sshd_pid(state)
    if pid and changed:
        os.kill(pid, signal.SIGHUP)  # re-read the config
    if not pid:
        run_command(*_private_view(private), SSHD, "-f", str(config), "-E", str(state / "sshd.log"))
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


def stop_sshd(log, *, state: Path = STATE) -> None:
    """Stop the sshd whose pid file is under `state` and wait until it is gone (its port closed)."""
    stop_pid(state / "sshd.pid", what="sshd", log=log, timeout=10)


def _known_hosts_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line if line.endswith("\n") else line + "\n" for line in path.read_text().splitlines(keepends=True)]


def write_known_hosts(path: Path, lines: list[str]) -> None:
    replace_file(path, "".join(lines), mode=0o600)


def forget_names(known_hosts: str | os.PathLike, names: set[str]) -> None:
    path = Path(known_hosts)
    lines = _known_hosts_lines(path)
    kept = [line for line in lines if line.split(" ", 1)[0] not in names]
    if kept != lines:
        write_known_hosts(path, kept)


def public_key(state: Path) -> paramiko.PKey:
    key_type, key_b64 = (state / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    return paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64))


def set_known_host(known_hosts: str | os.PathLike, name: str, state: Path) -> None:
    """`name` (known_hosts spelling) holds exactly the key of the sshd under `state`. Left alone when it
    already does, so that running `up` again never takes a key away from a suite using the lab."""
    key = public_key(state)
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
    write_known_hosts(path, [entry for entry in lines if entry.split(" ", 1)[0] != name] + [line])
