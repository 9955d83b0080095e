"""The phases that run specrig's own tasks on the GPU, checked: `extract` (a supervised run, kill -9 of its
EngineCore mid-run, the restart and resume, every stored layer against transformers), `stop` (inv stop
mid-run: clean, seconds, GPU memory after) and `smoke` (inv smoke on a DeepSeek-V3-shaped config)."""
import json
import os
import shutil
import threading
import time

import fault_phase
import harness
import states_phase


class Sampler(threading.Thread):
    """GPU memory used (MiB) and the compute processes, every 0.5 s: [t, used, [pid, ...]]."""

    def __init__(self):
        threading.Thread.__init__(self, daemon=True)
        self.samples, self.stopped = [], False

    def run(self):
        while not self.stopped:
            t = time.time()
            used = harness.memory_used()
            rc, apps, err, _ = harness.run(["nvidia-smi", "--query-compute-apps=pid,used_gpu_memory",
                                            "--format=csv,noheader,nounits"], timeout=20)
            pids = [int(line.split(",")[0]) for line in apps.splitlines() if line.strip()[:1].isdigit()]
            self.samples.append([round(t, 2), used[0] if used else None, pids])
            time.sleep(0.5)


def phase_extract():
    doctor = harness.inv("doctor", "--host", "local", "--json", timeout=300)
    harness.record("doctor", doctor)
    harness.log("doctor: exit %d" % doctor["exit"])
    out = os.path.join(harness.SG, "out", "extract")
    shutil.rmtree(out, ignore_errors=True)
    sampler = Sampler()
    sampler.start()
    time.sleep(1.5)
    idle = harness.memory_used()
    started = time.time()
    launched = harness.inv(*harness.extract_args(out, harness.N_EXTRACT), timeout=600)
    entry = {"launch": launched, "idle_memory_used_mib": idle, "samples": harness.N_EXTRACT}
    harness.record("extract", entry)
    info = launched["json"] or {}
    if not info.get("launched"):
        sampler.stopped = True
        harness.log("extract did not launch: %s" % json.dumps(launched)[:3000])
        return
    run_path, run_id = info["path"], info["run_id"]
    entry.update(run_id=run_id, run_path=run_path)
    harness.log("launched %s; waiting for %d samples before the kill" % (run_id, harness.KILL_AT))
    kill, kept = fault_phase.inject(harness, run_path, out,
                                    {"signal": "kill", "process": "engine-core", "at": harness.KILL_AT},
                                    before=lambda: harness.capture("load"))
    entry["kill"] = kill
    if kill["at_epoch"]:
        fault_phase.watch(harness, run_path, kill)
    harness.save()
    beat, status, done = harness.wait_run(run_path, lambda b, s: harness.run_state(run_path) in harness.FINAL,
                                          timeout=900)
    ended_at = time.time()
    sampler.stopped = True
    harness.capture("after")
    final = harness.inv("status", "--host", "local", "--run", run_id, "--json", timeout=120)
    files = harness.hs_files(out)
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
        state=harness.run_state(run_path), wall_s=round(ended_at - started, 1), files=len(files),
        tokens=harness.tokens_in(files), attempts=attempts, exit=harness.read_json(os.path.join(run_path, "exit.json")),
        status_task=final, files_before_kill_kept=fault_phase.unchanged(out, kept), files_before_kill=len(kept),
        memory_back_to_idle_at=memory_back, restart_started_at=restart_at,
        memory_timeline=[s for s in sampler.samples][::2])
    harness.record("extract", entry)
    for name in ("server.log", "driver.log", "supervisor.log"):
        path = os.path.join(run_path, name)
        if os.path.exists(path):
            shutil.copy(path, os.path.join(harness.EXTRAS, "extract-" + name))
    harness.log("extract: %s, %d files, %d tokens, attempts %d" % (entry["state"], len(files), entry["tokens"],
                                                                   len(attempts)))
    plan = (harness.read_json(os.path.join(run_path, "run.json"), {}) or {}).get("server") or {}
    layer_ids = plan.get("layer_ids")
    entry["layer_ids"], entry["layer_convention"] = layer_ids, plan.get("layer_convention")
    entry["server_argv"] = plan.get("server_argv")
    harness.save()
    if files and layer_ids:
        harness.record("states", states_phase.reference(out, layer_ids, "reference.json", timeout=900)[0])
    shutil.rmtree(out, ignore_errors=True)  # the disk holds 64 GiB: the arms need the room


def phase_stop():
    out = os.path.join(harness.SG, "out", "stop")
    shutil.rmtree(out, ignore_errors=True)
    harness.wait_idle()
    idle = harness.memory_used()
    launched = harness.inv(*harness.extract_args(out, harness.N_EXTRACT), timeout=600)
    info = launched["json"] or {}
    entry = {"launch_exit": launched["exit"], "idle_memory_used_mib": idle}
    harness.record("stop", entry)
    if not info.get("launched"):
        entry["launch"] = launched
        harness.save()
        return
    run_path = info["path"]
    beat, status, reached = harness.wait_run(run_path, lambda b, s: (b.get("samples_done") or 0) >= 16
                                             or harness.run_state(run_path) in harness.FINAL, timeout=420)
    entry["samples_done_at_stop"] = beat.get("samples_done")
    entry["memory_before_mib"] = harness.memory_used()
    stopped = harness.inv("stop", "--host", "local", "--run", info["run_id"], "--json", timeout=400)
    entry.update(stop=stopped, seconds=stopped["seconds"], clean=(stopped["json"] or {}).get("clean"),
                 memory_right_after_mib=harness.memory_used())
    harness.capture("after_stop")
    time.sleep(2)
    entry["memory_2s_after_mib"] = harness.memory_used()
    table = harness.proc_table()
    entry["engine_cores_left"] = [{"pid": pid, "sid": table[pid][1], "cmd": table[pid][3][:160]}
                                  for pid in harness.engine_cores() if pid in table]
    entry["state"] = harness.run_state(run_path)
    harness.record("stop", entry)
    harness.log("stop: clean %s in %.1f s" % (entry["clean"], entry["seconds"]))
    shutil.rmtree(out, ignore_errors=True)


def phase_smoke():
    model = os.path.join(harness.SG, "models", "deepseek-v3-shape")
    harness.gpu_tools("deepseek-config", model, harness.MODEL)
    smoke = harness.inv("smoke", "--host", "local", "--model", model, "--json", timeout=560)
    harness.record("smoke_deepseek_v3", smoke)
    harness.log("smoke: exit %d in %.0f s" % (smoke["exit"], smoke["seconds"]))
