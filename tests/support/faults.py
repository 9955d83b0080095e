"""The fault matrix's pieces on the lab (tests/faults/cells.py has the cells): a run as the harness sees
it (its files, read directly: the lab host is this machine), its processes by role, the wait for a phase,
and the supervisor's reaction. tests/support/faults_inject.py has one injector per fault kind,
tests/support/faults_run.py strings them into runs.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from base import procs
from base.contract import FAILED, FINAL_STATES, LOST, RESTARTING, RUNNING, STARTING, STOPPED
from base.rundir import RunDir
from faults.cells import OUTCOMES, Cell
from support.lab import inv
from support.patchenv import as_lab_user
from support.runnable_env import HOME
from support.server_lab import run_files

#: How often a wait or a watch looks at the run's files.
POLL_S = 0.1
#: The heartbeat phases of each path that a cell's phase means.
HEARTBEAT_PHASES = {"loading": {"loading"}, "prepare-data": {"preparing"},
                    # With a render server prepare-data runs while the model loads.
                    "prepare-data-render": {"loading", "preparing"},
                    "generating": {"generating", "extracting"}, "last-files": {"validating", "writing", "done"}}
#: Heartbeat phases after which a run never comes back to the cell's phase: its prepared data is whole.
PAST = {"prepare-data": {"generating", "validating"}, "prepare-data-render": {"generating", "validating"}}
#: Samples written since the previous cell before a `generating` cell is injected: the run is flowing.
MORE_SAMPLES = 3
#: The sample file a cell of the `ended` phase damages (an index every lab run writes).
VICTIM = 3


class PhaseMissed(Exception):
    """The run went past the phase (ended, or not there within the wait) before the target could be hit."""


@dataclass
class LabRun:
    """One run of the harness: the host it runs on, its inventory, its output, and once launched its id."""
    host: str
    path: str
    inventory: Path
    workdir: Path
    out: Path
    port: int | None
    run_id: str | None = None
    #: The attached `inv extract` (the live view), when launched attached.
    attached: subprocess.Popen | None = None
    #: The fleet host number of a host of the harness's own, else None.
    own_host: int | None = None
    #: The dataset, when not the host's own (`extract.data`).
    data: Path | None = None
    #: Samples in the output when the previous cell was injected.
    samples_mark: int = 0
    notes: list[str] = field(default_factory=list)
    #: A multi-node job (tests/support/faults_nodes.py): each node's run directory, the head's first; run_id is
    #: then the job's id, which `inv stop`/`resume`/`status` take on `host` (a group, or the login node).
    node_dirs: list[Path] = field(default_factory=list)
    #: The command target of what looks at the output (verify-dataset, gather): (host, run id); the run's own
    #: by default, a job's head's.
    output_of: tuple[str, str] | None = None
    #: The Slurm job of a job on a Slurm cluster.
    slurm_job: str | None = None

    @property
    def dir(self) -> Path:
        """The run directory whose files say the run's state and progress (a job's head's)."""
        return self.node_dirs[0] if self.node_dirs else self.workdir / "runs" / self.run_id

    def dirs(self) -> list[Path]:
        """Every run directory of the run: a job's nodes', or the one."""
        return self.node_dirs or [self.dir]

    def files(self) -> dict:
        return run_files(self.dir)

    def state(self) -> str:
        """The state as `inv status` says it (a dead supervisor without an exit record is lost); a job's is its
        head's unless a node's run ended otherwise (the head may go on waiting for a node that is gone)."""
        states = [RunDir(str(directory)).state() for directory in self.dirs()]
        return next((worst for worst in (LOST, FAILED, STOPPED) if worst in states), states[0])

    def output_target(self) -> tuple[str, str]:
        return self.output_of or (self.host, self.run_id)

    def inv(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return inv(*args, inventory=self.inventory, timeout=timeout)

    def samples(self) -> int:
        pattern = "data_*.pt" if self.path == "in-process" else "hs_*.safetensors"
        return len(list(self.out.glob(pattern)))


# ---- processes ---------------------------------------------------------------------------------------------

def descendants(root: int) -> list[int]:
    """`root`'s live descendants (/proc), nearest first."""
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found, pending = [], [root]
    while pending:
        for child in children.get(pending.pop(0), []):
            found.append(child)
            pending.append(child)
    return found


def ancestors(pid: int) -> set[int]:
    """`pid`'s live ancestors (/proc), up to init."""
    found = set()
    while pid > 1:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(text[text.rindex(")") + 2:].split()[1])
        found.add(pid)
    return found


def vllm_process(root: int | None, title: str) -> int | None:
    """vLLM's process titled `VLLM::<title>` below `root` (vllm/utils/system_utils.py set_process_title):
    the EngineCore below the API server; in process the Worker below the driver, which runs the engine."""
    if not root:
        return None
    return next((pid for pid in descendants(root) if f"VLLM::{title}" in procs.cmdline(pid)), None)


def target_pid(run: LabRun, target: str) -> int | None:
    """The live process of the run that `target` names, or None while there is none."""
    if target in NODE_TARGETS:
        pid = worker_target_pid(run, target)
        return pid if pid and procs.alive(pid) else None
    status = run.files()
    jobs = status.get("jobs") or {}
    pid = {"supervisor": status.get("supervisor_pid"), "driver": status.get("driver_pid"),
           "api-server": (jobs.get("server") or {}).get("pid"), "client": (jobs.get("client") or {}).get("pid"),
           "prepare": (jobs.get("prepare") or {}).get("pid"), "render": (jobs.get("render") or {}).get("pid"),
           }.get(target)
    if target in VLLM_TITLES:
        pid = vllm_process(status.get("driver_pid") or (jobs.get("server") or {}).get("pid"), VLLM_TITLES[target])
    return pid if pid and procs.alive(pid) else None


def worker_target_pid(run: LabRun, target: str) -> int | None:
    """The process on a multi-node job's worker node that `target` names: its vLLM server (headless), the
    EngineCore below it (the data-parallel rank of that node), or the supervisor that its Slurm step runs."""
    worker = run_files(run.node_dirs[1])
    server = ((worker.get("jobs") or {}).get("server") or {}).get("pid")
    return {"worker-server": server, "worker-engine": vllm_process(server, "EngineCore"),
            "slurm-step": worker.get("supervisor_pid")}[target]


def run_processes(run: LabRun, dirs: list[Path] | None = None) -> dict[int, str]:
    """{pid: command line} of every live process of the run (of `dirs` alone, when given: a job's nodes):
    whatever names its run directory (its supervisor, the programs of its code/), and every member of its
    sessions and jobs as status.json remembers them (procs.Job: vLLM's EngineCore renames itself, and may
    leave its parent's session)."""
    found = {}
    directories = run.dirs() if dirs is None else dirs
    for directory in directories:
        status = run_files(directory)
        ids = {status.get("supervisor_pid"), status.get("driver_pgid")}
        seen: dict = dict(status.get("job_seen") or {})
        for job in (status.get("jobs") or {}).values():
            ids.add(job.get("pgid"))
            seen.update(job.get("seen") or {})
        for job_id in filter(None, ids):
            for member in procs.Job(job_id, seen).members():
                found[member["pid"]] = member["cmdline"]
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        pid, _, args = line.strip().partition(" ")
        if any(directory.name in args for directory in directories) and int(pid) != os.getpid() \
                and "ps -eo" not in args:
            found[int(pid)] = args
    return found


def still_running(pids: dict[int, str], within_s: float = 30) -> dict[int, str]:
    """Those of `pids` still alive after up to `within_s` (a supervisor ends an attempt's processes with a grace)."""
    deadline = time.monotonic() + within_s
    while True:
        left = {pid: args for pid, args in pids.items() if procs.alive(pid)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


# ---- phases ------------------------------------------------------------------------------------------------

def wait_for_phase(run: LabRun, phase: str, target: str | None, timeout: float = 900) -> int | None:
    """Wait until the run is in `phase` with `target`'s process alive: its pid (None for a target that is no
    process). PhaseMissed when the run ended or went past the phase for good first, or `timeout` passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, state = run.files(), run.state()
        if phase == "ended":
            if state in FINAL_STATES:
                return None
        elif state in FINAL_STATES:
            raise PhaseMissed(f"the run ended {state} before phase {phase}")
        elif (status.get("heartbeat") or {}).get("phase") in PAST.get(phase, ()):
            raise PhaseMissed(f"the run went past phase {phase}: {status['heartbeat']['phase']}")
        elif in_phase(run, status, state, phase):
            pid = target_pid(run, target) if target in PROCESS_TARGETS else None
            if pid or target not in PROCESS_TARGETS:
                return pid
        time.sleep(POLL_S / 2)
    raise PhaseMissed(f"no phase {phase} with {target} within {timeout} s")


def in_phase(run: LabRun, status: dict, state: str, phase: str) -> bool:
    if phase == "backoff":
        return state == RESTARTING
    beat = status.get("heartbeat") or {}
    if state != RUNNING or beat.get("phase") not in HEARTBEAT_PHASES[phase]:
        return False
    # In process the driver writes the heartbeat: a previous attempt's may still be there.
    if run.path == "in-process" and beat.get("pid") != status.get("driver_pid"):
        return False
    if phase == "generating":
        return run.samples() >= run.samples_mark + MORE_SAMPLES
    if phase.startswith("prepare-data"):  # let go after its warm start, and not done
        startup = beat.get("startup") or {}
        return "prepare_started" in startup and "prepare_ended" not in startup
    return True


#: Targets that are vLLM's own processes, by their titles.
VLLM_TITLES = {"engine-core": "EngineCore", "worker": "Worker"}
#: Targets on a multi-node job's worker node (worker_target_pid); `slurm-step` is killed through Slurm.
NODE_TARGETS = {"worker-server", "worker-engine", "slurm-step"}
PROCESS_TARGETS = {"supervisor", "driver", "api-server", "client", "prepare", "render", *VLLM_TITLES,
                   *NODE_TARGETS}


# ---- reactions ---------------------------------------------------------------------------------------------

@dataclass
class Reaction:
    seconds: float
    what: str
    #: A laptop command's exit status, when the reaction is its answer.
    exit_status: int | None = None


def snapshot(run: LabRun) -> dict:
    status = run.files()
    return {"state": run.state(), "failures": failures_of(run), "by_node": node_failures(run),
            "attempts": len(status.get("attempts") or []), "log": log_size(run)}


def failures(status: dict) -> int:
    return sum(1 for attempt in status.get("attempts") or [] if attempt.get("failure")) + bool(
        status.get("last_failure") and not (status.get("attempts") or []))


def node_failures(run: LabRun) -> list[int]:
    """The failures each run directory of the run records (a job's worker records its own)."""
    return [failures(run_files(directory)) for directory in run.dirs()]


def failures_of(run: LabRun) -> int:
    return sum(node_failures(run))


def newest_failure(run: LabRun, before: dict) -> dict:
    """The failure recorded since `before` (snapshot): the head's, else the first node's that recorded one;
    the head's last one when none did."""
    for directory, count, was in zip(run.dirs(), node_failures(run), before["by_node"], strict=True):
        if count > was:
            return run_files(directory).get("last_failure") or {}
    return run.files().get("last_failure") or {}


def log_size(run: LabRun) -> int:
    try:
        return (run.dir / "driver.log").stat().st_size
    except OSError:
        return 0


#: The supervisor's markers of a run going as it should (an attempt's start and end, a step let go, the server
#: ready, the files checked): no reaction to a fault.
ROUTINE = re.compile(r"attempt \d+: (checking the outputs|starting the driver|the extraction finished|the driver "
                     r"finished)|the vLLM server is ready|^(prepare-data|generate-offline-data): |^every file of ")


def supervisor_reaction(run: LabRun, before: dict, at: float, watch_s: float) -> Reaction | None:
    """The supervisor's first reaction after a fault at `at` (time.time()): a failure recorded, a state other
    than the one before (stalled, restarting, failed, lost: `inv status`'s; not the next attempt's start), or
    a marker in driver.log that is no routine one (a step started again within the attempt); None when
    nothing within `watch_s`."""
    while time.time() - at < watch_s:
        state = run.state()
        markers = markers_since(run, before["log"])
        unusual = [marker for marker in markers if not ROUTINE.search(marker)]
        if failures_of(run) > before["failures"] or state not in (before["state"], STARTING, RUNNING) or unusual:
            return Reaction(round(time.time() - at, 1), f"{state}: {(unusual or markers or [''])[-1]}".strip())
        time.sleep(POLL_S)
    return None


def markers_since(run: LabRun, offset: int) -> list[str]:
    """The `[specrig-supervisor …]` lines of driver.log written since `offset`, without their stamps."""
    try:
        with open(run.dir / "driver.log", "rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
    except OSError:
        return []
    return [line.split("] ", 1)[-1] for line in text.splitlines() if line.startswith("[specrig-supervisor ")]


def command_reaction(argv: tuple[str, ...], run: LabRun, at: float) -> Reaction:
    """A laptop command's answer as the reaction: its exit status and what it said, on one line (a table's
    rows from `bad row(s)` on, where it has one: verify-dataset's; gather's hosts not ok and its verdict)."""
    done = inv(*argv, inventory=run.inventory, timeout=300, env={"COLUMNS": "400"})
    return Reaction(round(time.time() - at, 1), f"exit {done.returncode}: {said_in_a_line(done.stdout + done.stderr)}",
                    done.returncode)


def said_in_a_line(text: str) -> str:
    """What a laptop command said, in a line of 300 characters at most: from a rows table's `bad row(s)` on
    (verify-dataset's); of gather's table the hosts that are not ok, then its verdict; else all of it."""
    if re.search(r"^gather \S+: \d+ hosts", text, re.MULTILINE):
        text = "\n".join(line.replace("│", " ") for line in text.splitlines()
                         if re.search(r"could not run|\(\d\)|^\s*(in)?complete:|^error:", line))
    said = " ".join(text.split())
    return (said[said.find("bad row(s)") - 2:] if "bad row(s)" in said else said)[:300]


def result(cell: Cell, outcome: str, symptom: str, reaction: Reaction | None = None, **more) -> dict:
    """A cell's result: its outcome (cells.OUTCOMES), the symptom in one line, the reaction and its seconds."""
    assert outcome in OUTCOMES, outcome
    return {"cell": cell.id, "outcome": outcome, "symptom": " ".join(symptom.split())[:400],
            "detection_s": reaction.seconds if reaction else None, "reaction": reaction.what if reaction else None,
            **more}


# ---- what the runs need ------------------------------------------------------------------------------------

@contextlib.contextmanager
def tmpfs_output(mib: int):
    """A tmpfs of `mib` MiB the lab user owns, under its work directory; unmounted afterwards."""
    mount = HOME / "specrig-work" / "out" / f"faults-{uuid.uuid4().hex[:8]}"
    as_lab_user("mkdir", "-p", str(mount))
    owner = subprocess.run(["id", "-u", "specrig"], capture_output=True, text=True).stdout.strip()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,uid={owner},mode=700", "tmpfs", str(mount)],
                   check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        mount.rmdir()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def json_line(text: str) -> dict:
    """The last JSON object a command printed."""
    return json.loads(text.strip().splitlines()[-1]) if text.strip() else {}
