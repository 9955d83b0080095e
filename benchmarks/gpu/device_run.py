"""The GPU run of issue 19, on the device: specrig's own tasks (`inv ... --host local`) driving vLLM 0.26.0
and speculators 0.9.0 in server mode on a random-weight model, checked and measured.

    python3 benchmarks/gpu/device_run.py PHASE [PHASE ...]      (benchmarks/gpu/device.sh sets the env)

Phases (each adds to one results file, $SG/results.json, copied to $OUT after every step so that a call
cut short still brings back what it did):

    prep            nvidia-smi at idle; the model (SHAPE, default llama8b) and the chat data built here
    extract         inv doctor; inv extract (preflight, launch) over N_EXTRACT samples; kill -9 of the
                    EngineCore mid-run; the supervisor's classification, restart and resume; GPU memory
                    sampled throughout; every stored layer against transformers' forward
    stop            inv extract, then inv stop mid-run: clean, seconds, GPU memory after
    arm:NAME[:C[:K=V,...]]
                    one arm of the measurement over N_MEASURE samples: specrig (inv extract, concurrency
                    C, and its options K=V: writer_threads=16, staging=ram, ...; out=DIR puts its
                    --out under DIR; `ram` is a directory on the tmpfs $RAM), hand (the server,
                    prepare-data, generate-offline-data as speculators' docs say),
                    bare (the same server without the speculative config, max_tokens=1: the ceiling)
                    Any arm takes `profile=1`: a window of its steady part profiled (profiling.py)
    smoke           inv smoke on a DeepSeek-V3-shaped config (MLA, MoE), shrunk, dummy weights

Environment: SG (default /var/tmp/sg: model, data, outputs), OUT (what comes back), SHAPE, N_EXTRACT
(256), N_MEASURE (768), N_DATA (1024), KILL_AT (samples done before the kill, 64), PORT (8000), RAM
(/dev/shm/sg).
"""
import glob
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
import urllib.request

import profiling

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
    """`inv extract` on --host local; `settings`: more of its options, {"writer_threads": 16, ...}."""
    args = ["extract", "--host", "local", "--model", MODEL, "--data", DATA, "--out", out,
            "--max-len", "2048", "--max-samples", str(n), "--port", str(port), "--json"]
    if concurrency:
        args += ["--concurrency", str(concurrency)]
    for key, value in (settings or {}).items():
        args += ["--" + key.replace("_", "-"), str(value)]
    return args


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
    beat, status, reached = wait_run(run_path, lambda b, s: (b.get("samples_done") or 0) >= KILL_AT
                                     or run_state(run_path) in FINAL, timeout=420)
    capture("load")
    record_server = status.get("jobs", {}).get("server") or {}
    session = record_server.get("pgid")
    cores = engine_cores(session) or engine_cores()
    kept = {os.path.basename(p): (os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in hs_files(out)}
    kill = {"samples_done_before": beat.get("samples_done"), "server_session": session, "engine_cores": cores,
            "files_before": len(kept), "memory_before_mib": memory_used(),
            # specrig's own telemetry of the run (the supervisor's status): which processes hold the GPU
            "telemetry": {"gpus": status.get("gpus"), "gpu_apps": status.get("gpu_apps"),
                          "processes": {str(pid): proc_table().get(pid, (None, None, None, ""))[3][:120]
                                        for pid in [a.get("pid") for a in status.get("gpu_apps") or []]}}}
    if reached and cores and run_state(run_path) not in FINAL:
        kill["at"] = time.time()
        for pid in cores:
            os.kill(pid, signal.SIGKILL)
        log("kill -9 EngineCore %s at %d samples" % (cores, beat.get("samples_done") or 0))
    else:
        kill["skipped"] = "no EngineCore found or the run ended first (state %s)" % run_state(run_path)
        log(kill["skipped"])
    entry["kill"] = kill
    save()
    beat, status, done = wait_run(run_path, lambda b, s: run_state(run_path) in FINAL, timeout=900)
    ended_at = time.time()
    sampler.stopped = True
    capture("after")
    final = inv("status", "--host", "local", "--run", run_id, "--json", timeout=120)
    files = hs_files(out)
    survivors = {name: ident for name, ident in kept.items()
                 if os.path.exists(os.path.join(out, name)) and
                 (os.stat(os.path.join(out, name)).st_ino, os.stat(os.path.join(out, name)).st_mtime_ns) == ident}
    attempts = status.get("attempts") or []
    restart_at = None
    if len(attempts) > 1:
        restart_at = attempts[1].get("started_at")
    memory_back = None
    if kill.get("at"):
        for t, used, _pids in sampler.samples:
            if t > kill["at"] and used is not None and idle and used <= idle[0] + 1024:
                memory_back = t
                break
    entry.update(
        state=run_state(run_path), wall_s=round(ended_at - started, 1), files=len(files),
        tokens=tokens_in(files), attempts=attempts, exit=read_json(os.path.join(run_path, "exit.json")),
        status_task=final, files_before_kill_kept=len(survivors), files_before_kill=len(kept),
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


class FirstFile(threading.Thread):
    """The moment the first hs_*.safetensors appears in a directory."""

    def __init__(self, directory):
        threading.Thread.__init__(self, daemon=True)
        self.directory, self.at, self.stopped = directory, None, False

    def run(self):
        while not self.stopped and self.at is None:
            try:
                if any(n.startswith("hs_") for n in os.listdir(self.directory)):
                    self.at = time.time()
            except OSError:
                pass
            time.sleep(0.05)


def wait_health(port, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as answer:
                if answer.status == 200:
                    return True
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.25)
    return False


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


def arm_specrig(name, concurrency, settings):
    """`settings` are more of inv extract's options, except `out`: the directory the arm's --out goes under
    instead of $SG/out. The value `ram` (for `out` or `staging`) is a directory under $RAM, a tmpfs, which
    takes the disk out of the measurement."""
    settings = {key: os.path.join(RAM, key) if value == "ram" else value for key, value in settings.items()}
    out_root = settings.pop("out", os.path.join(SG, "out"))
    out = os.path.join(out_root, "arm-" + name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    first = FirstFile(out)
    first.start()
    profile_when(lambda: len(hs_files(out)) >= STEADY_FILES)
    phases = {}

    def note(beat, status):
        phase = beat.get("phase")
        if phase and phase not in phases:
            phases[phase] = time.time()

    started = time.time()
    launched = inv(*extract_args(out, N_MEASURE, concurrency, settings=settings), timeout=600)
    info = launched["json"] or {}
    arm = {"way": "specrig extract", "concurrency": concurrency or 32, "settings": settings, "out_root": out_root,
           "launch_exit": launched["exit"]}
    if not info.get("launched"):
        failed = [check["name"] for check in info.get("preflight") or [] if not check.get("ok")]
        arm.update(launch=launched, error="not launched (exit %s; preflight failed: %s)"
                   % (launched["exit"], ", ".join(failed) or "-"))
        return arm
    beat, status, done = wait_run(info["path"], lambda b, s: run_state(info["path"]) in FINAL, timeout=560,
                                  on_beat=note)
    ended = time.time()
    first.stopped = True
    files = hs_files(out)
    ready = phases.get("preparing") or phases.get("generating")
    arm.update(state=run_state(info["path"]), wall_s=round(ended - started, 2), samples=len(files),
               tokens=tokens_in(files), first_sample_s=round(first.at - started, 2) if first.at else None,
               server_ready_s=round(ready - started, 2) if ready else None,
               phases_s={k: round(v - started, 2) for k, v in phases.items()}, run_id=info["run_id"])
    if phases.get("generating") and phases.get("validating"):
        arm["generate_s"] = round(phases["validating"] - phases["generating"], 2)
    for log_name in ("driver.log", "server.log"):
        path = os.path.join(info["path"], log_name)
        if os.path.exists(path):
            shutil.copy(path, os.path.join(EXTRAS, "arm-%s-%s" % (name, log_name)))
    shutil.rmtree(out, ignore_errors=True)
    return arm


def docs_server_argv(staging):
    """The server command of speculators' docs (scripts/launch_vllm.py, its defaults) for this arm's model:
    built by specrig's reading of that script (remote/run/server/launch.py), so that the layer ids follow
    the shape (another shape's ids pass vLLM 0.26.0's start-up and kill its EngineCore at the first request)."""
    sys.path.insert(0, os.path.join(TREE, "remote", "run", "server"))
    import launch  # standard library only, like all of remote/
    return launch.server_argv({"model": MODEL, "model_config": launch.read_model_config(MODEL),
                               "hidden_states_path": staging, "port": PORT, "host": "127.0.0.1",
                               "python": sys.executable})


def arm_by_hand(name, concurrency, bare=False):
    """The by-hand flow of speculators' docs (or, bare, the same server without the speculative and KV
    transfer configs and a plain max_tokens=1 client), on the same prompts."""
    work = os.path.join(SG, "out", "arm-" + name)
    shutil.rmtree(work, ignore_errors=True)
    staging, hs_dir, prepared = (os.path.join(work, d) for d in ("staging", "hs", "prepared"))
    os.makedirs(hs_dir)
    argv = docs_server_argv(staging)
    if bare:
        for flag in ("--speculative_config", "--kv_transfer_config"):
            i = argv.index(flag)
            del argv[i:i + 2]
    python = argv[0]
    arm = {"way": "bare prefill (no extraction, max_tokens=1)" if bare else "by hand (speculators' docs)",
           "concurrency": concurrency, "server_argv": argv}
    first = FirstFile(hs_dir)
    started = time.time()
    with open(os.path.join(EXTRAS, "arm-%s-server.log" % name), "ab") as server_log:
        server = subprocess.Popen(argv, stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True, cwd=work if os.path.isdir(work) else SG)
    try:
        if not wait_health(PORT, server, 400):
            arm["error"] = "server not healthy (exit %s)" % server.poll()
            return arm
        ready = time.time()
        arm["server_ready_s"] = round(ready - started, 2)
        shared_prepared = os.path.join(SG, "prepared-%s-%d" % (SHAPE, N_MEASURE))
        endpoint = "http://127.0.0.1:%d" % PORT
        if bare:
            if not os.path.isdir(shared_prepared):
                arm["error"] = "no prepared data from the by-hand arm"
                return arm
            sending = os.path.join(work, "bare.json.sending")
            profile_when(lambda: os.path.exists(sending) and time.time() - os.path.getmtime(sending) > 1)
            rc, out, err, seconds = run([python, os.path.join(HERE, "gpu_tools.py"), "bare-client", shared_prepared,
                                         str(PORT), MODEL, str(concurrency), str(N_MEASURE),
                                         os.path.join(work, "bare.json")], timeout=560)
            got = read_json(os.path.join(work, "bare.json"), {}) or {}
            ended = time.time()
            arm.update(client_exit=rc, client_error=err[-1500:] if rc else None, samples=got.get("samples"),
                       tokens=got.get("tokens"), errors=got.get("error_count"),
                       first_sample_s=round(ready - started + got["first_response_s"], 2)
                       if got.get("first_response_s") is not None else None,
                       generate_s=got.get("wall_s"), wall_s=round(ended - started, 2))
            return arm
        rc, out, err, prep_s = run([python, "-m", "speculators", "prepare-data", "--model", MODEL, "--data", DATA,
                                    "--render-endpoint", endpoint, "--output", prepared, "--seq-length", "2048",
                                    "--max-samples", str(N_MEASURE)], timeout=300, cwd=work)
        arm.update(prepare_exit=rc, prepare_s=prep_s)
        if rc:
            arm["prepare_error"] = (out + err)[-2000:]
            return arm
        first.start()
        profile_when(lambda: len(hs_files(hs_dir)) >= STEADY_FILES)
        rc, out, err, gen_s = run([python, "-m", "speculators", "generate-offline-data", "--model", MODEL,
                                   "--endpoint", endpoint + "/v1", "--preprocessed-data", prepared,
                                   "--output", hs_dir, "--concurrency", str(concurrency),
                                   "--max-samples", str(N_MEASURE)], timeout=560, cwd=work)
        ended = time.time()
        first.stopped = True
        with open(os.path.join(EXTRAS, "arm-%s-client.log" % name), "w") as f:
            f.write((out + err)[-20000:])
        files = hs_files(hs_dir)
        arm.update(generate_exit=rc, generate_s=gen_s, samples=len(files), tokens=tokens_in(files),
                   first_sample_s=round(first.at - started, 2) if first.at else None, wall_s=round(ended - started, 2))
        if not os.path.isdir(shared_prepared):
            shutil.copytree(prepared, shared_prepared)
        return arm
    finally:
        end_group(server)
        # The wall time ends once the server is stopped, as specrig's run ends after stopping its server.
        if "wall_s" in arm:
            arm["client_done_s"], arm["wall_s"] = arm["wall_s"], round(time.time() - started, 2)
        shutil.rmtree(hs_dir, ignore_errors=True)


def phase_arm(spec):
    """arm:NAME[:C[:KEY=VALUE,...]]: KEY=VALUE are more of inv extract's options (specrig arms only)."""
    parts = spec.split(":")
    name, concurrency = parts[1], int(parts[2]) if len(parts) > 2 else 32
    settings = dict(item.split("=", 1) for item in parts[3].split(",")) if len(parts) > 3 else {}
    profiled = settings.pop("profile", None) is not None
    label = "%s-c%d" % (name, concurrency) + "".join("-%s=%s" % item for item in settings.items()) + (
        "" if SHAPE == MAIN_SHAPE else "-" + SHAPE)
    waited, port_waited = wait_idle(), wait_port_free()
    log("arm %s: %d samples (waited %s s for the GPU's memory, %s s for the port)"
        % (label, N_MEASURE, waited, port_waited))
    global window
    if profiled:
        label += "-profiled"
        window = profiling.Window(os.path.join(EXTRAS, "profile-" + label), trigger=None)
        saved_env = dict(os.environ)
        os.environ.update(profiling.enable(os.environ, window.directory))
    try:
        if name == "specrig":
            arm = arm_specrig(label, concurrency, settings)
        elif name in ("hand", "bare"):
            arm = arm_by_hand(label, concurrency, bare=name == "bare")
        else:
            raise SystemExit("unknown arm %r" % name)
    finally:
        if profiled:
            os.environ.clear()
            os.environ.update(saved_env)
    if profiled:
        if window.ident is not None:
            window.join(timeout=60)
        arm["profile"] = window.result
        window = None
    for key, value in (("tokens_per_s", "tokens"), ("samples_per_s", "samples")):
        gen = arm.get("wall_s")
        if arm.get(value) and gen:
            arm[key] = round(arm[value] / gen, 2)
    if arm.get("generate_s") and arm.get("tokens"):
        arm["tokens_per_s_generate"] = round(arm["tokens"] / arm["generate_s"], 1)
    if arm.get("server_ready_s") and arm.get("wall_s") and arm.get("tokens"):
        after = arm["wall_s"] - arm["server_ready_s"]
        arm["after_load_s"] = round(after, 2)
        arm["tokens_per_s_after_load"] = round(arm["tokens"] / after, 1)
    arm["shape"] = SHAPE
    results.setdefault("arms", {})[label] = arm
    save()
    log("arm %s: %s" % (label, json.dumps({k: arm.get(k) for k in (
        "samples", "tokens", "wall_s", "server_ready_s", "first_sample_s", "tokens_per_s_after_load", "error")})))


def phase_smoke():
    model = os.path.join(SG, "models", "deepseek-v3-shape")
    rc, out, err, _ = run([sys.executable, os.path.join(HERE, "gpu_tools.py"), "deepseek-config", model, MODEL])
    smoke = inv("smoke", "--host", "local", "--model", model, "--json", timeout=560)
    record("smoke_deepseek_v3", smoke)
    log("smoke: exit %d in %.0f s" % (smoke["exit"], smoke["seconds"]))


def main(phases):
    record("phases_started", results.get("phases_started", []) + [[p, time.strftime("%H:%M:%S")] for p in phases])
    for phase in phases:
        log("== %s" % phase)
        try:
            if phase.startswith("arm:"):
                phase_arm(phase)
            else:
                globals()["phase_" + phase]()
        except Exception as exc:  # noqa: BLE001 - recorded, the next phase still runs
            import traceback
            traceback.print_exc()
            results.setdefault("errors", []).append({"phase": phase, "error": repr(exc)})
            save()
    results.setdefault("wall_by_call", []).append(round(time.time() - T0, 1))
    save()


if __name__ == "__main__":
    main(sys.argv[1:])
