"""One arm run and timed (arm_phase.py names it and records it): specrig's (`inv extract`), by hand
(speculators' docs' server, prepare-data, generate-offline-data) or bare prefill (the same server without
extraction, max_tokens=1); the moments its server answered /health and its files appeared, and where its
profile window opens."""
import os
import shutil
import subprocess
import threading
import time

import arm_inputs
import arms
import harness

#: Files written before a profile window opens: past the client's start, in the steady part.
STEADY_FILES = 24


class FileWatch(threading.Thread):
    """When the first and the last hs_*.safetensors appeared in a directory (polled every 50 ms; the last is
    the latest moment their count grew)."""

    def __init__(self, directory):
        threading.Thread.__init__(self, daemon=True)
        self.directory, self.first, self.last, self.count, self.stopped = directory, None, None, 0, False

    def run(self):
        while not self.stopped:
            self.poll()
            time.sleep(0.05)

    def poll(self):
        try:
            count = sum(1 for n in os.listdir(self.directory) if n.startswith("hs_") and n.endswith(".safetensors"))
        except OSError:
            return
        if count > self.count:
            now = time.time()
            self.count, self.last = count, now
            self.first = self.first or now

    def finish(self):
        self.stopped = True
        if self.ident is not None:
            self.join(timeout=2)
        self.poll()


class HealthWatch(threading.Thread):
    """The moment the server on `port` first answers /health with 200 (polled every 0.1 s): the end of the
    server's start for every way alike, whatever specrig does meanwhile (it may start its client steps while
    the server loads)."""

    def __init__(self, port=None, timeout=900):
        threading.Thread.__init__(self, daemon=True)
        self.port, self.timeout, self.at, self.stopped = port or harness.PORT, timeout, None, False

    def run(self):
        if arms.wait_for_health(self.port, self.timeout, lambda: self.stopped):
            self.at = time.time()


def profile_when(window, trigger):
    """Start the arm's profile window (profiling.Window; None where the arm asked for none) once `trigger()`
    says the arm is in its steady part."""
    if window is not None:
        window.trigger = trigger
        window.start()


def arm_specrig(name, concurrency, settings, keep_for_states=0, window=None):
    """`settings` are more of inv extract's options, except `out`: the directory the arm's --out goes under
    instead of $SG/out. The value `ram` (for `out` or `staging`) is a directory under $RAM, a tmpfs, which
    takes the disk out of the measurement. `concurrency` None: specrig's own default (none passed).
    `keep_for_states`: that many of its files (spread over them) kept for a states phase; `window`: its profile
    window, if any."""
    settings = {key: os.path.join(harness.RAM, key) if value == "ram" else value for key, value in settings.items()}
    out_root = settings.pop("out", os.path.join(harness.SG, "out"))
    out = os.path.join(out_root, "arm-" + name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    files_seen, health = FileWatch(out), HealthWatch()
    files_seen.start()
    profile_when(window, lambda: len(harness.hs_files(out)) >= STEADY_FILES)
    phases = {}

    def note(beat, status):
        phase = beat.get("phase")
        if phase and phase not in phases:
            phases[phase] = time.time()

    started = time.time()
    health.start()
    launched = harness.inv(*harness.extract_args(out, harness.N_MEASURE, concurrency, settings=settings), timeout=600)
    info = launched["json"] or {}
    arm = {"way": arms.WAY_WORDS["specrig"], "concurrency": concurrency, "settings": settings, "out_root": out_root,
           "launch_exit": launched["exit"], "launch_s": launched["seconds"], "started_at": round(started, 2)}
    if not info.get("launched"):
        health.stopped = files_seen.stopped = True
        failed = [check["name"] for check in info.get("preflight") or [] if not check.get("ok")]
        arm.update(launch=launched, error="not launched (exit %s; preflight failed: %s)"
                   % (launched["exit"], ", ".join(failed) or "-"))
        return arm
    harness.RUNNING[name] = info["path"]
    beat, status, done = harness.wait_run(info["path"], lambda b, s: harness.run_state(info["path"]) in harness.FINAL,
                                          timeout=560, on_beat=note)
    ended = time.time()
    files_seen.finish()
    health.stopped = True
    files = harness.hs_files(out)
    ready = health.at or phases.get("preparing") or phases.get("generating")
    arm.update(state=harness.run_state(info["path"]), wall_s=round(ended - started, 2), samples=len(files),
               tokens=harness.tokens_in(files), server_ready_s=round(ready - started, 2) if ready else None,
               server_ready_from="/health" if health.at else "the run's phase after loading",
               first_sample_s=round(files_seen.first - started, 2) if files_seen.first else None,
               last_sample_s=round(files_seen.last - started, 2) if files_seen.last else None,
               phases_s={k: round(v - started, 2) for k, v in phases.items()}, run_id=info["run_id"],
               prompts=arm_inputs.output_prompts(files))
    if phases.get("generating") and phases.get("validating"):
        arm["generate_s"] = round(phases["validating"] - phases["generating"], 2)
    # The supervisor's start-up marks (epoch seconds; which way prepare-data rendered, or its cache): issue 35's
    # render server on a first run is judged by prepare-data's own time after /health.
    startup = status.get("startup") or {}
    arm["startup_s"] = {key: round(value - started, 2) if isinstance(value, float) else value
                        for key, value in startup.items() if key != "health_to_first_file_s"}
    if startup.get("health") and startup.get("prepare_ended"):
        arm["prepare_after_health_s"] = round(max(0.0, startup["prepare_ended"] - startup["health"]), 2)
    plan = (harness.read_json(os.path.join(info["path"], "run.json"), {}) or {}).get("server") or {}
    generate = plan.get("generate_argvs") or []
    given = [int(argv[argv.index("--concurrency") + 1]) for argv in generate if "--concurrency" in argv]
    arm.update(concurrency=sum(given) if given else concurrency, clients=len(generate) or None,
               layer_ids=plan.get("layer_ids"), server_argv=plan.get("server_argv"),
               generate_argvs=generate, prepare_argv=plan.get("prepare_argv"))
    harness.keep_run_files(name, info["path"])
    harness.RUNNING.pop(name, None)
    flag = arms.prefix_caching_flag(plan.get("server_argv"))
    arm["prefix_caching"] = {"flag": flag, "setting": arms.PREFIX_FLAGS.get(flag, "vLLM's default"),
                             "from": "the run's plan (server_argv)",
                             "server_log": arm_inputs.prefix_caching_logged(os.path.join(info["path"], "server.log"))}
    if plan.get("prepared") and arm_inputs.same_prepare(plan.get("prepare_argv")):
        arm["prepared_cached"] = arm_inputs.cache_prepared(plan["prepared"], arm_inputs.prepared_cache())
    if keep_for_states and files:
        arm["states_subset"] = harness.keep_states_subset(name, files, keep_for_states)
    shutil.rmtree(out, ignore_errors=True)
    return arm


def arm_by_hand(name, concurrency, bare=False, prefix=None, window=None):
    """The by-hand flow of speculators' docs (or, bare, the same server without the speculative and KV
    transfer configs and a plain max_tokens=1 client, with `prefix`'s prefix-caching flag, the extraction
    server's), on the same prompts. The bare arm reads them from the prepared-data cache; where it is empty,
    it prepares them itself against its own server once it is up, outside its measurement (the arm's times
    from then on are shifted back by it: `cache_fill_s`)."""
    work = os.path.join(harness.SG, "out", "arm-" + name)
    shutil.rmtree(work, ignore_errors=True)
    staging, hs_dir, prepared = (os.path.join(work, d) for d in ("staging", "hs", "prepared"))
    os.makedirs(hs_dir)
    os.makedirs(harness.EXTRAS, exist_ok=True)
    argv = arm_inputs.docs_server_argv(staging)
    if bare:
        argv = arm_inputs.bare_argv(argv, prefix)
    python = argv[0]
    flag = arms.prefix_caching_flag(argv)
    arm = {"way": arms.WAY_WORDS["bare" if bare else "hand"], "concurrency": concurrency, "server_argv": argv,
           "prefix_caching": dict(prefix or {}, flag=flag) if bare else {
               "flag": flag, "setting": arms.PREFIX_FLAGS.get(flag, "vLLM's default"),
               "from": "speculators' docs' server command (launch_vllm.py)"}}
    cache = arm_inputs.prepared_cache()
    arm["prepared_cache"] = {"key": cache["key"], "hit": cache["hit"]}
    files_seen = FileWatch(hs_dir)
    server_log = os.path.join(harness.EXTRAS, "arm-%s-server.log" % name)
    client = None
    out_json = os.path.join(work, "bare.json")
    started = time.time()
    arm["started_at"] = round(started, 2)
    server = harness.start_server(argv, server_log, cwd=work if os.path.isdir(work) else harness.SG)

    def start_bare_client():
        sending = out_json + ".sending"
        profile_when(window, lambda: os.path.exists(sending) and time.time() - os.path.getmtime(sending) > 1)
        with open(os.path.join(harness.EXTRAS, "arm-%s-client.log" % name), "ab") as client_log:
            return subprocess.Popen(arm_inputs.bare_client_argv(python, cache["dir"], concurrency, out_json),
                                    stdout=client_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work)

    try:
        if bare and cache["hit"]:
            client = start_bare_client()
        if not arms.wait_for_health(harness.PORT, 400, lambda ended=server.poll: ended() is not None):
            arm["error"] = "server not healthy (exit %s)" % server.poll()
            return arm
        ready = time.time()
        arm["server_ready_s"] = round(ready - started, 2)
        endpoint = "http://127.0.0.1:%d" % harness.PORT
        if bare:
            shift = 0.0
            if client is None:
                rc, out, err, shift = harness.run(arm_inputs.prepare_argv(python, prepared), timeout=300, cwd=work)
                arm.update(cache_fill_s=shift, cache_fill_exit=rc)
                if rc or not arm_inputs.cache_prepared(prepared, cache):
                    arm["error"] = "the bare arm could not prepare its prompts (exit %s): %s" % (
                        rc, (out + err)[-1500:])
                    return arm
                client = start_bare_client()
            try:
                rc = client.wait(timeout=560)
            except subprocess.TimeoutExpired:
                client.kill()
                rc = client.wait()
            got = harness.read_json(out_json, {}) or {}
            ended = time.time()

            def at(key):
                return round(got[key] - started - shift, 2) if got.get(key) else None

            if got.get("sending_at") and got["sending_at"] < ready:
                # the client saw the health first (it polls every 0.1 s): the server was up by then
                arm["server_ready_s"] = round(got["sending_at"] - started, 2)

            arm.update(client_exit=rc, samples=got.get("samples"), tokens=got.get("tokens"),
                       errors=got.get("error_count"), first_sample_s=at("first_response_at"),
                       last_sample_s=at("last_response_at"), sending_s=at("sending_at"), generate_s=got.get("wall_s"),
                       wall_s=round(ended - started - shift, 2), prompts=got.get("prompts"))
            if rc:
                arm["client_error"] = open(os.path.join(harness.EXTRAS, "arm-%s-client.log" % name)).read()[-1500:]
            if shift:
                arm["times_shifted_by_s"] = shift  # the cache fill, taken out of every time after the health
            return arm
        rc, out, err, prep_s = harness.run(arm_inputs.prepare_argv(python, prepared), timeout=300, cwd=work)
        arm.update(prepare_exit=rc, prepare_s=prep_s)
        if rc:
            arm["prepare_error"] = (out + err)[-2000:]
            return arm
        files_seen.start()
        profile_when(window, lambda: len(harness.hs_files(hs_dir)) >= STEADY_FILES)
        rc, out, err, gen_s = harness.run([python, "-m", "speculators", "generate-offline-data", "--model",
                                           harness.MODEL, "--endpoint", endpoint + "/v1", "--preprocessed-data", prepared,
                                           "--output", hs_dir, "--concurrency", str(concurrency),
                                           "--max-samples", str(harness.N_MEASURE)], timeout=560, cwd=work)
        ended = time.time()
        files_seen.finish()
        with open(os.path.join(harness.EXTRAS, "arm-%s-client.log" % name), "w") as f:
            f.write((out + err)[-20000:])
        files = harness.hs_files(hs_dir)
        arm.update(generate_exit=rc, generate_s=gen_s, samples=len(files), tokens=harness.tokens_in(files),
                   first_sample_s=round(files_seen.first - started, 2) if files_seen.first else None,
                   last_sample_s=round(files_seen.last - started, 2) if files_seen.last else None,
                   wall_s=round(ended - started, 2), prompts=arm_inputs.output_prompts(files))
        arm["prepared_cached"] = arm_inputs.cache_prepared(prepared, cache)
        return arm
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        files_seen.stopped = True
        harness.end_group(server)
        # The wall time ends once the server is stopped, as specrig's run ends after stopping its server.
        if "wall_s" in arm:
            arm["client_done_s"] = arm["wall_s"]
            arm["wall_s"] = round(time.time() - started - arm.get("times_shifted_by_s", 0), 2)
        arm["prefix_caching"]["server_log"] = arm_inputs.prefix_caching_logged(server_log)
        shutil.rmtree(hs_dir, ignore_errors=True)
