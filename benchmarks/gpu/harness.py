"""What every phase of the GPU harness stands on (device_run.py's phases, fault_phase.py, kimi_phase.py,
train_step.py): the call's settings from the environment, its results file, commands and specrig's tasks run
from this tree, the runs' files, the GPU's memory and the processes on it, speculators' client patched or
reverted, the budget.

The settings are read once, at import; a preset's environment (device_run.main) sets them here, so every
module reads them as `harness.NAME` when it runs, never as a copy taken at import.
"""
import glob
import importlib
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
import time

import arms

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
#: nvidia-smi's fields as remote/base/telemetry.py asks for them (the captures are that query's output).
GPU_QUERY = "index,name,uuid,memory.used,memory.total,memory.free,utilization.gpu,temperature.gpu,power.draw"
APP_QUERY = "pid,process_name,gpu_uuid,used_gpu_memory"
FINAL = ("succeeded", "failed", "stopped")
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


# -- the results file and the log ----------------------------------------------------------------------

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


# -- commands, specrig's tasks and gpu_tools.py --------------------------------------------------------

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


def gpu_tools(*args, timeout=600):
    """One subcommand of gpu_tools.py (build-model, reference, ...) in a process of its own: run's answer."""
    return run([sys.executable, os.path.join(HERE, "gpu_tools.py"), *args], timeout=timeout)


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


def extract_args(out, n, concurrency=None, port=None, settings=None, data=None):
    """`inv extract` on --host local (of `data`, default DATA); `settings`: more of its options as a spec writes
    them, {"writer_threads": "16", "render_server": "1", ...} (a flag of the task's as inv takes it: arms.inv_options)."""
    args = ["extract", "--host", "local", "--model", MODEL, "--data", data or DATA, "--out", out,
            "--max-len", "2048", "--max-samples", str(n), "--port", str(port or PORT), "--json"]
    if concurrency:
        args += ["--concurrency", str(concurrency)]
    with open(os.path.join(TREE, "specrig", "cli", "tasks.py")) as f:
        flags = arms.task_flags(f.read(), "extract")
    return args + arms.inv_options(settings or {}, flags)


# -- the GPU's memory, the port, the processes ---------------------------------------------------------

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


def wait_port_free(port=None, timeout=60):
    """Seconds waited until nothing listens on `port` (an ended arm's API server lets go of it last)."""
    started = time.time()
    while time.time() - started < timeout:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port or PORT))
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


def process_tree(pid):
    """A process's command line and its descendants' (what a kill hits), from /proc; None when it is gone."""
    table = proc_table()
    if pid not in table:
        return None
    below, front = [], [pid]
    while front:
        parent = front.pop()
        children = [child for child, row in table.items() if row[0] == parent]
        below += [{"pid": child, "cmd": table[child][3][:200]} for child in children]
        front += children
    return {"pid": pid, "comm": table[pid][2], "cmd": table[pid][3][:300], "descendants": below}


def engine_cores(session=None):
    """The EngineCore processes (vLLM sets their title to VLLM::EngineCore), of one session if given."""
    return sorted(pid for pid, (ppid, sid, comm, cmd) in proc_table().items()
                  if ("EngineCor" in comm or "EngineCore" in cmd) and (session is None or sid == session))


def start_server(argv, log_path, cwd):
    """A server started in a session of its own (end_group ends it, its EngineCore included), its output
    appended to `log_path`."""
    with open(log_path, "ab") as server_log:
        return subprocess.Popen(argv, stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=cwd)


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


# -- a run's files and state ---------------------------------------------------------------------------

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


# -- the budget, and what an arm's run leaves ----------------------------------------------------------

def budget_left():
    return None if BUDGET_S is None else BUDGET_S - BUDGET_MARGIN_S - (time.time() - T0)


#: The specrig arms whose run is under way: {arm name: run directory}, for the budget's end (device_run.on_budget_end).
RUNNING = {}
#: What an arm's run directory holds that says what happened in it.
RUN_FILES = ("driver.log", "server.log", "render.log", "status.json", "heartbeat.json")


def keep_run_files(name, run_path):
    """Copy what run `run_path` of arm `name` wrote into the extras."""
    for file_name in RUN_FILES:
        path = os.path.join(run_path, file_name)
        if os.path.exists(path):
            shutil.copy(path, os.path.join(EXTRAS, "arm-%s-%s" % (name, file_name)))


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


# -- specrig's remote/ and speculators' client, patched or not -----------------------------------------

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
