"""The server-mode workloads (speculators >= 0.8) of the supervisor's loop (run/supervisor_loop.py), stdlib only.

ServerExtraction, a run on one host or a multi-node job's head. The run's plan (server/plan.py,
run.json "server") holds the three commands. An attempt:

1. checks every `hs_*.safetensors` already in the output (outputs.check_file: header, shapes,
   truncation, NaN/Inf) and deletes those that are not ok, on 0.8 (which would keep them as done)
   and 0.9 (which only reopens headers) alike; empties the connector's staging directory;
2. starts the server in a session of its own (server.log) and waits for /health under
   `load_timeout_s`, the phase PHASE_LOADING;
3. runs prepare-data unless the run's prepared directory is complete or the prepared-data cache has its
   key (PHASE_PREPARING), reads its row count N, then runs generate-offline-data for this run's share of
   the rows (PHASE_GENERATING); both in a session of their own, their output in driver.log, started while
   the server loads and let go when their input is there (server/warm_steps.py: the start-up off the
   critical path, and its times);
4. watches both: the server gone or unhealthy ends the client step and fails the attempt with the
   server's log classified; a client step failing ends the server; no new file or log line for
   `stall_timeout_s` is a stall;
5. while generate-offline-data runs, checks each file of the share as it arrives (ArrivalCheck, a
   thread, reading on CHECK_WORKERS processes where the host has the cores); after the client's exit
   0, checks every file of the share (PHASE_VALIDATING), reading only those not yet found ok as they
   are now: the attempt succeeds when each one is ok, or when the only missing ones are those the
   client reported skipped and the run allows them; then the server is stopped;
6. the supervisor watches the free space of the output and of the staging directory (disk_use(),
   run/disk_watch.py): running low ends the attempt before the disk fills, and the files the client cut
   short meanwhile are deleted (ran_low), every whole one kept.

A multi-node job's worker runs HeadlessServer (server/headless.py) instead.

No driver writes heartbeat.json in server mode: the supervisor does (Heartbeat): the phase, samples
done of total, samples/s, ETA, the server's state.
"""
import os
import re
import shutil
import time

from base import atomic, outputs, prepared
from base.contract import (
    DISK_LOW,
    DRIVER_DEFAULTS,
    PHASE_GENERATING,
    PHASE_LOADING,
    PHASE_PREPARING,
    PHASE_VALIDATING,
    SERVER_DEFAULTS,
)
from run import budget, classify
from run.attempt import POLL_S, STALL_FLOOR_S, NotStarted, Watch, found_failure, log_since, log_size
from run.server import client, health, plan, warm_steps
from run.server.arrivals import COUNT_EVERY_S, ArrivalCheck
from run.server.attempt_jobs import SERVER, Heartbeat, Jobs, server_status
from run.server.health import ServerHealth
from run.server.server_preflight import STAGING_MARGIN
from run.server.warm_steps import CLIENT, GENERATE, PREPARE, ClientStep, client_job  # noqa: F401 (this module's names)

#: Written into the output: the stored layer ids and which activation each one is.
LAYERS_FILE = "specrig-layers.json"
#: Times a client step killed by a signal is started again within one attempt, the server serving: a helper's
#: death does not cost a model load (18 minutes for a 547 GB target); a third is the attempt's failure.
STEP_REPLACEMENTS = 2


def classify_server_log(supervisor, log_offset, exit_status):
    """classify.classify of the server's log since `log_offset`, as the vLLM server's failure (role server)."""
    text = log_since(supervisor.run.file("server.log"), log_offset)
    found = classify.classify(text, exit_status, host=supervisor.host(), subject="the vLLM server",
                              environment="server_python" if supervisor.record.get("server_python") else "python")
    found["role"] = "server"
    found["signature"] = classify.signature(found)
    return found


def server_failure(supervisor, log_offset, exit_status, unhealthy=None, ending_client=False):
    """The server's death (or its engine's: /health unhealthy while it runs, `unhealthy` its last answer),
    classified from its log since `log_offset`."""
    found = classify_server_log(supervisor, log_offset, exit_status if exit_status is not None else 1)
    if exit_status is None:
        answered = "the vLLM server stopped answering /health (%s)" % unhealthy
        found["explain"] = answered + (": " + found["explain"] if found["rule"] else "")
    if found["kind"] == "unknown":
        found["advice"] = "`inv logs --server` shows the server's traceback"
    supervisor.log_marker(found["explain"] + ("; ending the client" if ending_client else ""))
    return found


class ServerExtraction:
    """The workload of a server-mode run on one host, or of a multi-node job's head (module docstring)."""
    STARTS = "checking the outputs, then starting the vLLM server"
    FINISHED = "the extraction finished"
    SAMPLE_FILE = re.compile(r"hs_\d+\.safetensors")

    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.plan = supervisor.record["server"]
        self.jobs = Jobs(supervisor)
        self.heartbeat = Heartbeat(supervisor.run.file("heartbeat.json"))
        self.client_log, self.server_log = supervisor.run.file("driver.log"), supervisor.run.file("server.log")
        # Where this attempt's part of each log starts (prepare() sets them): the whole log until then.
        self.offsets = {self.client_log: 0, self.server_log: 0}
        self.server = self.startup = None
        #: The share's files at the last count (progress): those new at the next are its arrivals.
        self.counted = set()
        # Kept over attempts: a restart's output check does not read again what an attempt found ok.
        self.checked = outputs.CheckedFiles()

    def status_fields(self, previous):
        return server_status(previous)

    def disk_use(self):
        args = self.supervisor.record["driver_args"]
        tokens = args.get("max_length") or DRIVER_DEFAULTS["max_length"]
        return {"directories": [self.plan["out"], self.plan["staging"]],
                # The largest file a sample can make: max_len tokens of 16-bit states and int64 token ids.
                "file_bytes": tokens * (len(self.plan["layer_ids"]) * (self.plan["hidden_size"] or 0) * 2 + 8),
                "in_flight": (args.get("concurrency") or SERVER_DEFAULTS["concurrency"]) * STAGING_MARGIN,
                "remaining": self.remaining}

    def remaining(self):
        """Files of the share not yet in the output (None before prepare-data counted the rows)."""
        total = self.supervisor.status.get("samples_total")
        if total is None:
            return None
        wanted = set(self.share(total))
        return len(wanted) - self.count_done(wanted)

    def count_done(self, wanted):
        """Samples of the share with a file (cheap: names only; validation decides in the end)."""
        present = outputs.existing_indices(self.plan["out"])
        return len(set(present) & wanted) if wanted is not None else len(present)

    def share(self, total):
        return client.plan_share(self.plan, total)

    # -- one attempt ---------------------------------------------------------------------------------

    def prepare(self, entry):
        # A port taken since, or at the last attempt's bind: this attempt's plan is on a free one (plan.py).
        self.plan = plan.for_attempt(self.supervisor, entry)
        self.offsets = {path: log_size(path) for path in (self.client_log, self.server_log)}
        entry["outputs_checked"] = self.clean_outputs()
        total = self.supervisor.status.get("samples_total")
        wanted = set(self.share(total)) if total is not None else None
        self.heartbeat.update(phase=PHASE_LOADING, server=health.LOADING, samples_total=len(wanted)
                              if wanted is not None else None, samples_done=self.count_done(wanted),
                              samples_per_s=None, eta_s=None)

    def run(self, entry):
        started_at = time.time()
        try:
            self.server = self.jobs.start(SERVER, self.plan["server_argv"], self.server_log)
        except OSError as exc:
            raise NotStarted(self.plan["server_argv"], exc) from None
        entry["pid"] = self.server.pid
        self.supervisor.started(server_state=health.LOADING)
        self.startup = warm_steps.StartUp(self, entry, self.startup)
        found = self.startup.begin(started_at)
        return (None, found) if found else self.steps()

    def end(self):
        ended = self.jobs.end_all()
        self.supervisor.save(server_state=None, driver_pid=None)
        self.heartbeat.update(server=None)
        return ended

    def attempt_log(self):
        return log_since(self.client_log, self.offsets[self.client_log])

    def steps(self):
        """Load, prepare, generate, validate; (the client's exit status or None, failure found or None)."""
        sup = self.supervisor
        ready, found = self.follow(PHASE_LOADING)
        if ready is None:
            return None, found
        self.startup.mark("health")
        sup.log_marker("the vLLM server is ready (port %d)" % self.plan["port"])
        self.heartbeat.update(phase=PHASE_PREPARING)
        status, found = self.startup.prepare()
        if status != 0 or found:
            return status, found
        try:
            total = prepared.rows(self.plan["prepared"])
        except (OSError, prepared.PreparedDataError) as exc:
            return None, found_failure("prepared-data", str(exc), "see `inv logs`: prepare-data's output", False)
        share = self.share(total)
        found = self.unfit_share()
        if found:
            return None, found
        wanted = set(share)
        sup.status["samples_total"] = total
        self.heartbeat.update(phase=PHASE_GENERATING, samples_total=len(wanted), samples_done=self.count_done(wanted))
        with ArrivalCheck(self, wanted) as arrivals:
            status, found = self.client_step(GENERATE, self.startup.generate())
            if status != 0 or found:
                return status, found
            self.startup.arrived()
            self.heartbeat.update(phase=PHASE_VALIDATING)
            arrivals.finish()
        return 0, self.validate(share, self.attempt_log())

    def unfit_share(self):
        """DISK_LOW when the output cannot hold the share's missing files, sized from prepare-data's real
        token counts before any file is written (the preflight had only an estimate), else None."""
        room = budget.share_room(self.plan, fix="then `inv resume`; or launch again with an --out that has room")
        if room is None or room["ok"]:
            return None
        return found_failure(DISK_LOW, "disk low: " + room["detail"], room["advice"], False, path=room["where"],
                             free_bytes=room["free"], need_bytes=room["need"])

    def client_step(self, name, jobs, step=ClientStep):
        """Follow one of speculators' steps, its processes (`jobs`, started warm and just let go) writing into
        the client's log, until they end (`step` of the processes says when); then end them. A step killed by a
        signal while the server serves is started again (replace_killed), at most STEP_REPLACEMENTS times."""
        argv = self.plan["prepare_argv"] if name == PREPARE else self.plan["generate_argvs"][0]
        self.supervisor.log_marker("%s: %s (let go after its warm start%s)" % (
            name, " ".join(argv[1:4]), ", %d processes" % len(jobs) if len(jobs) > 1 else ""))
        replaced = 0
        try:
            while True:
                # prepare-data renders and tokenizes itself: its own processes idle is a hang, whatever the
                # server's do.
                status, found = self.follow(name, step(lambda: [self.jobs.running[job][0] for job in jobs]),
                                            idle_jobs=jobs if name == PREPARE else None)
                if not self.replaceable(status, found, replaced):
                    break
                replaced += 1
                self.replace_killed(name, jobs, status, replaced)
        finally:
            for job in jobs:
                self.jobs.end(job)
        if status not in (None, 0):
            found = self.step_failed(name, status)
        return status, found

    def replaceable(self, status, found, replaced):
        """Whether a step that ended with `status` is started again: killed by a signal (kill -9, the OOM killer:
        no fault of its input, which an error exit may be), the server still running, replacements left."""
        return (status is not None and status < 0 and found is None and replaced < STEP_REPLACEMENTS
                and self.server.poll() is None and not self.supervisor.stop_requested())

    def replace_killed(self, name, jobs, status, replaced):
        """Start step `name`'s processes again, at once (the server serves), after what the killed one left: a
        file it cut short in the output (generate-offline-data), or its part-written directory (prepare-data)."""
        self.supervisor.log_marker("%s was killed (status %s) while the server served: started again (%d of %d), "
                                   "without a new model load" % (name, status, replaced, STEP_REPLACEMENTS))
        for job in jobs:
            self.jobs.end(job)
        if name == PREPARE:
            shutil.rmtree(self.plan["prepared"], ignore_errors=True)  # prepare-data would skip a part-written one
            argvs = [self.plan["prepare_argv"]]
        else:
            self.delete_unusable("left by the killed client")
            argvs = self.plan["generate_argvs"]
        for job, argv in zip(jobs, argvs):
            self.jobs.start(job, argv, self.client_log)
        self.startup.entry.setdefault("replaced", []).append({"step": name, "status": status, "at": time.time()})

    def step_failed(self, name, status):
        """The failure of step `name` whose process exited with `status`, classified from the attempt's log."""
        sup = self.supervisor
        sup.log_marker("%s exited with status %s" % (name, status))
        found = classify.classify(self.attempt_log(), status, host=sup.host(), subject=name)
        found["role"] = name
        if not found["rule"]:
            found = self.server_cause("%s exited with status %s" % (name, status)) or found
        return found

    @staticmethod
    def not_started(name, exc):
        return found_failure("client-not-started", "%s could not be started: %s" % (name, exc),
                             "check `python` of the host in hosts.yaml (`inv doctor`)", False)

    def server_cause(self, what):
        """The cause the server's log names, for a client failure that names none (None when neither does):
        the client sees only missing files and gives up, the server's log says why (a full disk under the
        connector)."""
        cause = classify_server_log(self.supervisor, self.offsets[self.server_log], 0)
        if not cause["rule"]:
            return None
        cause["explain"] = "%s: %s" % (what, cause["explain"])
        self.supervisor.log_marker(cause["explain"])
        return cause

    # -- following the processes ---------------------------------------------------------------------

    def follow(self, label, step=None, idle_jobs=None):
        """Follow the attempt while the server loads (no `step`) or a client step runs (`label` its name):
        (health.READY, None) once the server answers, or (the step's exit status, None); (None, failure)
        when the server dies, is unhealthy or a stall comes; (None, None) on a stop. `idle_jobs`: the jobs
        whose processes' idling is a hang (Watch), else all of the attempt's."""
        sup = self.supervisor
        loading = step is None
        ceiling = sup.options["load_timeout_s" if loading else "stall_timeout_s"]
        # Before its first file, a sample is late once the client would have given its request up.
        first_file_s = (sup.record["driver_args"].get("request_timeout") or SERVER_DEFAULTS["request_timeout"]) \
            + STALL_FLOOR_S
        clock = Watch(sup, self.server_log, self.offsets[self.server_log], processes=self.jobs.processes,
                      idle_jobs=idle_jobs)
        server_health = ServerHealth(self.plan["port"], sup.status["server_state"])
        started, done_at_start, wanted_total = time.monotonic(), self.heartbeat.beat["samples_done"], \
            self.heartbeat.beat["samples_total"]
        last_mark, counted = None, 0.0
        while True:
            status = step.poll() if step is not None else None
            if status is not None:
                return status, None
            if sup.stop_requested():
                return None, None
            if self.server.poll() is not None:
                return None, self.server_died(self.server.returncode)
            sup.look(self.jobs.members())
            early = self.startup.look()  # a client step's process that exited before its go
            if early:
                return None, early
            state = server_health.look()
            if state == health.UNHEALTHY:
                return None, self.server_died(None, unhealthy=server_health.answer)
            if state != sup.status["server_state"]:
                sup.status["server_state"] = state
                self.heartbeat.update(server=state)
            if loading and state == health.READY:
                return health.READY, None
            now = time.monotonic()
            if label == GENERATE:
                if now - counted >= COUNT_EVERY_S:
                    counted = now
                    clock.samples(*self.progress(started, done_at_start, wanted_total))
            else:
                # Once the server serves, its log grows by the access lines of this watch's own /health probes:
                # prepare-data's log alone says whether the step moves.
                mark = (log_size(self.client_log), log_size(self.server_log) if loading else None)
                if mark != last_mark:
                    last_mark = mark
                    clock.progress()
            limit = clock.limit(ceiling, first_file_s)
            stall = clock.check(limit, label, dict(self.heartbeat.beat))
            # A server that never came up is not waited for beyond load_timeout_s, stall_restart or not.
            if stall and (sup.options["stall_restart"] or not stall["retryable"] or loading):
                return None, stall
            time.sleep(POLL_S)

    def server_died(self, exit_status, unhealthy=None):
        return server_failure(self.supervisor, self.offsets[self.server_log], exit_status, unhealthy,
                              ending_client=CLIENT in self.jobs.running)

    def progress(self, started, done_at_start, total):
        """The heartbeat's count, rate and ETA brought up to date: (samples done, the times the files new since
        the last count were moved into the output, their ctimes)."""
        out = self.plan["out"]
        present = set(outputs.existing_indices(out)) & set(self.share(self.supervisor.status["samples_total"]))
        done, new = len(present), present - self.counted
        self.counted = present
        times = []
        for index in new:
            try:
                times.append(os.stat(os.path.join(out, outputs.file_name(index))).st_ctime)
            except OSError:
                pass  # deleted since (a file found bad): the next count has the truth
        elapsed = time.monotonic() - started
        made = done - done_at_start
        rate = made / elapsed if elapsed > 0 and made > 0 else None
        self.startup.arrived()
        self.heartbeat.update(samples_done=done, samples_per_s=round(rate, 2) if rate else None,
                              eta_s=round((total - done) / rate, 1) if rate and total is not None else None)
        return done, times

    # -- the outputs ---------------------------------------------------------------------------------

    def file_checks(self):
        """What every file of the output must be: check_file's expected sizes and storage type."""
        return {"n_layers": len(self.plan["layer_ids"]), "hidden_size": self.plan["hidden_size"],
                "storage": self.plan["storage"]}

    def check(self, indices):
        """outputs.check_dataset of `indices` of the output, reading only what is not known ok."""
        return outputs.check_dataset(self.plan["out"], None, indices=indices, checked=self.checked,
                                     **self.file_checks())

    def validate(self, share, client_log):
        """None when every file of the share is ok (or only allowed skipped ones are missing)."""
        sup = self.supervisor
        report = self.check(share)
        skipped = [i for i in client.skipped(client_log) if i in set(share)]
        bad = {status: indices for status, indices in report["by_status"].items() if status != outputs.MISSING}
        result = {"samples": report["expected"], "ok": report["counts"][outputs.OK], "skipped": skipped,
                  "missing": report["missing"], "bad": bad}
        sup.status["result"] = result
        self.heartbeat.update(samples_done=report["counts"][outputs.OK])
        if report["complete"]:
            sup.log_marker("every file of the %d samples loads, with %d layers, hidden size %s, finite"
                           % (report["expected"], len(self.plan["layer_ids"]), self.plan["hidden_size"]))
            return None
        if not bad and set(report["missing"]) == set(skipped) and self.plan["allow_skipped"]:
            sup.log_marker("%d samples skipped by the client, allowed (allow_skipped): %s"
                           % (len(skipped), _indices(skipped)))
            return None
        if skipped and set(report["missing"]) <= set(skipped) and not bad:
            # The client only says it gave up; why is in the server's log when the server could not serve
            # them (a full disk under the connector's writes): that cause decides, retry or not.
            cause = self.server_cause("generate-offline-data skipped %d of %d samples"
                                      % (len(skipped), report["expected"]))
            if cause:
                return cause
            return found_failure(
                "samples-skipped", "generate-offline-data skipped %d of %d samples after their retries: %s"
                % (len(skipped), report["expected"], _indices(skipped)),
                "see `inv logs` (\"Skipping sample\"): `inv resume` retries exactly those; set allow_skipped: true "
                "under extract: in hosts.yaml to accept a run without them", False, evidence=_indices(skipped))
        described = "; ".join("%d %s (%s)" % (len(ix), status, _indices(ix))
                              for status, ix in sorted(dict(bad, missing=report["missing"]).items()) if ix)
        return found_failure("outputs-invalid", "generate-offline-data exited 0 but not every sample's file is "
                             "whole: %s" % described,
                             "a restart checks the files and regenerates the bad and missing ones", True,
                             evidence=described)

    def clean_outputs(self):
        """Delete every hs_*.safetensors of the output that is not ok, and empty the staging directory."""
        out = self.plan["out"]
        os.makedirs(out, exist_ok=True)
        # The files hold no metadata: what axis 1 of hidden_states is, beside them.
        atomic.write_json(os.path.join(out, LAYERS_FILE), {
            "layer_ids": self.plan["layer_ids"], "convention": self.plan["layer_convention"],
            "num_hidden_layers": self.plan["num_hidden_layers"], "hidden_size": self.plan["hidden_size"],
            "storage": self.plan["storage"],
            "model": self.supervisor.record["driver_args"].get("model"), "run_id": self.supervisor.run.run_id})
        present, deleted = self.delete_unusable("to regenerate")
        shutil.rmtree(self.plan["staging"], ignore_errors=True)
        os.makedirs(self.plan["staging"], exist_ok=True)
        return {"kept": len(present) - len(deleted), "deleted": deleted}

    def delete_unusable(self, why):
        """Delete every hs_*.safetensors of the output that is not ok (outputs.check_file): (the indices
        present, those deleted); `why` goes into the log's line."""
        out = self.plan["out"]
        present = outputs.existing_indices(out)
        report = self.check(present)
        deleted = sorted(report["files"])
        for index in deleted:
            os.unlink(os.path.join(out, outputs.file_name(index)))
        if deleted:
            self.supervisor.log_marker("deleted %d unusable file(s) %s: %s" % (len(deleted), why, "; ".join(
                "hs_%d (%s: %s)" % (i, report["files"][i]["status"], report["files"][i]["detail"])
                for i in deleted[:10])))
        return present, deleted

    def ran_low(self):
        # The client was ended mid-move: a copy into another filesystem cut short is no sample.
        self.delete_unusable("left partial when the disk ran low")

    def finish(self, outcome):
        shutil.rmtree(self.plan["staging"], ignore_errors=True)
        outcome = dict(outcome, result=self.supervisor.status.get("result"))
        # The heartbeat's last phase is the run's final state.
        self.heartbeat.update(phase=outcome["state"], server=None)
        return outcome


def _indices(indices, shown=20):
    text = ", ".join(str(i) for i in indices[:shown])
    return text + (" … (%d in all)" % len(indices) if len(indices) > shown else "")
