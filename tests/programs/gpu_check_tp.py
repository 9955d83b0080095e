"""Preflight, telemetry, supervision and stop of a tensor-parallel job on a real N-GPU machine.

    python3 tests/programs/gpu_check_tp.py <out-dir>

Everything goes through specrig's own host code, `remote/entry.py <call.json>` (what `--host local`
runs), in the python that runs this script (the extraction environment: it has torch). N is the
number of GPUs nvidia-smi shows; without nvidia-smi it is a dry run of the mechanics on CPU (gloo,
2 workers, no memory held) and the GPU steps are left out.

1. doctor, and torch's build as remote/run/torch_arch.py reads it (no CUDA context made);
2. preflight with tensor_parallel_size N on the idle machine: `gpus` and `torch-arch` pass;
3. another process holds memory on GPU 1: `gpus` fails naming GPU 1 and that process; a reordered
   CUDA_VISIBLE_DEVICES ("1,0,...") makes cuda:0 GPU 1 (as torch itself reports), so a tp-1 preflight
   fails on it, while CUDA_VISIBLE_DEVICES=0 passes;
4. runs launch of tests/programs/nccl_job.py under the supervisor: N workers, each holding
   GPU_GIB GiB on its GPU and looping an NCCL all-reduce; status JSON and nvidia-smi under load;
5. kill -9 of the parent only: the supervisor ends the N orphaned workers, waits until their memory
   is back, restarts; the restart reaches its all-reduce loop on every GPU;
6. runs stop: clean, 0 MiB held by the run on every GPU.
Writes <out-dir>/gpu-check-tp.json, status_load.json, nvidia-smi's output under load and the driver's
log; prints one line per step. Exit 0 when every step held.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from host_calls import REPO, call, nvidia_smi, wait_for  # puts remote/ on sys.path

from base import (
    procs,  # remote/ is stdlib only; a zombie is not alive
    telemetry,
)
from run import preflight as host_preflight

JOB = REPO / "tests" / "programs" / "nccl_job.py"
GPU_GIB = 8
BLOCKER_GIB = 4
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)


class Checks:
    """What must hold, each with what was seen."""

    def __init__(self):
        self.items = []

    def __call__(self, name, ok, seen):
        self.items.append({"check": name, "ok": bool(ok), "seen": seen})
        print("%s %s: %s" % ("PASS" if ok else "FAIL", name, seen), flush=True)
        return ok


def by_name(result, name):
    return [c for c in result["checks"] if c["name"] == name][0]


def fake_model(work):
    model = work / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
        "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}))
    data = work / "data.jsonl"
    data.write_text("".join(json.dumps({"conversations": [{"from": "human", "value": "hello %d" % i}]}) + "\n"
                            for i in range(4)))
    return {"model": str(model), "dataset": str(data), "output_dir": str(work / "out-preflight"),
            "max_length": 2048, "batch_size": 1}


def preflight(work, driver, tp, visible=None):
    env = {"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {}
    result = call("preflight", {"workdir": str(work), "driver_args": dict(driver, tensor_parallel_size=tp)}, env=env)
    return {"tp": tp, "CUDA_VISIBLE_DEVICES": visible, "gpus": by_name(result, "gpus"),
            "torch-arch": by_name(result, "torch-arch")}


def torch_uuids(visible):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible)
    env.pop("CUDA_DEVICE_ORDER", None)  # CUDA's own default order, as the job gets it
    proc = subprocess.run([sys.executable, str(JOB), "--uuids"], capture_output=True, text=True, env=env, timeout=120)
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("[")][-1])


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    check = Checks()
    report = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": sys.executable,
              "python_version": sys.version.split()[0], "checks": check.items}
    work = Path(tempfile.mkdtemp(prefix="specrig-gpu-check-tp-"))
    try:
        run_checks(out, work, check, report)
    except Exception as exc:  # what ran is still written
        check("the script ran to its end", False, "%s: %s" % (type(exc).__name__, exc))
        raise
    finally:
        (out / "gpu-check-tp.json").write_text(json.dumps(report, indent=1, default=str))
        failed = [c["check"] for c in check.items if not c["ok"]]
        print("%d checks, %d failed%s" % (len(check.items), len(failed), ": " + ", ".join(failed) if failed else ""),
              flush=True)
    return 0 if all(c["ok"] for c in check.items) else 1


def taken_gpu(work, driver, gpus, count, workers, check, report):
    blocker = subprocess.Popen([sys.executable, str(JOB), "--hold", "1", str(BLOCKER_GIB)], stdout=subprocess.PIPE,
                               text=True, env=dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID"))
    try:
        taken_gpu_checks(work, driver, gpus, count, workers, check, report, blocker)
    finally:
        if blocker.poll() is None:
            before = telemetry.snapshot()
            blocker.kill()
            blocker.wait()
            released = telemetry.wait_released(before, {blocker.pid}, 30)
            check("the blocker's memory is back", not released["held"] and not any(
                g["not_released"] for g in released["gpus"]),
                [(g["index"], g["used_after_mib"]) for g in released["gpus"]])


def taken_gpu_checks(work, driver, gpus, count, workers, check, report, blocker):
    report["blocker"] = {"pid": blocker.pid, "said": blocker.stdout.readline().strip()}
    wait_for("the blocker listed on GPU 1", lambda: blocker.poll() is not None or [
        a for a in telemetry.compute_apps() if a["pid"] == blocker.pid], timeout=90)
    if blocker.poll() is not None:
        raise RuntimeError("the blocker exited with %s" % blocker.returncode)
    taken = preflight(work, driver, workers)
    report["preflight_gpu1_taken"] = taken
    check("preflight tp %d with GPU 1 taken fails naming GPU 1 and pid %d" % (workers, blocker.pid),
          not taken["gpus"]["ok"] and "GPU 1 by pid %d" % blocker.pid in taken["gpus"]["detail"]
          and "GPU 0 by" not in taken["gpus"]["detail"], taken["gpus"]["detail"])
    reordered = ",".join(["1", "0"] + [str(i) for i in range(2, count)])
    uuids = torch_uuids(reordered)
    smi = {g["index"]: g["uuid"] for g in gpus}
    report["torch_uuids_reordered"] = {"CUDA_VISIBLE_DEVICES": reordered, "torch": uuids, "nvidia_smi": smi}
    check("torch's cuda:0 under CUDA_VISIBLE_DEVICES=%s is nvidia-smi's GPU 1" % reordered,
          uuids[:2] == [smi[1], smi[0]], {"cuda:0": uuids[0], "GPU 1": smi[1]})
    first = preflight(work, driver, 1, reordered)
    zero = preflight(work, driver, 1, "0")
    report["preflight_reordered"] = [first, zero]
    check("preflight tp 1, CUDA_VISIBLE_DEVICES=%s: fails on GPU 1 (its cuda:0)" % reordered,
          not first["gpus"]["ok"] and "cuda:0 is GPU 1" in first["gpus"]["detail"]
          and "GPU 1 by pid %d" % blocker.pid in first["gpus"]["detail"], first["gpus"]["detail"])
    check("preflight tp 1, CUDA_VISIBLE_DEVICES=0: passes", zero["gpus"]["ok"], zero["gpus"]["detail"])
    check("torch-arch under CUDA_VISIBLE_DEVICES=%s" % reordered, first["torch-arch"]["ok"],
          first["torch-arch"]["detail"])


def run_checks(out, work, check, report):
    # 1. what is there
    doctor = call("doctor", {"workdir": str(work)})
    report["doctor"] = {"gpu": doctor["gpu"], "packages": doctor["packages"], "python": doctor["python"]}
    gpus = doctor["gpu"]["gpus"]
    count = len(gpus)
    on_gpus = count > 0
    print("telemetry: %d GPUs %s" % (count, [(g["index"], g["name"], g["memory_used_mib"], g["memory_total_mib"])
                                           for g in gpus]), flush=True)
    report["torch_build"] = host_preflight.torch_build()
    report["compute_cap_csv"] = nvidia_smi("--query-gpu=index,uuid,name,compute_cap", "--format=csv")
    (out / "query_compute_cap.csv").write_text(report["compute_cap_csv"])
    check("torch's build is read without a CUDA context", report["torch_build"].get("installed")
          and report["torch_build"].get("cuda_initialized") is False, report["torch_build"])
    if on_gpus:
        # The same calls in this process: none of them may make a context (nvidia-smi would list this pid).
        import torch

        flags = torch._C._cuda_getArchFlags()
        apps = telemetry.compute_apps()
        check("reading the arch flags makes no CUDA context", not torch.cuda.is_initialized()
              and os.getpid() not in [a["pid"] for a in apps], {"flags": flags, "pids_on_gpus": [a["pid"] for a in apps]})
    workers = count or 2

    # 2. preflight on the idle machine
    driver = fake_model(work)
    idle = preflight(work, driver, workers)
    report["preflight_idle"] = idle
    check("preflight tp %d idle: gpus" % workers, idle["gpus"]["ok"] or not on_gpus, idle["gpus"]["detail"])
    check("preflight tp %d idle: torch-arch" % workers, idle["torch-arch"]["ok"], idle["torch-arch"]["detail"])

    # 3. one GPU taken by another process; a reordered CUDA_VISIBLE_DEVICES
    if count >= 2:
        try:
            taken_gpu(work, driver, gpus, count, workers, check, report)
        except Exception as exc:  # the supervision steps still run
            check("preflight with GPU 1 taken ran", False, "%s: %s" % (type(exc).__name__, exc))

    # 4. the stand-in job under the supervisor
    launched = call("runs.launch", {"workdir": str(work), "host": "local", "driver_program": str(JOB),
                             "driver_args": {"output_dir": str(work / "out"), "workers": workers,
                                             "gpu_gib": GPU_GIB if on_gpus else 0,
                                             "tensor_mib": 64 if on_gpus else 1},
                             "env": NO_MULTICAST,
                             "options": {"backoff_s": 1, "grace_s": 5, "telemetry_interval_s": 1}})
    run_id = launched["run_id"]
    run_dir = work / "runs" / run_id

    def status(lines=None):
        return call("runs.status", {"workdir": str(work), "run": run_id, "lines": lines or 10})

    def looping(attempt):
        """The run once attempt `attempt` has every worker in its loop, holding its memory."""
        result = status(8)
        run = result["runs"][0]
        beat = run.get("heartbeat") or {}
        if len(run["attempts"]) != attempt or beat.get("pid") != run["attempts"][-1]["pid"]:
            return None
        if beat.get("phase") != "extracting" or not beat.get("samples_done"):
            return None
        if on_gpus:
            ours = [a for a in run.get("gpu_apps") or [] if a.get("this_run")
                    and (a["memory_used_mib"] or 0) >= GPU_GIB * 1024 * 0.9]
            if len({a["gpu_uuid"] for a in ours}) != count:
                return None
        return result

    loaded = wait_for("attempt 1's workers in their all-reduce loop", lambda: looping(1))
    first = loaded["runs"][0]
    (out / "status_load.json").write_text(json.dumps(loaded, indent=1))
    (out / "query_gpu_load.csv").write_text(nvidia_smi(
        "--query-gpu=index,name,uuid,memory.used,memory.total,memory.free,utilization.gpu,temperature.gpu,power.draw",
        "--format=csv"))
    (out / "query_apps_load.csv").write_text(nvidia_smi("--query-compute-apps=pid,process_name,gpu_uuid,"
                                                        "used_gpu_memory", "--format=csv"))
    (out / "nvsmi_load.txt").write_text(nvidia_smi())
    children = json.loads((run_dir / "heartbeat.json.children").read_text())
    ranks = [json.loads((run_dir / ("heartbeat.json.rank%d" % r)).read_text()) for r in range(workers)]
    report["attempt_1"] = {"driver_pid": first["driver_pid"], "workers": children, "ranks": ranks,
                           "gpu_apps": first["gpu_apps"], "gpus": first["gpus"]}
    check("attempt 1: %d workers in the all-reduce loop, right sums" % workers,
          len(children) == workers and all(r["rounds"] > 0 and not r["wrong_sums"] for r in ranks),
          [(r["rank"], r["pid"], r["uuid"], r["held_gib"], r["rounds"]) for r in ranks])
    if on_gpus:
        ours = [a for a in first["gpu_apps"] if a.get("this_run")]
        check("status lists the run's %d workers on %d GPUs" % (workers, count),
              sorted(a["pid"] for a in ours) == sorted(children) and len({a["gpu_uuid"] for a in ours}) == count,
              [(a["pid"], a["gpu_uuid"][-8:], a["memory_used_mib"]) for a in ours])
        check("the parent holds no GPU memory", first["driver_pid"] not in [a["pid"] for a in first["gpu_apps"]],
              first["driver_pid"])

    # 5. kill -9 of the parent alone
    killed_at = time.monotonic()
    os.kill(first["driver_pid"], signal.SIGKILL)
    # The supervisor polls every 0.5 s and ends the orphans at once: look right after the parent is gone.
    while procs.alive(first["driver_pid"]) and time.monotonic() - killed_at < 5:
        time.sleep(0.01)
    report["orphans_right_after_kill"] = [pid for pid in children if procs.alive(pid)]
    check("kill -9 of the parent leaves %d orphaned workers" % workers,
          sorted(report["orphans_right_after_kill"]) == sorted(children),
          {"parent": first["driver_pid"], "workers_alive": report["orphans_right_after_kill"]})
    again = wait_for("attempt 2's workers in their all-reduce loop", lambda: looping(2))
    second = again["runs"][0]
    report["restart_s"] = round(time.monotonic() - killed_at, 1)
    one = second["attempts"][0]
    report["after_kill9"] = {"attempt_1": one, "old_workers_alive": [pid for pid in children if procs.alive(pid)],
                             "attempt_2_gpu_apps": second["gpu_apps"], "heartbeat": second["heartbeat"]}
    check("attempt 1 recorded as killed (SIGKILL), retryable",
          one["failure"] and one["failure"]["kind"] == "killed" and one["failure"]["retryable"], one["failure"])
    check("the supervisor ended every orphaned worker", set(children) <= set(one.get("orphans_ended") or [])
          and not report["after_kill9"]["old_workers_alive"], {"orphans_ended": one.get("orphans_ended"),
                                                               "alive": report["after_kill9"]["old_workers_alive"]})
    if on_gpus:
        memory = one.get("gpu_memory") or []
        check("their memory was released on every GPU before the restart",
              len(memory) == count and not any(g["not_released"] for g in memory),
              [(g["index"], g["held_by_run_mib"], g["used_after_mib"], g["not_released"]) for g in memory])
    new_children = json.loads((run_dir / "heartbeat.json.children").read_text())
    check("the restart reached its all-reduce loop on every GPU (%.1f s after the kill)" % report["restart_s"],
          len(new_children) == workers and not set(new_children) & set(children),
          {"workers": new_children, "heartbeat": second["heartbeat"]})

    # 6. stop
    stopped = call("runs.stop", {"workdir": str(work), "run": run_id}, timeout=240)
    report["stop"] = stopped
    time.sleep(2)
    report["after_stop_gpus"] = telemetry.gpus()["gpus"]
    report["after_stop_apps"] = nvidia_smi("--query-compute-apps=pid,used_gpu_memory", "--format=csv")
    check("stop reports clean", stopped["clean"] and not stopped["left"] and not stopped["gpu_memory_held"],
          {"clean": stopped["clean"], "left": stopped["left"], "held": stopped["gpu_memory_held"]})
    if on_gpus:
        check("0 MiB held by the run on every GPU after the stop",
              len(stopped["gpu_memory"]) == count and all(not g["not_released"] and (g["used_after_mib"] or 0) < 100
                                                          for g in stopped["gpu_memory"]),
              [(g["index"], g["held_by_run_mib"], g["used_after_mib"]) for g in stopped["gpu_memory"]])
        check("nvidia-smi 2 s later: 0 MiB used on every GPU",
              all((g["memory_used_mib"] or 0) < 100 for g in report["after_stop_gpus"]),
              [g["memory_used_mib"] for g in report["after_stop_gpus"]])
    (out / "driver.log").write_text((run_dir / "driver.log").read_text())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
