"""Issue 35's cells that only a GPU shows (point 5): a fault injected into a process of a supervised run in the
middle of its samples, what specrig's supervisor made of it, timed from the fault, and the run's recovery: its
files and (states:fault) their states. device_run.py hands any phase named fault:... here (`run(harness,
phase)`, harness: harness.py, its inv, record, wait_run, ...); the extract phase (extract_phase.py) injects its kill -9
of the EngineCore with `inject` too.

    fault:INJECTION[+INJECTION...][:KEY=VALUE,...]
        INJECTION  SIGNAL-PROCESS@SAMPLES: SIGNAL sent to PROCESS of the run once SAMPLES of its files are
                   written while it generates; a later injection waits for an attempt after the one before
          SIGNAL   stop: SIGSTOP, a hang (alive, holding its memory, no progress: an NCCL hang on a PCIe host
                   looks exactly like this); kill: SIGKILL
          PROCESS  engine-core: vLLM's EngineCore, the process under the run's server job titled
                   VLLM::EngineCore; api-server: vLLM's API server, the EngineCore's parent
        KEY=VALUE  more of inv extract's options, as an arm's (enforce_eager=1, render_server=1, ...), and
                   patch=1 (inv apply-patches --host local first, as the five steps do) or patch=0

    e.g. fault:stop-engine-core@64+kill-api-server@160:enforce_eager=1, over N_FAULT samples (default 256)

Each injection is watched until the run went on (an attempt after the injected one began, or the run ended)
or for FAULT_WATCH_S (default 120): the seconds from the fault to each supervisor marker in driver.log
(`[specrig-supervisor ...]`), to each state of status.json (stalled, restarting, ...), to the injected
attempt's end (its failure as classified) and to the next attempt. A process still SIGSTOPped when the watch
runs out is let go by the harness (SIGCONT, then SIGKILL: `released_s`, so that the run and the call go on),
and at the phase's end whatever happens, the budget's end included. Then the run's end: every sample written
once, the files written before each fault unchanged, STATES_FILES of them kept for `states:fault`.
"""
import os
import re
import shutil
import signal
import time

import arms

#: The run's samples and the watch after each fault, where N_FAULT and FAULT_WATCH_S (read when the phase runs:
#: a preset may set them) do not say.
N_FAULT, WATCH_S = 256, 120.0
SIGNALS = {"stop": signal.SIGSTOP, "kill": signal.SIGKILL}
INJECTION = re.compile(r"^(stop|kill)-(engine-core|api-server)@(\d+)$")
#: vLLM's title for its engine process (setproctitle; /proc's comm keeps its first 15 characters).
ENGINE_CORE_TITLE = "VLLM::EngineCore"
#: A line the supervisor writes into driver.log (remote/run/supervisor_loop.py log_marker).
MARKER = re.compile(r"^\[specrig-supervisor [^\]]*\] (.*)$")
POLL_S = 0.2
#: The processes this harness SIGSTOPped and has not let go: {pid: its start time}, so that a pid reused
#: since is never signalled.
STOPPED = {}


def parse(spec):
    """fault:INJECTION[+...][:K=V,...] -> (injections [{signal, process, at}], inv extract's options, patch)."""
    parts = spec.split(":", 2)
    if parts[0] != "fault" or len(parts) < 2 or not parts[1]:
        raise arms.SpecError("%r: expected fault:SIGNAL-PROCESS@SAMPLES[+...][:KEY=VALUE,...]" % spec)
    injections = []
    for word in parts[1].split("+"):
        found = INJECTION.match(word)
        if not found:
            raise arms.SpecError("%r: %r is not SIGNAL-PROCESS@SAMPLES (SIGNAL stop or kill, PROCESS engine-core or "
                                 "api-server)" % (spec, word))
        injections.append({"signal": found[1], "process": found[2], "at": int(found[3])})
    if [i["at"] for i in injections] != sorted({i["at"] for i in injections}):
        raise arms.SpecError("%r: each injection after more samples than the one before" % spec)
    options = arms.parse_options(spec, parts[2] if len(parts) > 2 else "")
    patch = options.pop("patch", None)
    if patch not in (None, "0", "1"):
        raise arms.SpecError("%r: patch=%s: 1 (inv apply-patches first) or 0 (inv revert-patches)" % (spec, patch))
    return injections, options, patch


def label(spec):
    """The cell's name: fault-<injections>[-KEY=VALUE...] (sorted), a file name too."""
    parts = spec.split(":", 2)
    options = arms.parse_options(spec, parts[2] if len(parts) > 2 else "")
    return "-".join(["fault", parts[1]] + ["%s=%s" % item for item in sorted(options.items())]).replace("/", "_")


# -- the processes -------------------------------------------------------------------------------------

def start_time(pid):
    """The process's start time in clock ticks (/proc/PID/stat field 22), or None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def descendants(table, root):
    children = {}
    for pid, (ppid, _sid, _comm, _cmd) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(found)


def titled_engine_core(comm, cmd):
    return comm == ENGINE_CORE_TITLE[:15] or cmd.startswith(ENGINE_CORE_TITLE)


def find(table, server_job, process):
    """The pids of `process` (engine-core or api-server) under the run's server job (its pid), from `table`
    (harness.proc_table): the EngineCores by their title; the API server is their parent (the job's
    process itself where vLLM runs no wrapper), the job's process where no EngineCore is found."""
    if server_job not in table:
        return []
    cores = [pid for pid in descendants(table, server_job) if titled_engine_core(table[pid][2], table[pid][3])]
    if process == "engine-core":
        return cores
    return sorted({table[pid][0] for pid in cores}) or [server_job]


def release():
    """SIGCONT, then SIGKILL, to every process this harness SIGSTOPped that is still the same process: the pids."""
    released = []
    for pid, started in list(STOPPED.items()):
        if start_time(pid) == started:
            for sent in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sent)
                except ProcessLookupError:
                    break
            released.append(pid)
        STOPPED.pop(pid)
    return released


# -- one injection and what came of it -------------------------------------------------------------------

def identities(paths):
    return {os.path.basename(path): (os.stat(path).st_ino, os.stat(path).st_mtime_ns) for path in paths}


def unchanged(out, before):
    """How many of the files `before` (identities) are still there, the same file unchanged."""
    return sum(1 for name, ident in before.items()
               if os.path.exists(os.path.join(out, name)) and identities([os.path.join(out, name)])[name] == ident)


def inject(h, run_path, out, injection, after_attempt=0, timeout=420, before=None):
    """Send `injection`'s signal to its process once the run generates with `at` files in an attempt after
    `after_attempt` (`before()` runs first: a capture under load). (its record, the identities of the files
    then); the record's `at_epoch` is None where nothing was sent (the run ended first, no such process)."""
    generating = h.remote_module("base.contract").PHASE_GENERATING

    def reached(beat, status):
        attempts = status.get("attempts") or []
        return h.run_state(run_path) in h.FINAL or (
            len(attempts) > after_attempt and beat.get("phase") == generating
            and (beat.get("samples_done") or 0) >= injection["at"])

    beat, status, ok = h.wait_run(run_path, reached, timeout)
    if before:
        before()
    table = h.proc_table()
    job = ((status.get("jobs") or {}).get("server") or {}).get("pid")
    pids = find(table, job, injection["process"])
    kept = identities(h.hs_files(out))
    record = dict(injection, at_epoch=None, attempt=len(status.get("attempts") or []), server_job=job, pids=pids,
                  processes={str(pid): {"ppid": table[pid][0], "title": table[pid][3][:160]} for pid in pids},
                  samples_done_before=beat.get("samples_done"), files_before=len(kept),
                  memory_before_mib=h.memory_used(),
                  # specrig's own telemetry of the run (the supervisor's status): which processes hold the GPU
                  telemetry={"gpus": status.get("gpus"), "gpu_apps": status.get("gpu_apps")},
                  driver_log_offset=os.path.getsize(os.path.join(run_path, "driver.log"))
                  if os.path.exists(os.path.join(run_path, "driver.log")) else 0)
    if not ok or not pids or h.run_state(run_path) in h.FINAL:
        record["skipped"] = "no %s found under the server job %s, or the run ended or did not reach %d samples " \
                            "(state %s)" % (injection["process"], job, injection["at"], h.run_state(run_path))
        h.log(record["skipped"])
        return record, kept
    record["at_epoch"] = time.time()
    for pid in pids:
        if injection["signal"] == "stop":
            STOPPED[pid] = start_time(pid)
        os.kill(pid, SIGNALS[injection["signal"]])
    h.log("%s %s %s at %s samples" % (injection["signal"], injection["process"], pids, beat.get("samples_done")))
    return record, kept


def new_markers(path, offset):
    """The supervisor's markers in driver.log past byte `offset`, and the offset after the last whole line."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return [], offset
    whole = text[:text.rfind("\n") + 1]
    return [found[1] for found in map(MARKER.match, whole.splitlines()) if found], offset + len(whole.encode())


def watch(h, run_path, record, watch_s=None):
    """After the fault: the supervisor's markers and the run's states, in seconds from it, until the run went on
    (an attempt after the injected one, or its end) or for `watch_s`; a process still SIGSTOPped then is let go
    (release) and the run watched as long again. Fills record["reaction"]."""
    watch_s = float(os.environ.get("FAULT_WATCH_S", WATCH_S)) if watch_s is None else watch_s
    t0, attempt = record["at_epoch"], record["attempt"]
    markers, states, reaction = [], [], {"watched_s": None}
    offset, last, deadline = record["driver_log_offset"], None, record["at_epoch"] + watch_s
    while True:
        since = round(time.time() - t0, 2)
        status = h.read_json(os.path.join(run_path, "status.json"), {}) or {}
        state = h.run_state(run_path)
        if state != last:
            states.append([since, state])
            last = state
        if state == "stalled":
            reaction.setdefault("stalled_s", since)
        found, offset = new_markers(os.path.join(run_path, "driver.log"), offset)
        markers += [[since, text] for text in found]
        attempts = status.get("attempts") or []
        hit = attempts[attempt - 1] if 0 < attempt <= len(attempts) else {}
        if hit.get("ended_at") and "attempt_ended_s" not in reaction:
            failure = hit.get("failure") or {}
            reaction.update(attempt_ended_s=since, failure={key: failure.get(key) for key in (
                "kind", "rule", "retryable", "restarted", "explain", "evidence")})
        if len(attempts) > attempt or state in h.FINAL:
            reaction["went_on_s"] = since
            break
        if time.time() >= deadline:
            released = release()
            if not released:
                break
            reaction["released_s"], reaction["released_pids"] = since, released
            h.log("not gone on %.0f s after the fault: let go of %s (SIGCONT, SIGKILL)" % (since, released))
            deadline = time.time() + watch_s
        time.sleep(POLL_S)
    reaction["watched_s"] = round(time.time() - t0, 2)
    released_at = reaction.get("released_s")
    called = [reaction.get(key) for key in ("stalled_s", "attempt_ended_s") if reaction.get(key) is not None
              and (released_at is None or reaction[key] <= released_at)]
    # Seen by the supervisor itself: stalled or the attempt ended, before the harness let the process go.
    reaction.update(detected_s=min(called) if called else None, first_marker_s=markers[0][0] if markers else None,
                    markers=markers[:20], states=states)
    record["reaction"] = reaction
    h.log("reaction: %s" % {k: reaction.get(k) for k in ("first_marker_s", "stalled_s", "attempt_ended_s",
                                                         "went_on_s", "released_s", "detected_s")})
    return reaction


# -- the phase ------------------------------------------------------------------------------------------

def sample_indices(paths):
    return sorted(int(re.findall(r"\d+", os.path.basename(path))[0]) for path in paths)


def end_wait_s(h):
    """How long the run's end may be waited for: the budget less a states check and a stop, else 900 s."""
    left = h.budget_left()
    return 900 if left is None else max(30, left - arms.PHASE_MIN_S["states"] - 30)


def run(h, phase):
    injections, options, patch = parse(phase)
    samples = int(os.environ.get("N_FAULT", N_FAULT))
    name = arms.unique(label(phase), h.results.get("faults") or {})
    entry = {"spec": phase, "samples": samples, "options": options,
             "watch_s": float(os.environ.get("FAULT_WATCH_S", WATCH_S)), "injections": []}
    h.results.setdefault("faults", {})[name] = entry
    if patch:
        entry["patching"] = h.patch_client("apply" if patch == "1" else "revert")
    out = os.path.join(h.SG, "out", name)
    shutil.rmtree(out, ignore_errors=True)
    entry["waited_for_idle_s"], entry["waited_for_port_s"] = h.wait_idle(), h.wait_port_free()
    h.save()
    previous = signal.getsignal(signal.SIGTERM)

    def release_then_end(signum, frame):  # the budget's end (device.sh's timeout) leaves nothing stopped
        release()
        if callable(previous):
            previous(signum, frame)
        raise SystemExit(124)

    signal.signal(signal.SIGTERM, release_then_end)
    started = time.time()
    try:
        launched = h.inv(*h.extract_args(out, samples, settings=options), timeout=600)
        info = launched["json"] or {}
        entry.update(launch_exit=launched["exit"], launch_s=launched["seconds"])
        if not info.get("launched"):
            entry["error"] = "not launched (exit %s): %s" % (launched["exit"], (launched["stderr_tail"] or "")[-1500:])
            return
        run_path = entry["run_path"] = info["path"]
        entry["run_id"] = info["run_id"]
        h.RUNNING[name] = run_path
        after, kept = 0, []
        for injection in injections:
            record, before = inject(h, run_path, out, injection, after_attempt=after)
            entry["injections"].append(record)
            kept.append(before)
            h.save()
            if record["at_epoch"] is None:
                break
            watch(h, run_path, record, entry["watch_s"])
            after = record["attempt"]
            h.save()
        beat, status, done = h.wait_run(run_path, lambda b, s: h.run_state(run_path) in h.FINAL, end_wait_s(h))
        if not done:
            entry["stop"] = h.inv("stop", "--host", "local", "--run", info["run_id"], "--json", timeout=300)
    finally:
        entry["released_at_end"] = release()
        signal.signal(signal.SIGTERM, previous)
        h.save()
    files = h.hs_files(out)
    indices = sample_indices(files)
    for record, before in zip(entry["injections"], kept, strict=True):
        record["files_before_kept"] = unchanged(out, before)
    attempts = status.get("attempts") or []
    plan = (h.read_json(os.path.join(run_path, "run.json"), {}) or {}).get("server") or {}
    entry.update(
        state=h.run_state(run_path), wall_s=round(time.time() - started, 1), files=len(files),
        tokens=h.tokens_in(files), every_sample_once=indices == list(range(samples)),
        missing=sorted(set(range(samples)) - set(indices))[:20],
        attempts=[{key: attempt.get(key) for key in ("attempt", "started_at", "ended_at", "exit_status")}
                  | {"failure": {key: (attempt.get("failure") or {}).get(key) for key in (
                      "kind", "rule", "retryable", "restarted", "explain")} if attempt.get("failure") else None}
                  for attempt in attempts],
        exit=h.read_json(os.path.join(run_path, "exit.json")), layer_ids=plan.get("layer_ids"))
    h.keep_run_files(name, run_path)
    h.RUNNING.pop(name, None)
    if files:
        entry["states_subset"] = h.keep_states_subset(name, files)
    h.save()
    shutil.rmtree(out, ignore_errors=True)
    h.log("%s: %s, %d files, every sample once %s, attempts %d" % (name, entry["state"], len(files),
                                                                   entry["every_sample_once"], len(attempts)))


# -- the committed summary (summarize.py) ------------------------------------------------------------------

#: Issue 35 (point 4): the render server on a first run, from /health to the last file, against bare prefill.
RENDER_GOAL = 0.80


def summary(raw, rows):
    """Issue 35's cells in a results file: each fault cell (what was hit, the seconds to the supervisor's
    reaction, the recovery), and the render server's first run against bare prefill (summarize.table's
    `rows`: tokens/s from /health to the last file, the goal, PASS or MISS, prepare-data's time after /health)."""
    cells = {}
    for name, cell in (raw.get("faults") or {}).items():
        cells[name] = {key: cell.get(key) for key in ("spec", "samples", "options", "watch_s", "run_id", "state",
                                                       "files", "every_sample_once", "missing", "attempts", "error")}
        cells[name]["recovered"] = cell.get("state") == "succeeded" and bool(cell.get("every_sample_once")) and all(
            i.get("files_before_kept") == i.get("files_before") for i in cell.get("injections") or [])
        cells[name]["injections"] = [
            {key: i.get(key) for key in ("signal", "process", "at", "pids", "processes", "samples_done_before",
                                         "files_before", "files_before_kept", "skipped")}
            | {"reaction": {key: (i.get("reaction") or {}).get(key) for key in (
                "first_marker_s", "stalled_s", "attempt_ended_s", "detected_s", "went_on_s", "released_s", "failure",
                "markers", "states")}}
            for i in cell.get("injections") or []]
    first_runs = [row for row in rows if row["way_id"] == "specrig" and not row.get("error")
                  and str((row.get("settings_nondefault") or {}).get("render_server")) == "1"
                  and str((row.get("settings_nondefault") or {}).get("prepared_cache")) == "0"]
    bare = [row for row in rows if row["way_id"] == "bare" and row.get("tokens_per_s_to_last_file")]
    render = []
    for row in first_runs:
        same = [b for b in bare if (b.get("prompts") or {}).get("sha256") == (row.get("prompts") or {}).get("sha256")
                and b["shape"] == row["shape"]]
        other = max(same, key=lambda b: b["tokens_per_s_to_last_file"], default=None)
        value = round(row["tokens_per_s_to_last_file"] / other["tokens_per_s_to_last_file"], 4) \
            if other and row.get("tokens_per_s_to_last_file") else None
        render.append({"arm": row["arm"], "bare": (other or {}).get("arm"), "value": value, "goal": RENDER_GOAL,
                       "verdict": "NOT MEASURED" if value is None else "PASS" if value >= RENDER_GOAL else "MISS",
                       "health_to_last_file_s": [row.get("health_to_last_file_s"),
                                                 (other or {}).get("health_to_last_file_s")],
                       "prepare_after_health_s": row.get("prepare_after_health_s"),
                       "startup_s": row.get("startup_s")})
    return {"faults": cells, "render_server_first_run": render}


def summary_lines(block):
    """summary()'s block as markdown lines."""
    lines = []
    for name, cell in block["faults"].items():
        lines += ["", "%s: %s, %s files of %s, every sample once %s, recovered %s" % (
            name, cell["state"], cell["files"], cell["samples"], cell["every_sample_once"], cell["recovered"])]
        for i in cell["injections"]:
            reaction = i["reaction"]
            lines.append("- %s %s %s at %s samples: first marker %s s, stalled %s s, attempt ended %s s (%s), "
                         "detected %s s, went on %s s, let go by the harness %s s" % (
                             i["signal"], i["process"], i["pids"], i["samples_done_before"],
                             reaction["first_marker_s"], reaction["stalled_s"], reaction["attempt_ended_s"],
                             (reaction["failure"] or {}).get("kind"), reaction["detected_s"], reaction["went_on_s"],
                             reaction["released_s"]))
    for goal in block["render_server_first_run"]:
        lines += ["", "render server, first run: %s of bare prefill's tokens/s from /health to the last file (goal "
                  ">= %s): **%s** (%s against %s; prepare-data after /health %s s)" % (
                      goal["value"], goal["goal"], goal["verdict"], goal["arm"], goal["bare"],
                      goal["prepare_after_health_s"])]
    return lines
