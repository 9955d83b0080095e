"""What a workload and a node role build an attempt of the supervisor's loop with (stdlib only): the loop
is run/supervisor_loop.py; the workloads are run/in_process.py and run/server/workload.py, the node roles
run/server/node_roles.py.

An attempt's first process that cannot be started raises NotStarted; a node role's look at the other
nodes raises AttemptEnds; a failure the supervisor finds itself (no log decides it) is found_failure's,
shaped as the classifier's. A workload's watch keeps its progress clock in a Watch, which names a
stall, and reads the attempt's log from where the attempt began (log_since).
"""
import os
import time

from contract import RUNNING, STALLED
from run import classify

#: Seconds between the polls of an attempt's watch.
POLL_S = 0.5
#: Seconds between rewrites of status.json while nothing changes.
STATUS_EVERY_S = 2.0
LOG_TAIL_BYTES = 256 * 1024
#: An attempt's outcome that is no run state: the loop starts the next attempt after the backoff.
RETRY = "retry"


class NotStarted(Exception):
    """The first process of an attempt could not be started (`argv`, the OSError)."""

    def __init__(self, argv, error):
        super().__init__(error)
        self.argv, self.error = argv, error


class AttemptEnds(Exception):
    """Raised from a node role's look at the other nodes, inside a workload's watch: the attempt ends
    with `failure` (a node lost), or with none (a worker: the head's attempt it served is over)."""

    def __init__(self, failure=None):
        super().__init__(failure and failure["explain"])
        self.failure = failure


def found_failure(kind, explain, advice, retryable, **fields):
    """A failure the supervisor found itself (no log decides it), shaped as classify.classify's."""
    found = {"kind": kind, "rule": None, "retryable": retryable, "exit_status": None, "signal": None,
             "callee": None, "caller": None, "evidence": None, "explain": explain, "advice": advice}
    found.update(fields)
    found["signature"] = classify.signature(found)
    return found


def child_env(**extra):
    """A child's environment: the supervisor's own (run/launching.py put the job's variables there: hosts.yaml's
    `env:`, a node's VLLM_HOST_IP), unbuffered output so the log keeps up, and `extra`."""
    return dict(os.environ, PYTHONUNBUFFERED="1", **extra)


def log_since(path, offset):
    """The log's text from `offset` (this attempt's start), its last LOG_TAIL_BYTES at most."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return ""
    with open(path, "rb") as handle:
        handle.seek(max(offset, size - LOG_TAIL_BYTES))
        return handle.read().decode(errors="replace")


def log_size(path):
    return os.path.getsize(path) if os.path.exists(path) else 0


class Watch:
    """One watch's progress clock: progress is what the workload calls so (a new phase, sample, file or
    log line); no progress for the limit is a stall. It keeps status.json current meanwhile."""

    def __init__(self, supervisor, log_path, log_offset):
        self.supervisor = supervisor
        self.log_path, self.log_offset = log_path, log_offset
        self.last_progress = time.monotonic()
        self.last_saved = 0.0

    def progress(self):
        self.last_progress = time.monotonic()

    def check(self, limit, phase, heartbeat):
        """The stall failure once nothing progressed for `limit` seconds (classified from the watched log:
        a known cause that will not go away is not retryable), else None."""
        sup = self.supervisor
        now = time.monotonic()
        quiet = now - self.last_progress
        stalled = quiet > limit
        if stalled and not sup.status["stalled"]:
            sup.log_marker("no progress for %.0f s (%s): stalled" % (quiet, phase))
        if stalled != sup.status["stalled"] or now - self.last_saved >= STATUS_EVERY_S:
            # status.json may sit on a network disk: rewritten on a change or every few seconds.
            self.last_saved = now
            sup.save(state=STALLED if stalled else RUNNING, stalled=stalled, heartbeat=heartbeat,
                     seconds_since_progress=round(quiet, 1))
        return self.stall_failure(quiet) if stalled else None

    def stall_failure(self, quiet):
        known = classify.classify(log_since(self.log_path, self.log_offset), 0, host=self.supervisor.host())
        if not known["retryable"]:
            known["explain"] += " (no progress for %.0f s)" % quiet
            return known
        return found_failure("stalled", "no new phase, sample or output file for %.0f s" % quiet,
                             "see `inv logs`; raise stall_timeout_s (or load_timeout_s while loading) in hosts.yaml's "
                             "extract: if the driver is merely slow", True)
