"""`inv stop` of a run that is a Slurm job (stdlib only): run/stop.py's answer for it, by scancel.

Slurm sends SIGTERM to the supervisor and its jobs, which ends the attempt as `inv stop` over SSH does,
then SIGKILL after KillWait. What is left is looked for where the job's nodes are this machine (the
lab); elsewhere the supervisor's own end of its jobs, on its node, is what there is.
"""
from base import atomic, rundir
from base.contract import STOPPED
from run import processes
from slurm import jobs


def stop_job(run, state):
    """Stop the run's Slurm job (`state`: the run's before): scancel, wait until the job has left the
    queue, then look for what is left of the run's processes: on the job's nodes where they are this
    machine, by the run's process groups, as a stop over SSH does, and by their command lines; elsewhere
    its last attempt's left_behind. The answer has run/stop.py's keys, and the job's in `slurm`."""
    job_id = run.slurm_job_id()
    before = run.slurm_job()
    # A multi-node job's runs (one a node) share its Slurm job: the scancel ends every one of them.
    runs = [run] + ([other for other in rundir.all_runs(run.record["workdir"])
                     if other.run_id != run.run_id and other.slurm_job_id() == job_id] if run.record.get("nodes") else [])
    was = {member.run_id: member.state() for member in runs}
    run_jobs = [job for member in runs for job in processes.jobs_of(member)]
    here = jobs.on_this_machine(before.get("nodes") or before.get("batch_host"))
    pids = {m["pid"] for m in processes.members(run_jobs)} if here else set()
    for member in runs:
        with open(member.file("stop.request"), "w") as handle:
            handle.write(rundir.now_iso() + "\n")
    after = jobs.cancel(job_id) if jobs.holds_processes(before) else before
    for member in runs:
        if not member.exit_record:
            atomic.write_json(member.file("exit.json"), {"state": STOPPED, "ended_at": rundir.now_iso(),
                                                         "stopped_by": "inv stop (scancel %s)" % job_id,
                                                         "was": was[member.run_id]})
    grouped = {m["pid"] for m in processes.members(run_jobs)}
    left = (processes.members(run_jobs) + [m for member in runs for m in processes.marked(member)
                                           if m["pid"] not in grouped]
            if here else None)
    attempts = run.status.get("attempts") or [{}]
    return {"run_id": run.run_id, "was": state, "state": rundir.RunDir(run.path).state(), "pids": sorted(pids),
            "supervisor_pid": run.status.get("supervisor_pid"), "ended_by_stop_command": None,
            "slurm": {"job_id": job_id, "before": before, "after": after, "in_queue": jobs.holds_processes(after),
                      "checked_here": here, "supervisor_left_behind": attempts[-1].get("left_behind")},
            "left": left or [], "gpu_memory_held": [], "gpu_memory": [],
            "clean": not jobs.holds_processes(after) and (not left if here else
                                                          not attempts[-1].get("left_behind"))}
