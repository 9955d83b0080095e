"""The in-process workload (speculators <= 0.4), stdlib only: the extraction driver,
`<python> <run>/code/run/extract_driver.py <run>/driver-args.json`, in a session of its own, its
output in driver.log; the supervisor's loop (run/supervisor_loop.py) runs, watches and restarts it.

The driver writes heartbeat.json (phase, samples); the watch counts a new phase or sample as
progress, and failing that a new file in the output directory. The supervisor watches the output's
free space (disk_use(), run/disk_watch.py): running low ends the driver before the disk fills, and
ran_low() removes the samples it left half-written (their temporary names), every whole one kept.
"""
import os
import re
import time

from base.contract import DRIVER_DEFAULTS, PHASE_DONE, PHASE_EXTRACTING, PHASE_LOADING
from run.attempt import POLL_S, Watch, child_env, log_since, start_job
from run.driver.output import remove_temporaries

#: Seconds between counts of the output directory (a cheap second sign of progress).
OUTPUT_COUNT_EVERY_S = 15


class InProcessDriver:
    """The workload of a run on speculators <= 0.4: one driver per attempt, resuming from its first missing
    sample by itself."""
    STARTS = "starting the driver"
    FINISHED = "the driver finished"
    #: The driver's sample files (extract_driver.py: data_{i}.pt, each renamed into place when written).
    SAMPLE_FILE = re.compile(r"data_\d+\.pt")

    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.log = supervisor.run.file("driver.log")
        self.log_offset = 0
        self.driver = self.job = None

    def status_fields(self, previous):
        return {}

    def disk_use(self):
        args = self.supervisor.record["driver_args"]
        # A batch's samples are written after its generation, at most writes_in_flight at once.
        in_flight = sum(args.get(key) or DRIVER_DEFAULTS[key] for key in ("batch_size", "writes_in_flight"))
        return {"directories": [os.path.expanduser(self.supervisor.record["out"])], "file_bytes": None,
                "in_flight": in_flight, "remaining": self.remaining}

    def remaining(self):
        """Samples of the run's share not yet in the output (None before the driver says how many it has):
        its files counted, which the heartbeat's count follows only every few seconds."""
        beat = self.supervisor.run.heartbeat or {}
        if beat.get("phase") == PHASE_DONE:
            return 0
        total = beat.get("samples_total")
        return None if total is None else max(0, total - len(self.supervisor.sample_files()))

    def prepare(self, entry):
        self.log_offset = os.path.getsize(self.log)

    def run(self, entry):
        sup = self.supervisor
        record = sup.record
        program = record.get("driver_program") or sup.run.file(os.path.join("code", "run", "extract_driver.py"))
        argv = [record["python"], program, sup.run.file("driver-args.json")]
        self.driver, self.job = start_job(sup, entry, argv, self.log, child_env())
        return self.watch()

    def watch(self):
        """Follow the driver until it exits; (exit status, stall failure or None).

        Progress is a new phase, a new sample or a new file in the output directory; a heartbeat
        that is merely rewritten (the driver beats from a thread) is not progress. While the model
        loads, `load_timeout_s` applies instead of `stall_timeout_s`: a large model loads for long.
        """
        sup = self.supervisor
        clock = Watch(sup, self.log, self.log_offset, processes=self.job.members)
        started_at = time.time()
        last_count, count_checked = None, 0.0
        while True:
            exit_status = self.driver.poll()
            # Looking at the job's processes often lets it follow those that leave its session.
            pids = {m["pid"] for m in self.job.members()}
            sup.status["job_seen"] = self.job.saved()
            if exit_status is not None:
                sup.save(heartbeat=sup.run.heartbeat)
                return exit_status, None
            if sup.stop_requested():
                return None, None
            sup.look(pids)  # after the exit: a driver that finished is not ended for the room it left
            beat = sup.run.heartbeat_since(started_at)
            if beat:
                clock.enter(beat.get("phase"))
            if beat and beat.get("phase") == PHASE_EXTRACTING:
                clock.samples(beat.get("samples_done") or 0)
            elif time.monotonic() - count_checked > OUTPUT_COUNT_EVERY_S:
                count_checked = time.monotonic()
                count = _entries(sup.record.get("out"))
                if count != last_count:
                    last_count = count
                    clock.progress()
            loading = not beat or beat.get("phase") == PHASE_LOADING
            stall = clock.check(clock.limit(sup.options["load_timeout_s" if loading else "stall_timeout_s"]),
                                beat and beat.get("phase"), beat)
            # A known cause that will not go away (a prompt waiting on stdin) ends the attempt either way.
            if stall and (sup.options["stall_restart"] or not stall["retryable"]):
                return None, stall
            time.sleep(POLL_S)

    def end(self):
        return self.supervisor.end_job(self.driver, self.job)

    def attempt_log(self):
        return log_since(self.log, self.log_offset)

    def ran_low(self):
        # The driver was ended mid-write: its temporary files are no samples.
        remove_temporaries(os.path.expanduser(self.supervisor.record["out"]))

    def finish(self, outcome):
        return outcome


def _entries(path):
    try:
        return sum(1 for _ in os.scandir(os.path.expanduser(path)))
    except (OSError, TypeError):
        return None
