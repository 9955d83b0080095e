"""The `runs.stop` remote command: a supervised run stopped, then what is left of it checked (stdlib only).

    runs.stop     {"workdir", "run": id|null, "grace_s": seconds|null}
                                                  null run: the newest active run; null grace_s:
                                                  the run's own (its supervisor option)

The supervisor is told (stop.request, SIGTERM) and ends its attempt's processes itself; what it could not
end, or a lost run's, is ended from here. A run that is a Slurm job is stopped by scancel instead
(run/slurm_stop.py).
"""
import os
import signal
import time

from base import atomic, procs, rundir, telemetry
from base.contract import GPU_RELEASE_S, STOPPED, SUPERVISOR_DEFAULTS
from run import processes
from run import slurm_stop as cancellation


def stop(args):
    """Stop the run's supervisor and driver, then check what is left: processes, and GPU memory."""
    workdir = rundir.workdir_of(args)
    run = rundir.find_run(workdir, args.get("run"), prefer_active=True)
    state = run.state()
    if run.slurm_job_id():
        return cancellation.stop_job(run, state)
    grace = float(args.get("grace_s") or run.record.get("options", {}).get("grace_s", SUPERVISOR_DEFAULTS["grace_s"]))
    status_now = run.status
    jobs = processes.jobs_of(run)
    # Every pid the jobs had, and the GPU memory they held, before anything is killed.
    pids = {m["pid"] for m in processes.members(jobs)}
    before = telemetry.snapshot()
    with open(run.file("stop.request"), "w") as handle:
        handle.write(rundir.now_iso() + "\n")
    supervisor = status_now.get("supervisor_pid") if run.supervisor_alive() else None
    if supervisor:
        os.kill(supervisor, signal.SIGTERM)
        os.kill(supervisor, signal.SIGCONT)  # a stopped supervisor (unresponsive) takes its SIGTERM once continued
        deadline = time.monotonic() + grace + 30
        while procs.alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.1)
    # No supervisor to do it (lost), or it did not finish: end the jobs from here.
    ended_by_us = processes.end(jobs, grace)
    if supervisor and procs.alive(supervisor):
        os.kill(supervisor, signal.SIGKILL)
    if not run.exit_record:
        atomic.write_json(run.file("exit.json"), {"state": STOPPED, "ended_at": rundir.now_iso(),
                                                  "stopped_by": "inv stop", "was": state})
    left = processes.members(jobs)
    gpu = telemetry.wait_released(before, pids | {m["pid"] for m in left}, GPU_RELEASE_S)
    return {"run_id": run.run_id, "was": state, "state": run.state(), "pids": sorted(pids),
            "supervisor_pid": supervisor, "ended_by_stop_command": ended_by_us, "left": left,
            "gpu_memory_held": gpu["held"], "gpu_memory": gpu["gpus"],
            "clean": not left and not gpu["held"] and not any(g["not_released"] for g in gpu["gpus"])}
