"""Check telemetry and stop on a real multi-GPU machine, through specrig's own remote code.

    python3 tests/programs/gpu_check.py <out-dir>

Runs `remote/entry.py <call.json>` (what `--host local` runs) for each step:
1. doctor: the GPUs as telemetry reads them;
2. runs launch: the supervisor runs tests/programs/job_tree.py, whose children each hold
   GPU memory on one GPU (one ignores SIGTERM), like vLLM's tensor-parallel workers;
3. kill -9 of the parent alone: the supervisor must end the orphaned children, free their
   memory, record the cause and restart;
4. runs stop: nothing of the run's group left, no GPU memory held.
Writes <out-dir>/gpu-check.json and the raw nvidia-smi output under load.
"""
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from host_calls import REPO, call, nvidia_smi, wait_for  # puts remote/ on sys.path

from base import procs  # remote/ is stdlib only; a zombie is not alive

GIB_PER_CHILD = 16


def main(out):
    out = Path(out)
    report = {}
    work = Path(tempfile.mkdtemp(prefix="specrig-gpu-check-"))
    report["doctor_gpu"] = call("doctor", {"workdir": str(work)})["gpu"]
    count = len(report["doctor_gpu"]["gpus"])
    print("telemetry: %d GPUs: %s" % (count, [(g["index"], g["name"], g["memory_used_mib"], g["memory_total_mib"])
                                            for g in report["doctor_gpu"]["gpus"]]), flush=True)
    launched = call("runs.launch", {"workdir": str(work), "host": "local",
                             "driver_program": str(REPO / "tests" / "programs" / "job_tree.py"),
                             "driver_args": {"output_dir": str(work / "out"), "children": count,
                                             "gpu_gib": GIB_PER_CHILD, "ignore_term": True},
                             "options": {"backoff_s": 1, "grace_s": 5, "telemetry_interval_s": 1}})
    run_id = launched["run_id"]

    def status():
        return call("runs.status", {"workdir": str(work), "run": run_id})["runs"][0]

    def holding(attempt):
        run = status()
        # Each child on its own GPU, its allocation done (not only its CUDA context).
        ours = [a for a in run.get("gpu_apps") or [] if a.get("this_run")
                and (a["memory_used_mib"] or 0) >= GIB_PER_CHILD * 1024 * 0.9]
        if len(run["attempts"]) == attempt and len({a["gpu_uuid"] for a in ours}) == count:
            return run
        return None

    first = wait_for("children holding memory on every GPU", lambda: holding(1))
    report["under_load"] = {"gpus": first["gpus"], "gpu_apps": first["gpu_apps"], "driver_pid": first["driver_pid"]}
    (out / "query_gpu_load.csv").write_text(nvidia_smi("--query-gpu=index,uuid,memory.used,memory.total,"
                                                       "utilization.gpu,temperature.gpu,power.draw", "--format=csv"))
    (out / "query_apps_load.csv").write_text(nvidia_smi("--query-compute-apps=pid,process_name,gpu_uuid,"
                                                        "used_gpu_memory", "--format=csv"))
    print("attempt 1: driver %s, run's GPU processes %s" % (
        first["driver_pid"], [(a["pid"], a["gpu_uuid"][-6:], a["memory_used_mib"]) for a in first["gpu_apps"]]),
        flush=True)
    old_children = [a["pid"] for a in first["gpu_apps"] if a.get("this_run")]
    os.kill(first["driver_pid"], signal.SIGKILL)
    second = wait_for("the restarted attempt holding memory again", lambda: holding(2))
    report["after_kill9"] = {"attempt_1": second["attempts"][0], "gpu_apps": second["gpu_apps"],
                             "old_children_alive": [pid for pid in old_children if procs.alive(pid)]}
    print("kill -9 of the parent: attempt 1 %s; old children alive: %s; attempt 2 GPU processes %s" % (
        second["attempts"][0]["failure"]["kind"], report["after_kill9"]["old_children_alive"],
        [(a["pid"], a["memory_used_mib"]) for a in second["gpu_apps"]]), flush=True)
    stopped = call("runs.stop", {"workdir": str(work), "run": run_id}, timeout=240)
    report["stop"] = stopped
    time.sleep(2)
    report["after_stop_gpus"] = call("doctor", {"workdir": str(work)})["gpu"]["gpus"]
    report["after_stop_apps"] = nvidia_smi("--query-compute-apps=pid,used_gpu_memory", "--format=csv")
    print("stop: clean=%s left=%s gpu_memory_held=%s; per GPU %s; memory used 2 s later: %s MiB" % (
        stopped["clean"], stopped["left"], stopped["gpu_memory_held"], stopped["gpu_memory"],
        [g["memory_used_mib"] for g in report["after_stop_gpus"]]), flush=True)
    (out / "driver.log").write_text((work / "runs" / run_id / "driver.log").read_text())
    (out / "gpu-check.json").write_text(json.dumps(report, indent=1, default=str))
    return 0 if stopped["clean"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
