"""The supervisor of one in-process extraction run (stdlib only); run/supervisor.py is its program,
run/server/supervision.py extends it for server mode.

It runs the driver, `<python> <run>/code/run/extract_driver.py <run>/driver-args.json`, in a
session of its own, and:

- samples the driver's heartbeat and the GPUs into status.json every second or so;
- on a failed attempt, classifies the failure (classify.py), records it, and restarts
  with resume after a backoff if it is retryable and restarts are left, unless the attempt wrote
  no sample and failed exactly as the attempt before it did (same signature): a failure that
  repeats without progress would repeat again, and every attempt loads the model anew;
- marks the run stalled when no new phase, sample or output file came for
  `stall_timeout_s`, and restarts it if `stall_restart` is set;
- on SIGTERM (inv stop) ends the driver's whole session: SIGTERM, grace, SIGKILL.
"""
import os
import re
import signal
import subprocess
import time

import atomic
import procs
import telemetry
from run import classify, rundir

POLL_S = 0.5
#: Seconds between rewrites of status.json while nothing changes.
STATUS_EVERY_S = 2.0
#: Seconds between counts of the output directory (a cheap second sign of progress).
OUTPUT_COUNT_EVERY_S = 15
LOG_TAIL_BYTES = 256 * 1024
#: How long to wait for the GPUs to free the memory of an attempt's ended processes.
GPU_RELEASE_S = 30
class Supervisor:
    #: The driver's sample files (extract_driver.py: data_{i}.pt, each renamed into place when written).
    SAMPLE_FILE = re.compile(r"data_\d+\.pt")
    #: The log's word for an attempt that ended well.
    FINISHED = "the driver finished"

    def __init__(self, run):
        self.run = run
        record = run.record
        self.record = record
        self.options = record["options"]
        previous = run.status
        self.status = {
            "run_id": run.run_id,
            "state": "starting",
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
        for attempt in self.status["attempts"]:
            if attempt["ended_at"] is None:
                # Its supervisor died before it could record the end (the run was `lost`).
                attempt.update(ended_at=rundir.now_iso(), lost=True)
        self.stop_signal = None
        self.last_telemetry = 0.0
        #: This supervisor's previous attempt's failure: a failure repeated without progress ends the run.
        self.previous_failure = None

    # -- status ---------------------------------------------------------------------------------

    def save(self, **changes):
        self.status.update(changes, updated_at=rundir.now_iso())
        atomic.write_json(self.run.file("status.json"), self.status)

    def log_marker(self, text):
        with open(self.run.file("driver.log"), "ab") as log:
            log.write(("\n[specrig-supervisor %s] %s\n" % (rundir.now_iso(), text)).encode())

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

    # -- signals --------------------------------------------------------------------------------

    def on_signal(self, signum, frame):
        self.stop_signal = signal.Signals(signum).name

    def stop_requested(self):
        return self.stop_signal is not None or self.run.stop_requested()

    # -- the run --------------------------------------------------------------------------------

    def main(self):
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the SSH session going away is no reason to stop
        self.save()
        while True:
            outcome = self.attempt()
            if outcome["state"] != "retry":
                return self.finish(outcome)
            if not self.backoff():
                return self.finish({"state": "stopped", "failure": self.status["last_failure"]})

    def backoff(self):
        """Sleep before a restart; False when a stop came meanwhile."""
        restarts = self.status["restarts"]
        delay = min(self.options["backoff_s"] * (2 ** restarts), self.options["backoff_max_s"])
        self.save(state="restarting", restart_at=time.time() + delay)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            if self.stop_requested():
                return False
            time.sleep(POLL_S)
        self.save(restarts=restarts + 1)
        return True

    def attempt(self):
        number = len(self.status["attempts"]) + 1
        log_path = self.run.file("driver.log")
        self.log_marker("attempt %d: starting the driver" % number)
        log_offset = os.path.getsize(log_path)
        env = dict(os.environ)  # hosts.yaml `env:` included: the call that started this supervisor had it
        env["PYTHONUNBUFFERED"] = "1"
        program = self.record.get("driver_program") or self.run.file(os.path.join("code", "run", "extract_driver.py"))
        samples_before = self._sample_files()
        argv = [self.record["python"], program, self.run.file("driver-args.json")]
        try:
            with open(log_path, "ab") as log:
                driver = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          cwd=self.run.path, env=env, start_new_session=True)
        except OSError as exc:
            return self.not_started(number, argv, exc)
        entry = {"attempt": number, "started_at": rundir.now_iso(), "pid": driver.pid, "ended_at": None,
                 "exit_status": None, "failure": None}
        self.status["attempts"].append(entry)
        self.last_telemetry = 0.0  # the previous attempt's GPU processes are not this one's
        job = procs.Job(driver.pid)
        self.save(state="running", driver_pid=driver.pid, driver_pgid=driver.pid, stalled=False, restart_at=None,
                  gpu_apps=[])
        exit_status, stall = self.watch(driver, job, log_offset)
        entry.update(self.end_job(driver, job), ended_at=rundir.now_iso(), exit_status=exit_status)
        # New files and files rewritten in place alike: each sample is renamed into place, a new inode.
        entry["samples_written"] = len(self._sample_files().items() - samples_before.items())
        return self.conclude(entry, exit_status, stall, lambda: self._attempt_log(log_path, log_offset))

    def conclude(self, entry, exit_status, found, attempt_log):
        """The outcome of an ended attempt ({"state": stopped|succeeded|retry|failed}): a stop, a
        success, or a failure judged by the restart policy. The failure is `found` when the supervisor
        saw it itself (a stall, a dead server, bad outputs), else classified from `attempt_log()`, the
        attempt's log text. `entry` (the attempt's record) has `samples_written` set."""
        number = entry["attempt"]
        if self.stop_signal or (self.run.stop_requested() and exit_status != 0):
            entry["stopped"] = True
            self.log_marker("attempt %d: stopped (%s)" % (number, self.stop_signal or "stop requested"))
            return {"state": "stopped", "ended": {key: entry[key] for key in ("orphans_ended", "left_behind",
                                                                              "gpu_memory")}}
        if exit_status == 0 and found is None:
            self.log_marker("attempt %d: %s" % (number, self.FINISHED))
            return {"state": "succeeded"}
        failure = found or classify.classify(attempt_log(), exit_status, host=self.record.get("host") or "the host")
        failure["attempt"] = number
        entry["failure"] = failure
        previous, self.previous_failure = self.previous_failure, failure
        repeated = (failure["retryable"] and previous is not None and not entry["samples_written"]
                    and previous["signature"] == failure["signature"])
        if repeated:
            failure.update(retryable=False, repeats_attempt=previous["attempt"])
            failure["explain"] += "; the same failure as attempt %d, with no new sample since" % previous["attempt"]
            failure["advice"] += "; a restart would fail the same way, so there was none: `inv resume` once the " \
                                 "cause is fixed"
        retry = failure["retryable"] and self.status["restarts"] < self.options["max_restarts"]
        failure["restarted"] = retry
        verdict = ("the same failure twice with no new sample: not restarting" if repeated
                   else "restarting" if retry else "not restarting")
        self.log_marker("attempt %d: %s (%s); %s" % (number, failure["kind"], failure["explain"], verdict))
        self.save(last_failure=failure, driver_pid=None)
        if retry:
            return {"state": "retry"}
        return {"state": "failed", "failure": failure}

    def not_started(self, number, argv, exc, entry=None):
        """The attempt whose first process could not be started; `entry` when it is already recorded."""
        failure = {"kind": "driver-not-started", "rule": None, "retryable": False, "exit_status": None,
                   "signal": None, "callee": None, "caller": None, "evidence": "%s: %s" % (type(exc).__name__, exc),
                   "attempt": number,
                   "explain": "%s could not be started: %s" % (os.path.basename(argv[1]), exc),
                   "advice": "check `python` (and `server_python`) of the host in hosts.yaml (`inv doctor`); %s"
                             % " ".join(argv[:2])}
        if entry is None:
            entry = {"attempt": number, "started_at": rundir.now_iso(), "pid": None}
            self.status["attempts"].append(entry)
        entry.update(ended_at=rundir.now_iso(), exit_status=None, failure=failure)
        self.log_marker("attempt %d: %s; not restarting" % (number, failure["explain"]))
        self.save(last_failure=failure)
        return {"state": "failed", "failure": failure}

    def end_job(self, driver, job):
        """End what is left of the driver's job (vLLM's workers outlive a killed parent), and wait
        for the GPUs to give their memory back, so that a restart does not meet its own leftovers."""
        pids = {m["pid"] for m in job.members()}
        before = telemetry.snapshot(timeout=10) if pids else {"gpus": {}, "apps": []}
        cleanup = job.terminate(self.options["grace_s"], reap=driver.poll)
        released = telemetry.wait_released(before, pids, GPU_RELEASE_S) if before["apps"] else None
        return {"orphans_ended": cleanup["pids"] or None,
                "left_behind": [m["pid"] for m in cleanup["left"]] or None,
                "gpu_memory": [g for g in released["gpus"] if g["held_by_run_mib"]] if released else None}

    def watch(self, driver, job, log_offset):
        """Follow the driver until it exits; (exit status, stall failure or None).

        Progress is a new phase, a new sample or a new file in the output directory; a heartbeat
        that is merely rewritten (the driver beats from a thread) is not progress. While the model
        loads, `load_timeout_s` applies instead of `stall_timeout_s`: a large model loads for long.
        """
        last_progress, last_mark, last_count, count_checked, last_saved = time.monotonic(), None, None, 0.0, 0.0
        while True:
            exit_status = driver.poll()
            # Looking at the job's processes often lets it follow those that leave its session.
            self.sample_gpus({m["pid"] for m in job.members()})
            self.status["job_seen"] = job.saved()
            if exit_status is not None:
                self.save(heartbeat=self.run.heartbeat)
                return exit_status, None
            if self.stop_requested():
                return None, None
            beat = self.run.heartbeat
            mark = beat and (beat.get("phase"), beat.get("samples_done"))
            if mark and mark != last_mark:
                last_mark, last_progress = mark, time.monotonic()
            elif time.monotonic() - count_checked > OUTPUT_COUNT_EVERY_S:
                count_checked = time.monotonic()
                count = _entries(self.record.get("out"))
                if count != last_count:
                    last_count, last_progress = count, time.monotonic()
            quiet = time.monotonic() - last_progress
            loading = not beat or beat.get("phase") == "loading"
            stalled = quiet > self.options["load_timeout_s" if loading else "stall_timeout_s"]
            if stalled and not self.status["stalled"]:
                self.log_marker("no progress for %.0f s (%s): stalled" % (quiet, beat and beat.get("phase")))
            if stalled != self.status["stalled"] or time.monotonic() - last_saved >= STATUS_EVERY_S:
                # status.json may sit on a network disk: rewritten on a change or every few seconds.
                last_saved = time.monotonic()
                self.save(state="stalled" if stalled else "running", stalled=stalled, heartbeat=beat,
                          seconds_since_progress=round(quiet, 1))
            if stalled:
                failure = self._stall_failure(quiet, self._attempt_log(self.run.file("driver.log"), log_offset))
                # A known cause that will not go away (a prompt waiting on stdin) ends the attempt either way.
                if self.options["stall_restart"] or not failure["retryable"]:
                    return None, failure
            time.sleep(POLL_S)

    def _stall_failure(self, quiet, log):
        known = classify.classify(log, 0, host=self.record.get("host") or "the host")
        if not known["retryable"]:
            known["explain"] += " (no progress for %.0f s)" % quiet
            return known
        stalled = {"kind": "stalled", "rule": None, "retryable": True, "exit_status": None, "signal": None,
                   "callee": None, "caller": None, "evidence": None,
                   "explain": "no new phase, sample or output file for %.0f s" % quiet,
                   "advice": "see `inv logs`; raise stall_timeout_s (or load_timeout_s while loading) in hosts.yaml's "
                             "extract: if the driver is merely slow"}
        stalled["signature"] = classify.signature(stalled)
        return stalled

    def _sample_files(self):
        """{name: inode} of the sample files in the output directory ({} when there is none yet)."""
        try:
            with os.scandir(os.path.expanduser(self.record.get("out"))) as entries:
                return {entry.name: entry.inode() for entry in entries if self.SAMPLE_FILE.fullmatch(entry.name)}
        except (OSError, TypeError):
            return {}

    @staticmethod
    def _attempt_log(path, offset):
        size = os.path.getsize(path)
        start = max(offset, size - LOG_TAIL_BYTES)
        with open(path, "rb") as handle:
            handle.seek(start)
            return handle.read().decode(errors="replace")

    def finish(self, outcome):
        record = dict(outcome, state=outcome["state"], ended_at=rundir.now_iso(),
                      attempts=len(self.status["attempts"]), restarts=self.status["restarts"])
        self.status["history"].append(record)
        self.save(state=outcome["state"], driver_pid=None, stalled=False)
        atomic.write_json(self.run.file("exit.json"), record)
        return 0




def _entries(path):
    try:
        return sum(1 for _ in os.scandir(os.path.expanduser(path)))
    except (OSError, TypeError):
        return None
