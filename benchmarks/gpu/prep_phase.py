"""The phases that make the machine ready: `prep` (the model and the chat data built, nvidia-smi at idle, the
versions) and `clean` (what an earlier call cut short may have left, stopped)."""
import glob
import json
import os
import signal
import sys
import time

import harness


def versions():
    found = {}
    for name in ("vllm", "speculators", "hs-connectors", "torch", "transformers", "fabric", "invoke"):
        rc, out, err, _ = harness.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version(%r))"
                                       % name], timeout=60)
        found[name] = out.strip() or None
    return found


def model_key():
    return "model" if harness.SHAPE == harness.MAIN_SHAPE else "model_" + harness.SHAPE


def phase_prep():
    harness.record("commit", open(os.path.join(harness.TREE, "COMMIT")).read().strip() if os.path.exists(
        os.path.join(harness.TREE, "COMMIT")) else None)
    building = os.path.join(harness.SG, "models", harness.SHAPE + ".building")
    done = os.path.join(harness.SG, "models", harness.SHAPE + ".done")
    if os.path.exists(building):  # stage.sh started the build in the background: wait for it
        deadline = time.time() + 900
        while not os.path.exists(done) and time.time() < deadline:
            time.sleep(1)
        built_log = open(os.path.join(harness.SG, "models", harness.SHAPE + ".log")).read() if os.path.exists(
            os.path.join(harness.SG, "models", harness.SHAPE + ".log")) else ""
        harness.log("background build: %s" % built_log[-1500:])
        if os.path.exists(done):
            harness.record(model_key(), {"shape": harness.SHAPE, "exit": 0, "background": True,
                                         "built": json.loads(open(done).read())})
        else:
            raise SystemExit("the background model build did not finish")
    elif not os.path.exists(os.path.join(harness.MODEL, "config.json")):
        rc, out, err, seconds = harness.gpu_tools("build-model", harness.MODEL, harness.SHAPE, harness.DATA,
                                                  str(harness.N_DATA), timeout=900)
        harness.log("build-model rc %d in %.0f s: %s %s" % (rc, seconds, out[-500:], err[-1500:] if rc else ""))
        harness.record(model_key(), {"shape": harness.SHAPE, "exit": rc, "seconds": seconds,
                                     "built": json.loads(out.strip().splitlines()[-1]) if rc == 0 else err[-2000:]})
        if rc:
            raise SystemExit("model build failed")
    harness.capture("idle")
    gpu = harness.smi(query="--query-gpu=name,memory.total,driver_version").strip().splitlines()
    harness.record("device", {"gpu": (gpu or [None])[-1],
                              "python": sys.version.split()[0], "versions": versions(),
                              "idle_memory_used_mib": harness.memory_used()})


def phase_clean():
    """What an earlier call cut short may have left: active runs (stopped through specrig) and the
    by-hand arms' servers (their own sessions)."""
    stopped = []
    for path in glob.glob(os.path.expanduser("~/specrig/runs/*/")):
        if harness.run_state(path) in ("running", "starting", "restarting", "stalled"):
            stopped.append(harness.inv("stop", "--host", "local", "--run", os.path.basename(path.rstrip("/")), "--json",
                                       timeout=300))
    for pid, (_ppid, sid, _comm, cmd) in harness.proc_table().items():
        if "vllm.entrypoints" in cmd and pid == sid:
            os.killpg(pid, signal.SIGKILL)
            stopped.append({"killed_group": pid, "cmd": cmd[:200]})
    harness.results.setdefault("clean", []).append({"stopped": stopped, "waited_for_idle": harness.wait_idle()})
    harness.save()
