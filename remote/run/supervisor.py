"""The supervisor program: `python supervisor.py <run-dir>` (stdlib only).

Started detached by runs.launch (its own session, stdio to files, stdin from /dev/null), so it
outlives the SSH connection that started it. The run's record says which extraction path it takes:
the in-process driver of speculators <= 0.4 (run/supervision.py) or a vLLM server and speculators'
CLI (run/server/supervision.py, speculators >= 0.8), or one node of a multi-node job
(run/server/node_supervision.py).
"""
import os
import sys

# Started by path, so sys.path[0] is remote/run/: make it remote/, where the shared modules and
# the stage packages are, exactly as for a call through entry.py.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from run import rundir  # noqa: E402


def main(argv):
    if len(argv) != 1:
        sys.stderr.write("usage: supervisor.py <run-dir>\n")
        return 2
    run = rundir.RunDir(os.path.abspath(argv[0]))
    if run.record.get("nodes"):
        from run.server.node_supervision import for_node as supervisor
    elif run.record.get("server"):
        from run.server.supervision import ServerSupervisor as supervisor
    else:
        from run.supervision import Supervisor as supervisor
    return supervisor(run).main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
