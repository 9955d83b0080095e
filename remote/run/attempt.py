"""What a workload and a node role build an attempt of the supervisor's loop with (stdlib only): the loop
is run/supervisor_loop.py; the workloads are run/in_process.py and run/server/workload.py, the node roles
run/server/node_roles.py.

An attempt's first process that cannot be started raises NotStarted; a node role's look at the other
nodes raises AttemptEnds; a failure the supervisor finds itself (no log decides it) is found_failure's,
shaped as the classifier's. A workload's watch keeps its progress clock in a Watch, which names a
stall, and reads the attempt's log from where the attempt began (log_since).
"""
import os
import subprocess
import time

from base import procs
from base.contract import RUNNING, STALLED
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


def start_job(supervisor, entry, argv, log_path, env):
    """An attempt's one program started as a job of its own: in a new session (its process group is the job),
    stdin from /dev/null, stdout and stderr appended to `log_path`, in the run's directory; the attempt's record
    and the run's status say its pid. (the process, its procs.Job); NotStarted when it cannot be started."""
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=supervisor.run.path, env=env, start_new_session=True)
    except OSError as exc:
        raise NotStarted(argv, exc) from None
    entry["pid"] = proc.pid
    job = procs.Job(proc.pid)
    supervisor.started(driver_pid=proc.pid, driver_pgid=proc.pid)
    return proc, job


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


#: The stall bound once samples flow (Pace.bound): at least STALL_FLOOR_S, and at least GAP_FACTOR times the
#: median and LONGEST_GAP_FACTOR times the longest quiet span between new samples seen so far in the phase,
#: within the run's stall_timeout_s. A hung collective or a stopped engine looks alive and busy: only the
#: samples' own pace tells it from a slow sample, and a run that wrote a file every 2 s for an hour has
#: not merely slowed down when none came for a minute.
STALL_FLOOR_S = 30.0
GAP_FACTOR = 10
LONGEST_GAP_FACTOR = 3
#: A process of the attempt found stopped (state T: SIGSTOP, Ctrl-Z, a debugger) this long is a stall at once,
#: in any phase, the model's load included: it does nothing until someone continues it.
STOPPED_S = 10.0
#: The attempt's processes together using under IDLE_CPU_S of CPU time in IDLE_S, while nothing progressed, is
#: a hang that shows no stopped state: a frozen cgroup (`docker pause`, `systemctl freeze`), a deadlock, a wait
#: on something outside the run. It is called in any phase, the model's load included, where the phase's own
#: bound may be an hour: a model loading, data being prepared and an engine at work each keep a core busy. A hang
#: that spins (an NCCL collective polling) uses CPU and is left to the phase's bound. Not in a multi-node job,
#: whose node may wait, idle, while a slower peer loads.
IDLE_S = 60.0
IDLE_CPU_S = 0.5


class Pace:
    """When a phase's samples came: the gap before each new one (the first excepted: it waited on the phase's
    start), so the stall bound follows the run's own pace. Arrival times are the files' own where the workload
    reads them (exact, however seldom it looks), else the time of the look that found them."""

    def __init__(self):
        self.phase_started = time.time()
        self.count = None
        self.last_sample_at = None
        self.spans = []

    def saw(self, done, times=None):
        """The samples done now, and the arrival times of those new since the last look where known; True when
        one is new. The first look only sets the count: what it finds came before the phase."""
        if self.count is None or done <= self.count:
            self.count = done  # the first look, or a count begun anew (a driver restarted in the phase)
            return False
        new = done - self.count
        times = sorted(times)[-new:] if times else [time.time()] * new
        previous = self.last_sample_at
        for at in times:
            if previous is not None:
                self.spans.append(max(0.0, at - previous))
            previous = at
        self.count, self.last_sample_at = done, max(previous, self.last_sample_at or 0.0)
        return True

    def median_span(self):
        spans = sorted(self.spans)
        return spans[len(spans) // 2] if spans else None

    def bound(self, ceiling, first_sample_s):
        """(seconds, why) of the stall bound now: `first_sample_s` until the phase's first new sample, then
        derived from the spans between samples; never above `ceiling` (stall_timeout_s)."""
        if self.last_sample_at is None:
            return min(ceiling, first_sample_s), "the first sample of the phase"
        median = self.median_span()
        if median is None:
            return min(ceiling, first_sample_s), "the second sample of the phase"
        derived = max(STALL_FLOOR_S, GAP_FACTOR * median, LONGEST_GAP_FACTOR * max(self.spans))
        return min(ceiling, derived), "%dx the median gap between samples (%.1f s), %dx the longest (%.1f s), " \
            "%.0f s at least" % (GAP_FACTOR, median, LONGEST_GAP_FACTOR, max(self.spans), STALL_FLOOR_S)

    def fields(self):
        """status.json's `pace`: the facts contract.pace_now reads when the run is looked at."""
        median = self.median_span()
        return {"last_sample_at": self.last_sample_at and round(self.last_sample_at, 3),
                "phase_started_at": round(self.phase_started, 3), "median_gap_s": median and round(median, 2)}


class Watch:
    """One watch's progress clock: progress is what the workload calls so (a new phase, sample, file or
    log line); no progress for the limit is a stall. A phase that makes samples (generating, extracting)
    counts them alone, through `samples()`: its limit then follows their pace (Pace.bound), and log lines
    are no progress (a client retrying a request the engine will never answer logs one each time). It keeps
    status.json current meanwhile. `processes` (a function: the attempt's live processes, procs.Job.members'
    shape) tells a hang before the bound: a process stopped (STOPPED_S), or all of them idle (IDLE_S); or, with
    `idle_jobs`, all of those jobs' processes idle: a step that does its work itself, beside a server whose vLLM
    workers spin on their queues while they wait."""

    def __init__(self, supervisor, log_path, log_offset, processes=None, idle_jobs=None, classify_log=None):
        self.supervisor = supervisor
        #: The attempt's log text -> its failure classified, as the workload classifies (default: the extraction's
        #: rules): a stall whose log names a cause that will not go away (out of memory, then hung) is that cause.
        self.classify_log = classify_log or (lambda text: classify.classify(text, 0, host=supervisor.host()))
        self.log_path, self.log_offset = log_path, log_offset
        self.processes = processes
        self.last_progress = time.monotonic()
        self.last_saved = 0.0
        self.phase = self.pace = None
        self.bound_why = None
        #: {pid: (when first seen stopped, the process)}, looked at every second at most.
        self.stopped_since, self.looked_at = {}, 0.0
        self.cpu = CpuUse() if processes is not None and not supervisor.record.get("nodes") else None
        self.idle_jobs = idle_jobs

    def progress(self):
        self.last_progress = time.monotonic()

    def enter(self, phase):
        """The workload's phase now: a new one is progress, and its samples' pace starts anew."""
        if phase != self.phase:
            self.phase, self.pace = phase, None
            self.progress()

    def samples(self, done, times=None):
        """The phase makes samples, `done` of them now (the new ones' arrival `times` where known): a new one is
        progress."""
        if self.pace is None:
            self.pace = Pace()
        if self.pace.saw(done, times):
            self.progress()

    def limit(self, ceiling, first_sample_s=None):
        """The stall bound in force: `ceiling` (the phase's timeout), or, in a phase that makes samples,
        the bound of their pace under it (`first_sample_s` before the first: default the ceiling)."""
        if self.pace is None:
            self.bound_why = None
            return ceiling
        seconds, self.bound_why = self.pace.bound(ceiling, ceiling if first_sample_s is None else first_sample_s)
        return seconds

    def check(self, limit, phase, heartbeat):
        """The stall failure once nothing progressed for `limit` seconds, or a process of the attempt has been
        stopped for STOPPED_S (classified from the watched log: a known cause that will not go away is not
        retryable), else None."""
        sup = self.supervisor
        now = time.monotonic()
        quiet = now - self.last_progress
        held = self.held(now)
        idle = self.cpu.idle(now, quiet) if self.cpu else None
        stalled = quiet > limit or bool(held) or idle is not None
        if stalled and not sup.status["stalled"]:
            sup.log_marker(("%s stopped for %.0f s or more (%s): stalled" % (held, STOPPED_S, phase)) if held else
                           "%s (%s): stalled" % (idle_text(idle, self.idle_jobs), phase) if idle is not None else
                           "no progress for %.0f s (%s; %s): stalled" % (quiet, phase, self.bound_text(limit)))
        if stalled != sup.status["stalled"] or now - self.last_saved >= STATUS_EVERY_S:
            # status.json may sit on a network disk: rewritten on a change or every few seconds.
            self.last_saved = now
            sup.save(state=STALLED if stalled else RUNNING, stalled=stalled, heartbeat=heartbeat,
                     seconds_since_progress=round(quiet, 1), stall_bound_s=round(limit, 1),
                     pace=self.pace.fields() if self.pace else None)
        return self.stall_failure(quiet, limit, held, idle) if stalled else None

    def stopped(self):
        """The stall failure once a process of the attempt has been stopped for STOPPED_S, else None: all that a
        node watches whose progress another judges (a multi-node job's worker: the head counts the samples)."""
        held = self.held(time.monotonic())
        if not held:
            return None
        self.supervisor.log_marker("%s stopped for %.0f s or more: stalled" % (held, STOPPED_S))
        return self.stall_failure(0.0, 0.0, held, None)

    def stall_failure(self, quiet, limit, held, idle):
        known = self.classify_log(log_since(self.log_path, self.log_offset))
        if not known["retryable"]:
            known["explain"] += " (no progress for %.0f s)" % quiet
            return known
        if held:
            return found_failure("stalled", "%s stopped for %.0f s or more: no progress while it is" % (held, STOPPED_S),
                                 "a process stopped by a signal (SIGSTOP, Ctrl-Z) or held by a debugger does nothing "
                                 "until it is continued (SIGCONT); find who stopped it", True, evidence=held)
        if idle is not None:
            return found_failure("stalled", idle_text(idle, self.idle_jobs) + ": hung without spinning",
                                 "a frozen cgroup (`docker pause`, `systemctl freeze`) does nothing until thawed; "
                                 "else a process waits on a lock, a peer or a network filesystem: `py-spy dump "
                                 "--pid N` on the run's processes (`inv logs` names them) shows where", True)
        return found_failure("stalled", "no new phase, sample or output file for %.0f s (%s)"
                             % (quiet, self.bound_text(limit)),
                             "see `inv logs` (a hung collective or engine looks alive); raise stall_timeout_s (or "
                             "load_timeout_s while loading) in hosts.yaml's extract: if the run is merely slow", True)

    def bound_text(self, limit):
        """The bound in force, in words: 'the bound: 30 s, 10x the median gap ...'."""
        return "the bound: %.0f s%s" % (limit, ", " + self.bound_why if self.bound_why else "")

    def held(self, now):
        """The attempt's processes stopped (state T) for STOPPED_S or more, named: '' when none."""
        if self.processes is None or now - self.looked_at < 1.0:
            return self.held_names(now)
        self.looked_at = now
        members = self.processes()
        if self.cpu:
            self.cpu.look(now, [m for m in members if self.idle_jobs is None or m.get("job") in self.idle_jobs])
        stopped = {m["pid"]: m for m in members if m["state"] in "Tt"}
        self.stopped_since = {pid: (self.stopped_since.get(pid, (now, None))[0], member)
                              for pid, member in stopped.items()}
        return self.held_names(now)

    def held_names(self, now):
        return ", ".join("%s (pid %d)" % (_name(member), pid) for pid, (since, member) in sorted(self.stopped_since.items())
                         if now - since >= STOPPED_S)


class CpuUse:
    """The CPU time the attempt's processes used, summed over the looks (a process new since the last look
    counts all it used; one gone since, nothing more), so that Watch can tell a hang that shows no stopped
    state: too little CPU in IDLE_S."""

    def __init__(self):
        self.used_by = {}
        self.used = 0.0
        #: (when, the sum until then) of the looks in the last IDLE_S and the one just before.
        self.marks = []

    def look(self, now, members):
        used_by = {m["pid"]: m["cpu_s"] for m in members}
        self.used += sum(max(0.0, cpu - self.used_by.get(pid, 0.0)) for pid, cpu in used_by.items())
        self.used_by = used_by
        self.marks.append((now, self.used))
        while len(self.marks) > 1 and self.marks[1][0] <= now - IDLE_S:
            self.marks.pop(0)

    def idle(self, now, quiet):
        """The CPU seconds the attempt used in the last IDLE_S, when under IDLE_CPU_S with nothing progressed
        that long and a process there to hang; else None."""
        if quiet < IDLE_S or not self.used_by or not self.marks or self.marks[0][0] > now - IDLE_S:
            return None
        used = self.used - self.marks[0][1]
        return used if used < IDLE_CPU_S else None


def idle_text(used, jobs=None):
    """The idle finding in words: whose processes (the jobs', else all of the run's) used how little."""
    whose = "the run's" if not jobs else "%s's" % ", ".join(sorted(jobs))
    return "%s processes used %.2f s of CPU in %.0f s, with no progress" % (whose, used, IDLE_S)


def _name(member):
    """A process in a line: its job's name where it has one (server, client, ...), and its program's, or the
    title it gave itself (vLLM's VLLM::EngineCore)."""
    words = member["cmdline"].split()
    program = os.path.basename(words[0]) if words else "?"
    if program.startswith("python") and len(words) > 1:  # the script or module it runs
        program = words[2] if words[1] == "-m" and len(words) > 2 else os.path.basename(words[1])
    job = member.get("job")
    return program if not job else job if "::" not in program else "%s: %s" % (job, program)
