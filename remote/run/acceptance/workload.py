"""The acceptance measurement's workload (run kind "accept"), stdlib only: measure.py's steps,
`<python> <run>/code/run/acceptance/measure.py <run>`, in a session of its own (the untrained draft's
`speculators train --dry-run` and each draft's vLLM are its children, in the same session), its output in
driver.log; the supervisor's loop (run/supervisor_loop.py) runs, watches and restarts it.

Progress is a new phase or draft in the heartbeat, and in the measuring phase a new batch of prompts done;
the watch's stall bounds and idle-CPU rule are the extraction's (run/attempt.py Watch). A restart measures only
the drafts whose results are missing (measure.py). status.json's `acceptance` holds the report as measured so
far (verdict.py), and the run's exit record holds it at the end.
"""
import os
import time

from base.contract import SUCCEEDED
from run.acceptance import verdict
from run.acceptance.measure import PHASE_LOADING, PHASE_MEASURING, PHASE_UNTRAINED
from run.attempt import POLL_S, Watch, child_env, log_since, start_job


class Acceptance:
    STARTS = "starting the acceptance measurement"
    FINISHED = "the acceptance measurement finished"
    #: Its results are two small files in the run's own directory: no samples, no output to watch for room.
    SAMPLE_FILE = None

    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.plan = supervisor.record["accept"]
        self.log = supervisor.run.file("driver.log")
        self.log_offset = 0
        self.program = self.job = None

    def status_fields(self, previous):
        return {"acceptance": verdict.report(self.plan)}

    def disk_use(self):
        return None

    def prepare(self, entry):
        self.log_offset = os.path.getsize(self.log) if os.path.exists(self.log) else 0

    def run(self, entry):
        sup = self.supervisor
        argv = [sup.record["python"], sup.run.file(os.path.join("code", "run", "acceptance", "measure.py")),
                sup.run.path]
        self.program, self.job = start_job(sup, entry, argv, self.log, child_env())
        return self.watch()

    def watch(self):
        """Follow the steps until they exit; (exit status, stall failure or None). Making the untrained draft and
        loading an engine are bounded by `load_timeout_s`, measuring by `stall_timeout_s` and the prompts' pace."""
        sup = self.supervisor
        clock = Watch(sup, self.log, self.log_offset, processes=self.job.members)
        started_at = time.time()
        while True:
            exit_status = self.program.poll()
            pids = {member["pid"] for member in self.job.members()}
            sup.status["job_seen"] = self.job.saved()
            sup.status["acceptance"] = verdict.report(self.plan)
            if exit_status is not None:
                sup.save(heartbeat=sup.run.heartbeat)
                return exit_status, None
            if sup.stop_requested():
                return None, None
            sup.look(pids)
            beat = sup.run.heartbeat_since(started_at)
            if beat:
                # Each draft's loading and measuring is a phase of its own: a new engine, a new pace.
                clock.enter("%s %s" % (beat.get("phase"), beat.get("draft")))
                if beat.get("phase") == PHASE_MEASURING:
                    clock.samples(beat.get("prompts_done") or 0)
            slow = not beat or beat.get("phase") in (PHASE_LOADING, PHASE_UNTRAINED)
            stall = clock.check(clock.limit(sup.options["load_timeout_s" if slow else "stall_timeout_s"]),
                                beat and beat.get("phase"), beat)
            if stall and (sup.options["stall_restart"] or not stall["retryable"]):
                return None, stall
            time.sleep(POLL_S)

    def end(self):
        return self.supervisor.end_job(self.program, self.job)

    def attempt_log(self):
        return log_since(self.log, self.log_offset)

    def finish(self, outcome):
        report = verdict.report(self.plan)
        self.supervisor.status["acceptance"] = report
        return dict(outcome, acceptance=report) if outcome["state"] == SUCCEEDED else outcome
