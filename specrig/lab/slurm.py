"""The lab's Slurm cluster (`inv lab.up --slurm`): a real slurmctld and slurmd from Debian's
slurm-wlm, with the lab's sshd as the cluster's login node.

Two compute nodes on this one machine, as several slurmd processes (`slurmd -N <node>`), each with
its own port, spool, pid and log. That needs a Slurm built with multiple-slurmd support: Debian's
bookworm build (22.05) has it (`scontrol show config` says MULTIPLE_SLURMD = Yes, and two slurmd -N
on one NodeHostname register and run jobs), so no network namespaces are needed. The
nodes share this machine's filesystem, as compute nodes share /home on a real cluster.

Everything is under SLURM_STATE: slurm.conf and gres.conf, a munged of the lab's own (its key,
socket, pid and log: the system's munge is not used), the daemons' state, spool, pids and logs.
Outside it only the client configuration path: Debian's commands (sbatch, squeue, sinfo, srun)
read /etc/slurm/slurm.conf, as on a real login node, so that path is a link to the lab's file;
`down` removes the link only when it is the lab's. The packages stay installed after `down`.
"""
from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

from specrig.errors import UsageError
from specrig.lab.machine import STATE, apt_install, replace_file, require_root, run_command, running_pid, stop_pid

SLURM_STATE = STATE / "slurm"
SLURM_READY = SLURM_STATE / "READY"
SLURM_CONF = SLURM_STATE / "slurm.conf"
#: Where Debian's Slurm commands look for the configuration (its build's default).
CLIENT_CONF = Path("/etc/slurm/slurm.conf")
APT_PACKAGES = ("slurm-wlm", "munge")
SLURM_USER = "slurm"
MUNGE_USER = "munge"
MUNGE_SOCKET = SLURM_STATE / "munge" / "munge.socket"
CLUSTER = "specrig-lab"
#: Ports of the lab's daemons, away from Slurm's defaults (6817, 6818) so that a real Slurm on
#: the machine is left alone.
CONTROLLER_PORT = 16817
#: The compute nodes and their slurmd ports. Each advertises 2 CPUs (this machine has 2 cores,
#: shared: jobs here are small) and GPUS_PER_NODE GPUs that do not exist.
NODES = {"lab-node1": 16818, "lab-node2": 16819}
CPUS_PER_NODE = 2
MEMORY_MB = 2048
#: Each node's GPUs, gres `gpu`. Slurm 22.05 drops a GPU gres without device files ("Removing file-less
#: GPU"), and wants character devices (a plain file is "not a valid character or block device"), so each
#: node gets NVIDIA's device nodes (major 195, as /dev/nvidiaN) under SLURM_STATE/dev/<node>/ with no
#: driver behind them: Slurm counts, allocates and binds them (CUDA_VISIBLE_DEVICES), and opening one
#: fails (ENXIO). Nothing computes on them: jobs run on the CPU.
GPUS_PER_NODE = 2
NVIDIA_MAJOR = 195
#: The partitions: `gpu` (default) spans both nodes with a 2-hour limit; `debug` one node, 10 minutes.
PARTITIONS = {"gpu": {"nodes": list(NODES), "max_time": "02:00:00", "default": True},
              "debug": {"nodes": list(NODES)[:1], "max_time": "00:10:00", "default": False}}
READY_TIMEOUT_S = 60


def slurm_conf(*, controller: str) -> str:
    """The lab's slurm.conf; `controller` is this machine's short hostname, which slurmctld checks."""
    lines = [
        f"ClusterName={CLUSTER}",
        f"SlurmctldHost={controller}(127.0.0.1)",
        f"SlurmctldPort={CONTROLLER_PORT}",
        f"SlurmUser={SLURM_USER}",
        f"AuthInfo=socket={MUNGE_SOCKET}",
        f"StateSaveLocation={SLURM_STATE / 'ctld'}",
        f"SlurmctldPidFile={SLURM_STATE / 'run' / 'slurmctld.pid'}",
        f"SlurmctldLogFile={SLURM_STATE / 'log' / 'slurmctld.log'}",
        # %n: each slurmd -N <node> its own spool, pid and log.
        f"SlurmdSpoolDir={SLURM_STATE / 'spool' / '%n'}",
        f"SlurmdPidFile={SLURM_STATE / 'run' / 'slurmd-%n.pid'}",
        f"SlurmdLogFile={SLURM_STATE / 'log' / 'slurmd-%n.log'}",
        # Nodes take the sizes written here, not the machine's: two nodes share its two cores.
        "SlurmdParameters=config_overrides",
        # No cgroups in a container: processes tracked by parentage, no task binding, no accounting.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "ReturnToService=2",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "KillWait=5",
    ]
    for node, port in NODES.items():
        lines.append(f"NodeName={node} NodeHostname={controller} NodeAddr=127.0.0.1 Port={port} "
                     f"CPUs={CPUS_PER_NODE} RealMemory={MEMORY_MB} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN")
    for name, partition in PARTITIONS.items():
        lines.append(f"PartitionName={name} Nodes={','.join(partition['nodes'])} MaxTime={partition['max_time']} "
                     f"Default={'YES' if partition['default'] else 'NO'} State=UP")
    return "\n".join(lines) + "\n"


def gres_conf() -> str:
    """Each node's GPUs: its own device nodes (GPUS_PER_NODE)."""
    return "".join(f"NodeName={node} Name=gpu File={_devices(node) / 'nvidia'}[0-{GPUS_PER_NODE - 1}]\n"
                   for node in NODES)


def _devices(node: str) -> Path:
    return SLURM_STATE / "dev" / node


def _make_devices() -> None:
    """The device nodes gres.conf names: character devices of NVIDIA's major, no driver behind them."""
    for node in NODES:
        _devices(node).mkdir(parents=True, exist_ok=True)
        for index in range(GPUS_PER_NODE):
            path = _devices(node) / f"nvidia{index}"
            if not path.exists():
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, index))


def slurm_is_up() -> bool:
    return SLURM_READY.exists()


def up(*, log=print) -> None:
    """The lab's Slurm (idempotent): munged, slurmctld and a slurmd per node running this config,
    every node idle. A changed configuration restarts the daemons."""
    require_root("lab.up --slurm")
    _install_packages(log=log)
    changed = _write_configuration()
    _make_devices()
    _ensure_munged(log=log)
    if changed:
        _stop_daemons(log=log)
    _ensure_slurmctld(log=log, fresh=changed)
    for node in NODES:
        _ensure_slurmd(node, log=log)
    _wait_idle()
    SLURM_READY.write_text(f"{CLUSTER}\n")
    log(f"lab Slurm is up: cluster {CLUSTER}, nodes {', '.join(NODES)}, partitions {', '.join(PARTITIONS)}; "
        "the lab's sshd is its login node (inv doctor --host lab-slurm)")


def down(*, log=print) -> None:
    """Stop the daemons, remove SLURM_STATE and the client configuration link (the packages stay)."""
    require_root("lab.down")
    _cancel_jobs(log=log)
    _stop_daemons(log=log)
    stop_pid(SLURM_STATE / "munge" / "munged.pid", what="munged", log=log)
    if CLIENT_CONF.is_symlink() and CLIENT_CONF.resolve() == SLURM_CONF.resolve():
        CLIENT_CONF.unlink()
    shutil.rmtree(SLURM_STATE, ignore_errors=True)
    log("lab Slurm is down (slurm-wlm and munge stay installed)")


def _install_packages(*, log) -> None:
    if shutil.which("slurmctld") and shutil.which("slurmd") and shutil.which("munged"):
        return
    apt_install(APT_PACKAGES, log=log)


def _owned_dir(path: Path, *, user: str, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chmod(path, mode)


def _write_configuration() -> bool:
    """The state directories, slurm.conf, gres.conf and the client link; whether either file changed."""
    SLURM_STATE.mkdir(parents=True, exist_ok=True)
    os.chmod(SLURM_STATE, 0o755)
    for name in ("run", "log"):
        _owned_dir(SLURM_STATE / name, user=SLURM_USER, mode=0o755)
    _owned_dir(SLURM_STATE / "ctld", user=SLURM_USER, mode=0o700)
    _owned_dir(SLURM_STATE / "spool", user="root", mode=0o755)
    changed = False
    for path, text in ((SLURM_CONF, slurm_conf(controller=socket.gethostname().split(".")[0])),
                       (SLURM_STATE / "gres.conf", gres_conf())):
        changed |= not path.exists() or path.read_text() != text
        replace_file(path, text)
    if CLIENT_CONF.is_symlink() and CLIENT_CONF.resolve() == SLURM_CONF.resolve():
        return changed
    if CLIENT_CONF.exists() or CLIENT_CONF.is_symlink():
        raise UsageError(f"lab.up --slurm: {CLIENT_CONF} exists and is not the lab's; the lab leaves it alone",
                         hint="this machine has a Slurm of its own: build the lab on a machine without one")
    CLIENT_CONF.parent.mkdir(parents=True, exist_ok=True)
    CLIENT_CONF.symlink_to(SLURM_CONF)
    return changed


def _ensure_munged(*, log) -> None:
    """The lab's own munged: its key (random, munge's 0600), socket, pid and log in SLURM_STATE/munge."""
    directory = SLURM_STATE / "munge"
    _owned_dir(directory, user=MUNGE_USER, mode=0o711)  # o+x: every user's Slurm command reaches the socket
    key = directory / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
    munge = pwd.getpwnam(MUNGE_USER)
    os.chown(key, munge.pw_uid, munge.pw_gid)
    os.chmod(key, 0o600)
    if running_pid(directory / "munged.pid"):
        return
    run_command("munged", f"--key-file={key}", f"--socket={MUNGE_SOCKET}", f"--pid-file={directory / 'munged.pid'}",
        f"--log-file={directory / 'munged.log'}", f"--seed-file={directory / 'munged.seed'}", user=MUNGE_USER)
    log("started munged")


def _ensure_slurmctld(*, log, fresh: bool) -> None:
    """slurmctld, started if it is not running; `fresh` (a changed configuration): with none of the
    state the old one saved (-c: no jobs, no node drained under the old configuration)."""
    if running_pid(SLURM_STATE / "run" / "slurmctld.pid"):
        return
    run_command("slurmctld", "-f", str(SLURM_CONF), *(["-c"] if fresh else []))
    _wait_for(lambda: running_pid(SLURM_STATE / "run" / "slurmctld.pid") is not None, what="slurmctld start",
              log_file=SLURM_STATE / "log" / "slurmctld.log")
    log("started slurmctld")


def _ensure_slurmd(node: str, *, log) -> None:
    if running_pid(SLURM_STATE / "run" / f"slurmd-{node}.pid"):
        return
    _owned_dir(SLURM_STATE / "spool" / node, user="root", mode=0o755)
    run_command("slurmd", "-f", str(SLURM_CONF), "-N", node)
    _wait_for(lambda: running_pid(SLURM_STATE / "run" / f"slurmd-{node}.pid") is not None, what=f"slurmd -N {node} start",
              log_file=SLURM_STATE / "log" / f"slurmd-{node}.log")
    log(f"started slurmd for {node}")


def _wait_for(done, *, what: str, log_file: Path) -> None:
    """Until `done()`, READY_TIMEOUT_S at most; then UsageError naming `what` and the log to read."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise UsageError(f"lab Slurm: no {what} within {READY_TIMEOUT_S} s; see {log_file}")
        time.sleep(0.2)


def _node_states() -> dict:
    found = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True)
    return dict(line.split() for line in found.stdout.splitlines() if len(line.split()) == 2)


def _wait_idle() -> None:
    """Every node registered and idle (or already running jobs)."""
    def ready() -> bool:
        states = _node_states()
        return all(states.get(node, "").rstrip("*~#") in ("idle", "mixed", "allocated") for node in NODES)

    _wait_for(ready, what="idle nodes", log_file=SLURM_STATE / "log")


def _cancel_jobs(*, log) -> None:
    """Every job of the cluster cancelled and gone from the queue, so that no job step outlives its slurmd."""
    if not running_pid(SLURM_STATE / "run" / "slurmctld.pid"):
        return
    queued = _queued()
    if not queued:
        return
    run_command("scancel", *queued)
    _wait_for(lambda: not _queued(), what="end of the cancelled jobs", log_file=SLURM_STATE / "log" / "slurmctld.log")
    log(f"cancelled {len(queued)} job(s)")


def _queued() -> list[str]:
    """The ids of every job in the queue, any user's."""
    return subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True).stdout.split()


def _stop_daemons(*, log) -> None:
    """The slurmd of every node, then slurmctld; each waited for, so that a restart finds its port free."""
    for node in NODES:
        stop_pid(SLURM_STATE / "run" / f"slurmd-{node}.pid", what=f"slurmd -N {node}", log=log)
    stop_pid(SLURM_STATE / "run" / "slurmctld.pid", what="slurmctld", log=log)
