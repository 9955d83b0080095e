"""The supervisor program: `python supervisor.py <run-dir>` (stdlib only).

Started detached by runs.launch (run/launching.py: its own session, stdio to files, stdin from /dev/null), so it
outlives the SSH connection that started it. It is one loop (run/supervisor_loop.py) around the workload
the run's record names, with the node role of a multi-node job:

    run.json                  workload                                   node role
    -                         the in-process driver (run/in_process.py)  -
    "server"                  the vLLM server and speculators' client    -
                              steps (run/server/workload.py)
    "nodes", node_rank 0      the same                                   the head (run/server/node_roles.py)
    "nodes", node_rank > 0    a headless vLLM server (the same file)     a worker (the same file)
    kind "train"              speculators' trainer (run/training/)        -
    kind "accept"             vLLM serving the target with drafts          -
                              (run/acceptance/)
"""
import os
import sys

# Started by path, so sys.path[0] is remote/run/: make it remote/, where the shared modules and
# the stage packages are, exactly as for a call through entry.py.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from base import rundir
from base.contract import KIND_ACCEPT, KIND_TRAIN, run_kind
from run.in_process import InProcessDriver
from run.server.headless import HeadlessServer
from run.server.node_roles import Head, Worker
from run.server.workload import ServerExtraction
from run.supervisor_loop import Supervisor


def main(argv):
    if len(argv) != 1:
        sys.stderr.write("usage: supervisor.py <run-dir>\n")
        return 2
    run = rundir.RunDir(os.path.abspath(argv[0]))
    return Supervisor(run, *parts(run.record)).main()


def parts(record):
    """(workload, node role or None) of the run whose record (run.json) this is."""
    kind = run_kind(record)
    # Imported by the kind that needs them: an extraction's supervisor does not read the trainer's parts.
    if kind == KIND_TRAIN:
        from run.training.workload import Trainer
        return Trainer, None
    if kind == KIND_ACCEPT:
        from run.acceptance.workload import Acceptance
        return Acceptance, None
    if record.get("nodes"):
        return (ServerExtraction, Head) if record["nodes"]["node_rank"] == 0 else (HeadlessServer, Worker)
    if record.get("server"):
        return ServerExtraction, None
    return InProcessDriver, None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
