"""One injector per fault kind of the fault matrix (tests/faults/cells.py FAULTS), each a context manager:
entering it injects the fault into a run (tests/support/faults.py LabRun) and gives a Fault (when, what, and
how the reaction is seen); leaving it takes the cause away (SIGCONT, the process thawed, the port given back,
the disk freed, the sshd started again, the file restored). tests/support/faults_run.py strings them into
runs.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from base import procs
from specrig.lab import fleet as lab_fleet
from support import faults_nodes
from support.faults import VICTIM, LabRun, Reaction, command_reaction, run_processes, said_in_a_line
from support.patchenv import as_lab_user
from support.paths import REPO


@dataclass
class Fault:
    """An injected fault: when (time.time()), what was done, and how its reaction is seen (None: the
    supervisor's, supervisor_reaction)."""
    at: float
    what: str
    reaction: Callable[[LabRun, dict, float, float], Reaction | None] | None = None


@contextlib.contextmanager
def kill_9(run: LabRun, target: str, pid: int):
    if target == "slurm-step":  # Slurm's own kill of a step: every process in it
        yield Fault(time.time(), faults_nodes.kill_worker_step(run))
        return
    title = procs.cmdline(pid)[:80]
    os.kill(pid, signal.SIGKILL)
    yield Fault(time.time(), f"kill -9 {pid} ({target}: {title})")


@contextlib.contextmanager
def sigstop(run: LabRun, target: str, pid: int):
    os.kill(pid, signal.SIGSTOP)
    try:
        yield Fault(time.time(), f"kill -STOP {pid} ({target})")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


#: The cgroup v1 freezer's hierarchy (this machine's); cgroup v2 has cgroup.freeze in every group instead.
FREEZER = Path("/sys/fs/cgroup/freezer")
CGROUP_V2 = Path("/sys/fs/cgroup")


@contextlib.contextmanager
def freeze(run: LabRun, target: str, pid: int):
    """The process frozen by the cgroup freezer: alive, doing nothing, and not stopped (state D or S, never T),
    as a process stuck in an NCCL collective or a deadlock is; only the run's progress can tell. Thawed and
    put back in its group afterwards."""
    v1 = FREEZER.is_dir()
    group = (FREEZER if v1 else CGROUP_V2) / f"specrig-faults-{uuid.uuid4().hex[:8]}"
    # cgroup.procs moves every thread of the process (v1's `tasks` would move one thread).
    home = (FREEZER if v1 else CGROUP_V2) / "cgroup.procs"
    group.mkdir()
    (group / "cgroup.procs").write_text(f"{pid}\n")
    (group / ("freezer.state" if v1 else "cgroup.freeze")).write_text("FROZEN\n" if v1 else "1\n")
    try:
        yield Fault(time.time(), f"froze {pid} ({target}) in {group}")
    finally:
        (group / ("freezer.state" if v1 else "cgroup.freeze")).write_text("THAWED\n" if v1 else "0\n")
        with contextlib.suppress(OSError):  # gone meanwhile: the supervisor ended it
            home.write_text(f"{pid}\n")
        deadline = time.monotonic() + 10
        while True:  # a process ended while frozen leaves the group as it exits, once thawed
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@contextlib.contextmanager
def reboot(run: LabRun, target: str, pid: int | None):
    """Every process of the run killed at once, as a host's reboot ends them (the lab user's other
    processes belong to other tests on this machine, so they are spared); target `worker-node`: those of a
    multi-node job's worker node alone."""
    if target == "worker-node":  # a Slurm step's srun runs on the head's node (the job's script): it stays
        victims = {pid: args for pid, args in run_processes(run, run.node_dirs[1:]).items()
                   if not args.startswith("srun ")}
    else:
        victims = run_processes(run)
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    yield Fault(time.time(), f"kill -9 of the {'worker node' if target == 'worker-node' else 'run'}'s "
                f"{len(victims)} processes at once")


@contextlib.contextmanager
def ssh_drop(run: LabRun, target: str, pid: int | None):
    """A laptop command's SSH connection dropped (the sshd processes serving it killed): the attached
    `inv extract`'s (target live-view), whose reaction is the live view ending, saying the run goes on; or
    `inv gather`'s while its host loads the files (target gather), whose reaction is its answer."""
    if target == "gather":
        host, run_id = run.output_target()
        client = subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(REPO), "gather", "--host", host,
                                   "--run", run_id], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env={**os.environ, "SPECRIG_HOSTS": str(run.inventory), "COLUMNS": "400"})
        loading = wait_for_process(lambda args: "verify_output.py" in args and str(run.out) in args)
    else:
        client, loading = run.attached, None
    serving = sshd_serving(client.pid)
    for victim in serving:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)

    def client_ends(run: LabRun, before: dict, at: float, watch_s: float) -> Reaction | None:
        try:
            said, errors = client.communicate(timeout=watch_s)
        except subprocess.TimeoutExpired:
            return None
        if target == "gather":
            line = said_in_a_line((said + errors).decode(errors="replace"))
            return Reaction(round(time.time() - at, 1), f"exit {client.returncode}: {line}", client.returncode)
        said = " ".join(errors.decode(errors="replace").split())
        return Reaction(round(time.time() - at, 1), f"the live view exited {client.returncode}: {said[-400:]}")

    doing = f"while {loading} loaded the files" if loading else "serving the live view"
    try:
        yield Fault(time.time(), f"killed the sshd processes {sorted(serving)} {doing}", client_ends)
    finally:
        client.kill()
        client.wait()


def wait_for_process(matches: Callable[[str], bool], timeout: float = 120) -> str:
    """The first process whose command line `matches`, as `pid args` (short), once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines():
            if matches(line) and "ps -eo" not in line:
                return line.strip()[:100]
        time.sleep(0.05)
    raise RuntimeError(f"no such process within {timeout} s")


@contextlib.contextmanager
def sshd_killed(run: LabRun, target: str, pid: int | None):
    """The host's sshd stopped (a host of the harness's own); `inv status` is the reaction. Started again."""
    lab_fleet.stop_fleet_host(run.own_host, log=quiet)
    try:
        yield Fault(time.time(), f"stopped {lab_fleet.fleet_name(run.own_host)}'s sshd",
                    lambda run, before, at, watch_s: command_reaction(
                        ("status", "--host", run.host, "--run", run.run_id), run, at))
    finally:
        lab_fleet.start_fleet_host(run.own_host, log=quiet)


@contextlib.contextmanager
def disk_full(run: LabRun, target: str, pid: int | None):
    """Another file takes the output's filesystem (a tmpfs) down to a MiB; removed afterwards."""
    filler = run.out.parent / f"filler-{uuid.uuid4().hex[:6]}"
    free_mib = shutil.disk_usage(run.out).free // 2 ** 20
    as_lab_user("dd", "if=/dev/zero", f"of={filler}", "bs=1M", f"count={max(free_mib - 1, 0)}", "status=none",
                check=False)
    try:
        yield Fault(time.time(), f"filled {run.out.parent} ({free_mib} MiB free) with {filler.name}")
    finally:
        as_lab_user("rm", "-f", str(filler))


@contextlib.contextmanager
def port_taken(run: LabRun, target: str, pid: int | None):
    """The run's server port bound and listened on by another process (this one)."""
    holder = socket.socket()
    # As vLLM binds: the connections the killed server left in TIME_WAIT do not keep the port.
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.monotonic() + 10
    while True:  # the attempt's server may take a moment more to let it go
        try:
            holder.bind(("127.0.0.1", run.port))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    holder.listen()
    try:
        yield Fault(time.time(), f"port {run.port} bound by another process")
    finally:
        holder.close()


def sample_file(run: LabRun) -> Path:
    return run.out / (f"data_{VICTIM}.pt" if run.path == "in-process" else f"hs_{VICTIM}.safetensors")


@contextlib.contextmanager
def damaged_file(run: LabRun, damage: tuple[str, ...], what: str):
    """A sample file damaged by the lab user (`damage` + its path) after the run, read back by the cell's
    command (tests/support/faults_ended.py); restored afterwards."""
    victim = sample_file(run)
    kept, owner = victim.read_bytes(), victim.stat()
    as_lab_user(*damage, str(victim))
    try:
        yield Fault(time.time(), f"{what} {victim.name}")
    finally:
        victim.unlink(missing_ok=True)
        victim.write_bytes(kept)
        os.chown(victim, owner.st_uid, owner.st_gid)
        os.chmod(victim, 0o600)


def file_unreadable(run: LabRun, target: str, pid: int | None):
    return damaged_file(run, ("chmod", "000"), "chmod 000")


def file_truncated(run: LabRun, target: str, pid: int | None):
    return damaged_file(run, ("truncate", "-s", str(sample_file(run).stat().st_size // 2)), "cut to half:")


def file_removed(run: LabRun, target: str, pid: int | None):
    return damaged_file(run, ("rm", "-f"), "removed")


INJECTORS = {"kill-9": kill_9, "sigstop": sigstop, "freeze": freeze, "reboot": reboot, "ssh-drop": ssh_drop,
             "sshd-killed": sshd_killed, "disk-full": disk_full, "port-taken": port_taken,
             "file-unreadable": file_unreadable, "file-truncated": file_truncated, "file-removed": file_removed}


# ---- what the injectors need -------------------------------------------------------------------------------

def quiet(line: str) -> None:
    pass


def sshd_serving(client_pid: int) -> set[int]:
    """The sshd processes at the far end of `client_pid`'s SSH connections (any lab sshd, port
    lab_fleet.FLEET_PORT: the lab's and every fleet host's)."""
    sockets = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        sockets.append((int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16), fields[9]))
    links = fd_links(client_pid)
    client_ports = {local for local, remote, inode in sockets
                    if remote == lab_fleet.FLEET_PORT and f"socket:[{inode}]" in links}
    serving = {f"socket:[{inode}]" for local, remote, inode in sockets
               if local == lab_fleet.FLEET_PORT and remote in client_ports}
    return {int(pid) for pid in filter(str.isdigit, os.listdir("/proc"))
            if int(pid) != client_pid and fd_links(int(pid)) & serving}


def fd_links(pid: int) -> set[str]:
    try:
        return {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return set()


