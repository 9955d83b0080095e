"""The supervisor's loop over one run's attempts, around a workload and a node role (stdlib only);
run/supervisor.py is its program and picks the two, run/attempt.py holds what a workload and a node
role build an attempt with (its exceptions, its watch).

The loop, for every attempt: start the workload and watch it (progress, stalls, the GPUs, a stop),
end whatever is left of its processes and wait for the GPUs to give their memory back, classify a
failure (classify.py), decide (below), back off, and at the end write the run's outcome.

- The **workload** is what an attempt runs: the in-process driver (run/in_process.py) or the vLLM
  server with speculators' client steps, or a worker's headless server (run/server/workload.py).
  Each is an object made with the supervisor, with:

      STARTS, FINISHED         the log marker's words for an attempt starting, and ending well
      SAMPLE_FILE              the output's sample files (a regex), or None: no samples of its own
      status_fields(previous)  the keys it adds to status.json (`previous`: the status before a resume)
      prepare(entry)           before the processes start (server mode checks the output's files)
      run(entry)               start the attempt's processes and watch them until they end, fail, stall
                               or a stop comes: (exit status or None, failure found or None); raises
                               NotStarted when its first process cannot be started
      end()                    end what is left of its processes (Supervisor.end_job); the attempt's
                               cleanup record
      attempt_log()            this attempt's log text, classified when it failed with nothing found
      finish(outcome)          its last words (files, the heartbeat's last phase); the outcome to record
      disk_use()               what it writes, for the free-space watch (disk_watch.py): {"directories",
                               "file_bytes" (a file's size guessed, or None), "in_flight" (files that may
                               be written at once), "remaining" (a function: the files left to write, or
                               None)}, or None: it writes no files of its own
      ran_low()                an attempt ended on a low disk, its processes ended: remove what they left
                               half-written (only a workload with a disk_use() is asked)

- The **node role** is what a node of a multi-node job adds (run/server/node_roles.py: the head, a
  worker); NodeRole below names where a role takes part, and as it is stands for a run on one host.

Before the first attempt, the directories the workload writes must be writable and have room for its
next files (disk_watch.py), and the room is looked at again at every poll of an attempt's watch: a run
that cannot have them fails as OUTPUT_UNWRITABLE or DISK_LOW before its first record says it started,
and one that runs low ends its attempt and fails as DISK_LOW, its whole files kept.

The decision: a stop ends the run; a success ends it; a failure is restarted after a backoff
(backoff_s doubled per restart, at most backoff_max_s) if it is retryable and restarts are left,
unless the attempt wrote no sample and failed exactly as this supervisor's previous attempt did
(same signature): a failure that repeats without progress would repeat again, and every attempt
loads the model anew. No new phase, sample or output file for `stall_timeout_s` (`load_timeout_s`
while loading) marks the run stalled, and ends the attempt when `stall_restart` is set or the stall
has a cause that will not go away. SIGTERM (inv stop) ends the attempt's processes: SIGTERM, grace,
SIGKILL. So does USR1, a Slurm job's warning before its time limit; the run then stops, for the job to
be requeued, only when this supervisor's attempts wrote samples, and fails otherwise (slurm/time_limit.py). This shape follows SkyPilot's managed-job controller (one loop that watches and decides)
and its StrategyExecutor (what to launch and recover, held by the loop).
"""
import errno
import os
import signal
import threading
import time

from base import atomic, rundir, telemetry
from base.contract import (
    DISK_LOW,
    FAILED,
    GPU_RELEASE_S,
    OUTPUT_UNWRITABLE,
    RESTARTING,
    RUNNING,
    STARTING,
    STOPPED,
    SUCCEEDED,
    SUPERVISOR_BEAT_S,
)
from dataset import verify as dataset_verify
from run import classify, disk_watch
from run.attempt import POLL_S, RETRY, AttemptEnds, NotStarted, found_failure
from slurm import time_limit


class NodeRole:
    """Where a node of a multi-node job takes part in the loop: each method is one point of it, and the
    roles (run/server/node_roles.py: Head, Worker) redefine those they need. As it is, the role of a run
    on one host: nothing to tell, nobody to watch; None leaves the loop its own way."""

    def open(self):
        """Before the first attempt: the run's outcome when the role cannot be taken, else None."""
        return None

    def saved(self):
        """status.json was written: what the other nodes read of it."""

    def next_attempt(self):
        """Before each attempt: the run's outcome when there is to be none, else None."""
        return None

    def begin_attempt(self, entry):
        """The attempt's record is made: the role's fields in it; the start marker's last words."""
        return ""

    def look(self):
        """During the watch, every poll: raises AttemptEnds when another node ends the attempt."""

    def attempt_ended(self, entry, found):
        """The attempt's processes stopped or failed, before they are ended (others learn it at once)."""

    def judge(self, entry, exit_status, found):
        """The attempt's outcome when the role decides it, else None: the retry policy decides."""
        return None

    def back_off(self):
        """Whether to go on after a retry when the role decides it, else None: the backoff decides."""
        return None

    def close(self, outcome):
        """The run's outcome is written."""



class Supervisor:
    """One run's attempts, watched and decided; `workload(self)` and `role(self)` make the two parts."""

    def __init__(self, run, workload, role=None):
        self.run = run
        self.record = run.record
        self.options = self.record["options"]
        self.workload = workload(self)
        self.role = role(self) if role else NodeRole()
        previous = run.status
        self.status = {
            "run_id": run.run_id,
            "state": STARTING,
            "supervisor_pid": os.getpid(),
            "supervisor_started_at": rundir.now_iso(),
            # Attempts and failures survive a resume (a new supervisor on the same run).
            "attempts": previous.get("attempts", []),
            "history": previous.get("history", []),
            "restarts": 0,
            "stalled": False,
            "driver_pid": None,
            "driver_pgid": None,
            "last_failure": previous.get("last_failure"),
            "gpus": None,
            "gpu_apps": [],
        }
        self.status.update(self.workload.status_fields(previous))
        for attempt in self.status["attempts"]:
            if attempt["ended_at"] is None:
                # Its supervisor died before it could record the end (the run was `lost`).
                attempt.update(ended_at=rundir.now_iso(), lost=True)
        use = self.workload.disk_use()
        self.disk = use and disk_watch.DiskWatch(out=os.path.expanduser(self.record["out"]),
                                                 sample_file=self.workload.SAMPLE_FILE, **use)
        self.stop_signal = None
        #: When this supervisor started, and its first attempt's index in status.json's attempts: what this
        #: supervisor (a Slurm job's) did, when its time limit comes.
        self.started_at, self.first_attempt = time.time(), len(self.status["attempts"])
        self.signalled_at = None
        self.last_telemetry = 0.0
        #: This supervisor's previous attempt's failure: a failure repeated without progress ends the run.
        self.previous_failure = None

    # -- what it writes -------------------------------------------------------------------------

    def save(self, **changes):
        self.status.update(changes, updated_at=rundir.now_iso())
        atomic.write_json(self.run.file("status.json"), self.status)
        self.role.saved()

    def log_marker(self, text):
        with open(self.run.file("driver.log"), "ab") as log:
            log.write(("\n[specrig-supervisor %s] %s\n" % (rundir.now_iso(), text)).encode())

    def started(self, **fields):
        """The attempt's first process runs: the run is RUNNING, no longer stalled or waiting to restart."""
        self.save(state=RUNNING, stalled=False, restart_at=None, gpu_apps=[], **fields)

    def host(self):
        return self.record.get("host") or "the host"

    # -- signals --------------------------------------------------------------------------------

    def on_signal(self, signum, frame):
        self.stop_signal = signal.Signals(signum).name
        self.signalled_at = time.time()

    def stop_requested(self):
        return self.stop_signal is not None or self.run.stop_requested()

    # -- the loop -------------------------------------------------------------------------------

    def main(self):
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        # A Slurm job's warning before its time limit (`--signal=B:USR1@<s>`, slurm/jobs.py): stop cleanly
        # while there is time, rather than die of Python's default for USR1 with the attempt still running.
        signal.signal(signal.SIGUSR1, self.on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the SSH session going away is no reason to stop
        # Liveness apart from the loop, which may block for long (a job's grace, the GPUs' release): silent, this
        # supervisor hangs (or is stopped), and status says so (rundir.supervisor_unanswering).
        threading.Thread(target=self.beat, name="supervisor-beat", daemon=True).start()
        # Before the first record: the launch (or resume) that waits for it then sees the run failed, and
        # says so in one line (run/launching.py).
        outcome = self.refused()
        if outcome is None:
            self.save()
            outcome = self.at_time_limit(self.role.open() or self.attempts())
        return self.conclude(outcome)

    def beat(self):
        path = self.run.file(rundir.SUPERVISOR_BEAT)
        while True:
            try:
                with open(path, "a"):
                    os.utime(path)
            except OSError:
                pass  # a disk that refuses even this is the disk watch's to name
            time.sleep(SUPERVISOR_BEAT_S)

    def at_time_limit(self, outcome):
        """The outcome, or, when a Slurm job's time limit (USR1) stopped the run before this supervisor's
        attempts wrote a sample, the run failed as TIME_LIMIT_TOO_SHORT: requeued, the job would do the same
        again (slurm/time_limit.py). The job's shell requeues a run that stopped, not one that failed."""
        if outcome["state"] != STOPPED or self.stop_signal != "SIGUSR1" or self.workload.SAMPLE_FILE is None:
            return outcome
        found = time_limit.too_short(self.status["attempts"][self.first_attempt:],
                                     settings=(self.record.get("slurm") or {}).get("settings") or {},
                                     ran_s=self.signalled_at - self.started_at, phase=self.phase_now())
        if found is None:
            return outcome
        failure = found_failure(found["kind"], found["explain"], found["advice"], False)
        self.log_marker("%s; not requeued" % failure["explain"])
        self.save(last_failure=failure)
        return {"state": FAILED, "failure": failure}

    def phase_now(self):
        """The workload's phase in its heartbeat, when written since this supervisor started; else None."""
        try:
            fresh = os.path.getmtime(self.run.file("heartbeat.json")) >= self.started_at
        except OSError:
            return None
        return (self.run.heartbeat or {}).get("phase") if fresh else None

    def refused(self):
        """The run's failed outcome when a directory the workload writes cannot be made or written, or
        has no room for its next files; else None."""
        if self.disk is None:
            return None
        for path in self.disk.directories:
            try:
                os.makedirs(path, exist_ok=True)
                if not os.access(path, os.W_OK):
                    raise PermissionError(errno.EACCES, "not writable by this user", path)
            except OSError as exc:
                failure = found_failure(
                    OUTPUT_UNWRITABLE, "cannot write %r: %s" % (path, exc),
                    "choose an --out (and extract.staging) that the host's user can write, or make it writable; "
                    "then `inv resume`", False, evidence="%s: %s" % (type(exc).__name__, exc), path=path)
                break
        else:
            failure = self.disk_low()
        if failure is None:
            return None
        self.log_marker("%s; not starting" % failure["explain"])
        self.status["last_failure"] = failure
        return {"state": FAILED, "failure": failure}

    def disk_low(self):
        """The DISK_LOW failure when a directory the workload writes has less room than its next files
        need, else None."""
        low = self.disk.low() if self.disk is not None else None
        if low is None:
            return None
        return found_failure(DISK_LOW, low["line"], disk_watch.ADVICE, False, path=low["path"],
                             free_bytes=low["free"], need_bytes=low["need"])

    def attempts(self):
        """Attempt, decide, back off, until an outcome that is no retry."""
        while True:
            outcome = self.role.next_attempt() or self.attempt()
            if outcome["state"] != RETRY:
                return outcome
            if not self.back_off():
                return {"state": STOPPED, "failure": self.status["last_failure"]}

    def back_off(self):
        """Sleep before a restart; False when a stop came meanwhile."""
        decided = self.role.back_off()
        if decided is not None:
            return decided
        restarts = self.status["restarts"]
        delay = min(self.options["backoff_s"] * (2 ** restarts), self.options["backoff_max_s"])
        self.save(state=RESTARTING, restart_at=time.time() + delay)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            if self.stop_requested():
                return False
            time.sleep(POLL_S)
        self.save(restarts=restarts + 1)
        return True

    def attempt(self):
        """One attempt: run the workload, end what is left of it, decide; the outcome."""
        number = len(self.status["attempts"]) + 1
        entry = {"attempt": number, "started_at": rundir.now_iso(), "pid": None, "ended_at": None,
                 "exit_status": None, "failure": None}
        note = self.role.begin_attempt(entry)
        self.log_marker("attempt %d: %s%s" % (number, self.workload.STARTS, note))
        self.status["attempts"].append(entry)
        self.last_telemetry = 0.0  # the previous attempt's GPU processes are not this one's
        self.workload.prepare(entry)
        samples_before = self.sample_files()
        try:
            exit_status, found = self.workload.run(entry)
        except NotStarted as refused:
            self.role.attempt_ended(entry, None)
            return self.not_started(entry, refused)
        except AttemptEnds as ended:
            exit_status, found = None, ended.failure
        self.status["pace"] = None  # the attempt's samples stopped with it: no pace to show until the next
        self.role.attempt_ended(entry, found)
        # A workload may name the exit status itself once its processes are ended (a worker's server).
        entry.update(dict({"exit_status": exit_status}, **self.workload.end()), ended_at=rundir.now_iso())
        if self.workload.SAMPLE_FILE is not None:
            # New files and files rewritten in place alike: each sample is renamed into place, a new inode.
            entry["samples_written"] = len(self.sample_files().items() - samples_before.items())
        decided = self.role.judge(entry, exit_status, found)
        return decided if decided is not None else self.judge(entry, exit_status, found)

    def judge(self, entry, exit_status, found):
        """The outcome of an ended attempt ({"state": STOPPED|SUCCEEDED|RETRY|FAILED}): a stop, a
        success, or a failure judged by the restart policy. The failure is `found` when the supervisor
        saw it itself (a stall, a dead server, bad outputs), else classified from the attempt's log."""
        number = entry["attempt"]
        if self.stop_signal or (self.run.stop_requested() and exit_status != 0):
            entry["stopped"] = True
            self.log_marker("attempt %d: stopped (%s)" % (number, self.stop_signal or "stop requested"))
            return {"state": STOPPED, "ended": {key: entry[key] for key in ("orphans_ended", "left_behind",
                                                                            "gpu_memory")}}
        if exit_status == 0 and found is None:
            self.log_marker("attempt %d: %s" % (number, self.workload.FINISHED))
            return {"state": SUCCEEDED}
        failure = found or classify.classify(self.workload.attempt_log(), exit_status, host=self.host())
        if failure["kind"] != DISK_LOW:
            # A write the watch did not see coming failed for want of space (the connector's "No space
            # left on device" in the server's log, the driver's disk-full), or the attempt failed otherwise
            # on a disk now low: a restart would meet the same disk.
            low = self.disk_low()
            if low is not None:
                low["evidence"] = "%s: %s" % (failure["kind"], failure["evidence"] or failure["explain"])
                low["signature"] = classify.signature(low)
                failure = low
        failure["attempt"] = number
        entry["failure"] = failure
        if failure["kind"] == DISK_LOW:
            self.workload.ran_low()
        previous, self.previous_failure = self.previous_failure, failure
        # Progress kept between the two: new samples, or a training's new checkpoint.
        progressed = entry.get("samples_written") or entry.get("checkpoints_written")
        kept = "checkpoint" if "checkpoints_written" in entry else "sample"
        repeated = (failure["retryable"] and previous is not None and not progressed
                    and previous["signature"] == failure["signature"])
        if repeated:
            failure.update(retryable=False, repeats_attempt=previous["attempt"])
            failure["explain"] += "; the same failure as attempt %d, with no new %s since" % (previous["attempt"], kept)
            failure["advice"] += "; a restart would fail the same way, so there was none: `inv resume` once the " \
                                 "cause is fixed"
        retry = failure["retryable"] and self.status["restarts"] < self.options["max_restarts"]
        failure["restarted"] = retry
        verdict = ("the same failure twice with no new %s: not restarting" % kept if repeated
                   else "restarting" if retry else "not restarting")
        self.log_marker("attempt %d: %s (%s); %s" % (number, failure["kind"], failure["explain"], verdict))
        self.save(last_failure=failure, driver_pid=None)
        return {"state": RETRY} if retry else {"state": FAILED, "failure": failure}

    def not_started(self, entry, refused):
        """The attempt whose first process could not be started: the run fails, naming the program."""
        argv, exc = refused.argv, refused.error
        failure = {"kind": "driver-not-started", "rule": None, "retryable": False, "exit_status": None,
                   "signal": None, "callee": None, "caller": None, "evidence": "%s: %s" % (type(exc).__name__, exc),
                   "attempt": entry["attempt"],
                   "explain": "%s could not be started: %s" % (os.path.basename(argv[1]), exc),
                   "advice": "check `python` (and `server_python`) of the host in hosts.yaml (`inv doctor`); %s"
                             % " ".join(argv[:2])}
        entry.update(ended_at=rundir.now_iso(), exit_status=None, failure=failure)
        self.log_marker("attempt %d: %s; not restarting" % (entry["attempt"], failure["explain"]))
        self.save(last_failure=failure)
        return {"state": FAILED, "failure": failure}

    def conclude(self, outcome):
        """The run's outcome, after the workload's last words: history, status.json, exit.json."""
        outcome = self.workload.finish(outcome)
        record = dict(outcome, state=outcome["state"], ended_at=rundir.now_iso(),
                      attempts=len(self.status["attempts"]), restarts=self.status["restarts"])
        # The run's end says whether its output is trainable as the host's trainer reads it (issue 28).
        dataset = dataset_verify.at_run_end(self.run) if outcome["state"] == SUCCEEDED else None
        if dataset is not None:
            record["dataset"] = dataset
        self.status["history"].append(record)
        self.save(state=outcome["state"], driver_pid=None, stalled=False)
        atomic.write_json(self.run.file("exit.json"), record)
        self.role.close(outcome)
        return 0

    # -- what every workload's watch needs -------------------------------------------------------

    def look(self, pids):
        """Every poll of a watch: the GPUs (marking the attempt's processes, `pids`), the free space (raises
        AttemptEnds with DISK_LOW before the next files could fill a disk), and the other nodes (the role
        raises AttemptEnds when they end the attempt)."""
        self.sample_gpus(pids)
        low = self.disk_low()
        if low is not None:
            self.log_marker("%s: ending the attempt, its whole files kept" % low["explain"])
            raise AttemptEnds(low)
        self.role.look()

    def sample_gpus(self, ours):
        """Per-GPU telemetry and the compute processes, marking those of the run (pids `ours`)."""
        if time.monotonic() - self.last_telemetry < self.options["telemetry_interval_s"]:
            return
        self.last_telemetry = time.monotonic()
        gpus = telemetry.gpus(timeout=10)
        apps = telemetry.compute_apps(timeout=10) if gpus["available"] else []
        for app in apps:
            app["this_run"] = app["pid"] in ours
        self.status.update(gpus=gpus, gpu_apps=apps)

    def end_job(self, proc, job):
        """End what is left of one job of the attempt (vLLM's workers outlive a killed parent), and wait
        for the GPUs to give their memory back, so that a restart does not meet its own leftovers."""
        pids = {m["pid"] for m in job.members()}
        before = telemetry.snapshot(timeout=10) if pids else {"gpus": {}, "apps": []}
        cleanup = job.terminate(self.options["grace_s"], reap=proc.poll)
        released = telemetry.wait_released(before, pids, GPU_RELEASE_S) if before["apps"] else None
        return {"orphans_ended": cleanup["pids"] or None,
                "left_behind": [m["pid"] for m in cleanup["left"]] or None,
                "gpu_memory": [g for g in released["gpus"] if g["held_by_run_mib"]] if released else None}

    def sample_files(self):
        """{name: inode} of the workload's sample files in the output directory ({} when there is none)."""
        if self.workload.SAMPLE_FILE is None:
            return {}
        try:
            with os.scandir(os.path.expanduser(self.record.get("out"))) as entries:
                return {entry.name: entry.inode() for entry in entries
                        if self.workload.SAMPLE_FILE.fullmatch(entry.name)}
        except (OSError, TypeError):
            return {}

