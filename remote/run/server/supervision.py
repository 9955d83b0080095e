"""The supervisor of one server-mode extraction run (speculators >= 0.8), stdlib only.

The run's plan (server/plan.py, run.json "server") holds the three commands. An attempt:

1. checks every `hs_*.safetensors` already in the output (outputs.check_file: header, shapes,
   truncation, NaN/Inf) and deletes those that are not ok, on 0.8 (which would keep them as done)
   and 0.9 (which only reopens headers) alike; empties the connector's staging directory;
2. starts the server in a session of its own (server.log) and waits for /health under
   `load_timeout_s`, the phase `loading`;
3. runs prepare-data unless the run's prepared directory is complete (`preparing`), reads its row
   count N, then runs generate-offline-data for this run's share of the rows (`generating`); both in
   a session of their own, their output in driver.log;
4. watches both: the server gone or unhealthy ends the client step and fails the attempt with the
   server's log classified; a client step failing ends the server; no new file or log line for
   `stall_timeout_s` is a stall;
5. after the client's exit 0, checks every file of the share (`validating`): the attempt succeeds
   when each one is ok, or when the only missing ones are those the client reported skipped and the
   run allows them; then the server is stopped.

Restarts, backoff, stop and the repeated-failure rule are the in-process supervisor's (supervision.py).
Progress goes to heartbeat.json, written here: samples done of total, samples/s, ETA, server state.
"""
import os
import re
import shutil
import subprocess
import time

import atomic
import procs
from run import classify, rundir
from run.server import client, health, outputs, prepared
from run.supervision import POLL_S, STATUS_EVERY_S, Supervisor

#: Seconds between health probes while the server loads, and once it serves.
HEALTH_EVERY_LOADING_S = 1.0
HEALTH_EVERY_S = 5.0
#: Probes in a row that must find a served server unhealthy (503, or no answer) before it counts as dead.
UNHEALTHY_PROBES = 3
#: Seconds between counts of the output directory.
COUNT_EVERY_S = 2.0
ROLES = ("server", "client")
#: Written into the output: the stored layer ids and which activation each one is.
LAYERS_FILE = "specrig-layers.json"


class ServerSupervisor(Supervisor):
    SAMPLE_FILE = re.compile(r"hs_\d+\.safetensors")
    FINISHED = "the extraction finished"

    def __init__(self, run):
        Supervisor.__init__(self, run)
        self.plan = self.record["server"]
        previous = self.run.status
        # N, the prepared rows, survives a resume with the prepared directory it was read from.
        self.status.update(jobs={}, server_state=None, result=previous.get("result"),
                           samples_total=previous.get("samples_total"))
        self.jobs = {}
        self.beat = {"phase": "starting", "samples_done": 0, "samples_total": None, "samples_per_s": None,
                     "tokens_per_s": None, "eta_s": None, "server": None, "last_error": None, "pid": os.getpid()}

    # -- the heartbeat, written by the supervisor itself ---------------------------------------------

    def heartbeat(self, **changes):
        self.beat.update(changes)
        atomic.write_json(self.run.file("heartbeat.json"), self.beat)

    def count_done(self, wanted):
        """Samples of the share with a file (cheap: names only; validation decides in the end)."""
        present = outputs.existing_indices(self.plan["out"])
        return len(set(present) & wanted) if wanted is not None else len(present)

    # -- the jobs ------------------------------------------------------------------------------------

    def start(self, role, argv, log_path):
        env = dict(os.environ)  # hosts.yaml `env:` included: the call that started this supervisor had it
        env["PYTHONUNBUFFERED"] = "1"
        # speculators logs through rich, which wraps at 80 columns without a terminal (and pads every line
        # to the width): wide enough for most records on one line; `skipped()` does not need the summary's.
        env["COLUMNS"] = "200"
        # The client talks to 127.0.0.1: a proxy set on the host must not carry those requests.
        env["NO_PROXY"] = env["no_proxy"] = ",".join(filter(None, [env.get("NO_PROXY"), "127.0.0.1", "localhost"]))
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.run.path, env=env, start_new_session=True)
        self.jobs[role] = (proc, procs.Job(proc.pid))
        self.status["jobs"][role] = {"pid": proc.pid, "pgid": proc.pid, "argv": argv, "seen": {}}
        return proc

    def members(self):
        pids = set()
        for role, (proc, job) in self.jobs.items():
            found = job.members()
            pids.update(m["pid"] for m in found)
            self.status["jobs"][role]["seen"] = job.saved()
        return pids

    def end(self, role):
        """End one job and what it left (vLLM's workers outlive a killed parent); its cleanup record."""
        proc, job = self.jobs.pop(role)
        ended = self.end_job(proc, job)
        self.status["jobs"].pop(role, None)
        return ended

    def end_all(self):
        merged = {"orphans_ended": None, "left_behind": None, "gpu_memory": None}
        for role in [r for r in ROLES if r in self.jobs][::-1]:  # the client first: it talks to the server
            for key, value in self.end(role).items():
                if value:
                    merged[key] = (merged[key] or []) + value
        return merged

    # -- one attempt ---------------------------------------------------------------------------------

    def attempt(self):
        number = len(self.status["attempts"]) + 1
        client_log, server_log = self.run.file("driver.log"), self.run.file("server.log")
        offsets = {path: (os.path.getsize(path) if os.path.exists(path) else 0) for path in (client_log, server_log)}
        self.log_marker("attempt %d: checking the outputs, then starting the vLLM server" % number)
        entry = {"attempt": number, "started_at": rundir.now_iso(), "pid": None, "ended_at": None,
                 "exit_status": None, "failure": None}
        self.status["attempts"].append(entry)
        self.last_telemetry = 0.0
        entry["outputs_checked"] = self.clean_outputs()
        samples_before = self._sample_files()
        total = self.status.get("samples_total")
        wanted = set(self.share(total)) if total is not None else None
        self.heartbeat(phase="loading", server=health.LOADING, samples_total=len(wanted) if wanted is not None
                       else None, samples_done=self.count_done(wanted), samples_per_s=None, eta_s=None)
        try:
            server = self.start("server", self.plan["server_argv"], server_log)
        except OSError as exc:
            return self.not_started(number, self.plan["server_argv"], exc, entry=entry)
        entry["pid"] = server.pid
        self.save(state="running", stalled=False, restart_at=None, gpu_apps=[], server_state=health.LOADING)
        exit_status, found = self.steps(server, offsets)
        entry.update(self.end_all(), ended_at=rundir.now_iso(), exit_status=exit_status)
        entry["samples_written"] = len(self._sample_files().items() - samples_before.items())
        self.save(server_state=None, driver_pid=None)
        self.heartbeat(server=None)
        return self.conclude(entry, exit_status, found, lambda: self._attempt_log(client_log, offsets[client_log]))

    def steps(self, server, offsets):
        """Load, prepare, generate, validate; (the client's exit status or None, failure found or None)."""
        ready, found = self.follow("loading", server, offsets)
        if ready is None:
            return None, found
        self.log_marker("the vLLM server is ready (port %d)" % self.plan["port"])
        if prepared.complete(self.plan["prepared"]):
            self.log_marker("prepare-data: %s is complete, not run again" % self.plan["prepared"])
        else:
            shutil.rmtree(self.plan["prepared"], ignore_errors=True)  # a part-written one would be skipped
            self.heartbeat(phase="preparing")
            status, found = self.client_step("prepare-data", self.plan["prepare_argv"], server, offsets)
            if status != 0 or found:
                return status, found
        try:
            total = prepared.rows(self.plan["prepared"])
        except (OSError, prepared.PreparedDataError) as exc:
            return None, self.failure("prepared-data", str(exc), "see `inv logs`: prepare-data's output", False)
        share = self.share(total)
        wanted = set(share)
        self.status["samples_total"] = total
        self.heartbeat(phase="generating", samples_total=len(wanted), samples_done=self.count_done(wanted))
        status, found = self.client_step("generate-offline-data", self.plan["generate_argv"], server, offsets)
        if status != 0 or found:
            return status, found
        self.heartbeat(phase="validating")
        client_log = self.run.file("driver.log")
        return 0, self.validate(share, self._attempt_log(client_log, offsets[client_log]))

    def share(self, total):
        return client.shard_indices(total, self.plan["max_samples"], self.plan["world_size"], self.plan["rank"])

    def client_step(self, name, argv, server, offsets):
        self.log_marker("%s: %s" % (name, " ".join(argv[1:4])))
        try:
            step = self.start("client", argv, self.run.file("driver.log"))
        except OSError as exc:
            return None, self.failure("client-not-started", "%s could not be started: %s" % (name, exc),
                                      "check `python` of the host in hosts.yaml (`inv doctor`)", False)
        status, found = self.follow(name, server, offsets, step=step)
        self.end("client")
        if status not in (None, 0):
            self.log_marker("%s exited with status %s" % (name, status))
            client_log = self.run.file("driver.log")
            found = classify.classify(self._attempt_log(client_log, offsets[client_log]), status,
                                      host=self.record.get("host") or "the host", subject=name)
            found["role"] = name
        return status, found

    # -- following the processes ---------------------------------------------------------------------

    def follow(self, phase, server, offsets, step=None):
        """Follow the attempt until the phase ends: ("ready", None) when the server answers (loading)
        or (the step's exit status, None); (None, failure) when the server dies, is unhealthy or a
        stall comes; (None, None) on a stop."""
        limit = self.options["load_timeout_s" if phase == "loading" else "stall_timeout_s"]
        last_progress, last_mark, last_saved, last_probe, unhealthy = time.monotonic(), None, 0.0, 0.0, 0
        state = self.status["server_state"]
        started, done_at_start = time.monotonic(), self.beat["samples_done"]
        wanted_total = self.beat["samples_total"]
        counted = 0.0
        while True:
            if step is not None:
                status = step.poll()
                if status is not None:
                    return status, None
            if self.stop_requested():
                return None, None
            if server.poll() is not None:
                return None, self.server_failure(server.returncode, offsets)
            found = self.other_nodes_failure()
            if found:
                return None, found
            now = time.monotonic()
            if now - last_probe >= (HEALTH_EVERY_LOADING_S if state == health.LOADING else HEALTH_EVERY_S):
                last_probe = now
                answer = health.probe(self.plan["port"])
                if state == health.LOADING:
                    state = health.READY if answer == health.READY else health.LOADING
                else:
                    unhealthy = 0 if answer == health.READY else unhealthy + 1
                    if unhealthy >= UNHEALTHY_PROBES:
                        return None, self.server_failure(None, offsets, unhealthy=answer)
                if state != self.status["server_state"]:
                    self.status["server_state"] = state
                    self.heartbeat(server=state)
                if phase == "loading" and state == health.READY:
                    return "ready", None
            self.sample_gpus(self.members())
            if now - counted >= COUNT_EVERY_S:
                counted = now
                if phase == "generate-offline-data":
                    self.progress(started, done_at_start, wanted_total)
            mark = (self.beat["samples_done"], os.path.getsize(self.run.file("driver.log")),
                    os.path.getsize(self.run.file("server.log")))
            if mark != last_mark:
                last_mark, last_progress = mark, now
            quiet = now - last_progress
            stalled = quiet > limit
            if stalled or now - last_saved >= STATUS_EVERY_S:
                last_saved = now
                self.save(state="stalled" if stalled else "running", stalled=stalled, heartbeat=dict(self.beat),
                          seconds_since_progress=round(quiet, 1))
            if stalled:
                self.log_marker("nothing new for %.0f s (%s): stalled" % (quiet, phase))
                failure = self._stall_failure(quiet, self._attempt_log(self.run.file("server.log"),
                                                                       offsets[self.run.file("server.log")]))
                if self.options["stall_restart"] or not failure["retryable"] or phase == "loading":
                    return None, failure
            time.sleep(POLL_S)

    def other_nodes_failure(self):
        """The failure of another node of a multi-node job that ends this attempt
        (server/node_supervision.py); None on one host."""
        return None

    def progress(self, started, done_at_start, total):
        done = self.count_done(set(self.share(self.status["samples_total"])))
        elapsed = time.monotonic() - started
        made = done - done_at_start
        rate = made / elapsed if elapsed > 0 and made > 0 else None
        self.heartbeat(samples_done=done, samples_per_s=round(rate, 2) if rate else None,
                       eta_s=round((total - done) / rate, 1) if rate and total is not None else None)

    # -- failures ------------------------------------------------------------------------------------

    def failure(self, kind, explain, advice, retryable, **fields):
        found = {"kind": kind, "rule": None, "retryable": retryable, "exit_status": None, "signal": None,
                 "callee": None, "caller": None, "evidence": None, "explain": explain, "advice": advice}
        found.update(fields)
        found["signature"] = classify.signature(found)
        return found

    def server_failure(self, exit_status, offsets, unhealthy=None):
        """The server's death (or its engine's: /health unhealthy while it runs), classified from its log."""
        server_log = self.run.file("server.log")
        text = self._attempt_log(server_log, offsets[server_log])
        found = classify.classify(text, exit_status if exit_status is not None else 1,
                                  host=self.record.get("host") or "the host", subject="the vLLM server",
                                  environment="server_python" if self.record.get("server_python") else "python")
        if exit_status is None:
            answered = "the vLLM server stopped answering /health (%s)" % unhealthy
            found["explain"] = answered + (": " + found["explain"] if found["rule"] else "")
        if found["kind"] == "unknown":
            found["advice"] = "`inv logs --server` shows the server's traceback"
        found["role"] = "server"
        found["signature"] = classify.signature(found)
        self.log_marker(found["explain"] + ("; ending the client" if "client" in self.jobs else ""))
        return found

    def validate(self, share, client_log):
        """None when every file of the share is ok (or only allowed skipped ones are missing)."""
        report = outputs.check_dataset(self.plan["out"], None, indices=share, n_layers=len(self.plan["layer_ids"]),
                                       hidden_size=self.plan["hidden_size"])
        skipped = [i for i in client.skipped(client_log) if i in set(share)]
        bad = {status: indices for status, indices in report["by_status"].items() if status != outputs.MISSING}
        result = {"samples": report["expected"], "ok": report["counts"][outputs.OK], "skipped": skipped,
                  "missing": report["missing"], "bad": bad}
        self.status["result"] = result
        self.heartbeat(samples_done=report["counts"][outputs.OK])
        if report["complete"]:
            self.log_marker("every file of the %d samples loads, with %d layers, hidden size %s, finite"
                            % (report["expected"], len(self.plan["layer_ids"]), self.plan["hidden_size"]))
            return None
        if not bad and set(report["missing"]) == set(skipped) and self.plan["allow_skipped"]:
            self.log_marker("%d samples skipped by the client, allowed (allow_skipped): %s"
                            % (len(skipped), _indices(skipped)))
            return None
        if skipped and set(report["missing"]) <= set(skipped) and not bad:
            return self.failure(
                "samples-skipped", "generate-offline-data skipped %d of %d samples after their retries: %s"
                % (len(skipped), report["expected"], _indices(skipped)),
                "see `inv logs` (\"Skipping sample\"): `inv resume` retries exactly those; set allow_skipped: true "
                "under extract: in hosts.yaml to accept a run without them", False, evidence=_indices(skipped))
        described = "; ".join("%d %s (%s)" % (len(ix), status, _indices(ix))
                              for status, ix in sorted(dict(bad, missing=report["missing"]).items()) if ix)
        return self.failure("outputs-invalid", "generate-offline-data exited 0 but not every sample's file is "
                            "whole: %s" % described,
                            "a restart checks the files and regenerates the bad and missing ones", True,
                            evidence=described)

    # -- the outputs before an attempt ---------------------------------------------------------------

    def clean_outputs(self):
        """Delete every hs_*.safetensors of the output that is not ok, and empty the staging directory."""
        out = self.plan["out"]
        os.makedirs(out, exist_ok=True)
        # The files hold no metadata: what axis 1 of hidden_states is, beside them.
        atomic.write_json(os.path.join(out, LAYERS_FILE), {
            "layer_ids": self.plan["layer_ids"], "convention": self.plan["layer_convention"],
            "num_hidden_layers": self.plan["num_hidden_layers"], "hidden_size": self.plan["hidden_size"],
            "model": self.record["driver_args"].get("model"), "run_id": self.run.run_id})
        present = outputs.existing_indices(out)
        report = outputs.check_dataset(out, None, indices=present, n_layers=len(self.plan["layer_ids"]),
                                       hidden_size=self.plan["hidden_size"])
        deleted = sorted(report["files"])
        for index in deleted:
            os.unlink(os.path.join(out, outputs.file_name(index)))
        shutil.rmtree(self.plan["staging"], ignore_errors=True)
        os.makedirs(self.plan["staging"], exist_ok=True)
        if deleted:
            self.log_marker("deleted %d unusable file(s) to regenerate: %s" % (len(deleted), "; ".join(
                "hs_%d (%s: %s)" % (i, report["files"][i]["status"], report["files"][i]["detail"])
                for i in deleted[:10])))
        return {"kept": len(present) - len(deleted), "deleted": deleted}

    def finish(self, outcome):
        shutil.rmtree(self.plan["staging"], ignore_errors=True)
        outcome = dict(outcome, result=self.status.get("result"))
        self.heartbeat(phase=outcome["state"], server=None)
        return Supervisor.finish(self, outcome)


def _indices(indices, shown=20):
    text = ", ".join(str(i) for i in indices[:shown])
    return text + (" … (%d in all)" % len(indices) if len(indices) > shown else "")
