"""A run's supervisor started, its directory made (base/rundir.py): detached on this host, in a new session
with stdio on files and stdin from /dev/null, so closing the SSH connection that launched it does not
reach it; on a Slurm login node submitted as a job instead (slurm/submission.py). Launches and resumes
(run/launching.py) end here (stdlib only).
"""
import os
import subprocess
import sys
import time

from base.contract import FAILED
from base.failure import RemoteFailure
from slurm import submission

#: How long the supervisor has to write its pid in status.json before the launch says it did not start.
SUPERVISOR_START_S = 15


def start(run):
    """Start the run's supervisor detached, from the run's code/ (rundir.copy_code): its pid. A run on a
    Slurm cluster is submitted as a job instead (its pid unknown here: None)."""
    if run.record.get("slurm"):
        submission.submit_run(run)
        return None
    with open(run.file("supervisor.log"), "ab") as log:
        proc = subprocess.Popen([sys.executable, os.path.join(run.file("code"), "run", "supervisor.py"), run.path],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=run.path, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + SUPERVISOR_START_S
    while time.monotonic() < deadline:
        status_now = run.status
        if status_now.get("supervisor_pid") == proc.pid:
            if status_now.get("state") == FAILED:
                # Refused before its first attempt (supervisor_loop.py `refused`: the output cannot be
                # written, or has no room): the run's record says why, and so does this call, in one line.
                failure = status_now["last_failure"]
                raise RemoteFailure("run-refused", "run %s: %s; %s" % (run.run_id, failure["explain"],
                                                                      failure["advice"]),
                                    run=run.run_id, failure=failure)
            return proc.pid
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with open(run.file("supervisor.log"), encoding="utf-8", errors="replace") as handle:
        output = handle.read()[-4000:]
    raise RemoteFailure("supervisor-failed", "the supervisor of run %s did not start (exit %s): %s"
                        % (run.run_id, proc.poll(), output.strip().splitlines()[-1:] or "no output"),
                        traceback=output)
