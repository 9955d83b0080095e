"""How people see Slurm's part of a run on a cluster's login node: a run's job as Slurm says it, a stop
that cancelled a job, and the submissions of a job array (specrig/run/slurm_job_array.py) and of a
multi-node job in one allocation (specrig/run/slurm_node_job.py). The run itself is shown as any run's (specrig/run/view.py).
"""
from __future__ import annotations

from specrig.inventory import Host
from specrig.ui import console, print_json
from specrig.ui.preflight_checks import show_checks, show_preflight_failed
from specrig.ui.task import TaskView
from specrig.ui.terminal import markup


def slurm_job_text(slurm: dict) -> str:
    """A run's Slurm job as Slurm says it (remote/slurm/jobs.py lookup): "job 12 pending: Resources, start
    estimate 2026-12-01T21:00:00", "job 12 running on lab-node1, 0:42 of 30:00", "job 12 COMPLETED", or
    why Slurm no longer says anything (no accounting storage: sacct has no record)."""
    job = slurm.get("job") or {}
    name = f"job {slurm['job_id']}"
    state = job.get("state")
    if state is None:
        return f"{name}: {job.get('detail') or 'Slurm says nothing of it'}"
    if state == "PENDING":
        if job.get("reason") in (None, "None"):
            return f"{name} pending: the scheduler has not weighed it yet"
        estimate = job.get("start_time")
        known = estimate and estimate not in ("Unknown", "N/A", "None")
        return f"{name} pending: {job.get('reason')}" + (f", start estimate {estimate}" if known else ", no start estimate yet")
    if state == "RUNNING":
        return f"{name} running on {job.get('nodes')}, {job.get('run_time')} of {job.get('time_limit')}"
    reason = job.get("reason")
    return f"{name} {state}" + (f" ({reason})" if reason and reason != "None" else "")


def show_stopped_job(result: dict, slurm: dict) -> None:
    """`inv stop` of a run that is a Slurm job: scancel, the queue, then what is left of its processes."""
    queue = ("[bold red]still in the queue[/]: " if slurm["in_queue"] else "no longer in the queue: ")
    console.print(f"run {markup(result['run_id'])}: was {markup(result['was'])}, now {markup(result['state'])}; "
                  f"job {markup(slurm['job_id'])} cancelled, {queue}"
                  f"{markup(slurm_job_text({'job_id': slurm['job_id'], 'job': slurm['after']}))}")
    for proc in result["left"]:
        console.print(f"[bold red]still alive:[/] pid {proc['pid']} ({markup(proc['state'])}) {markup(proc['cmdline'])}")
    if slurm["before"].get("state") == "PENDING":
        checked = "the job was pending: no process of it had started"
    elif slurm["checked_here"]:
        checked = f"its node is this machine: {len(result['pids'])} process(es) of the run's groups were looked for"
    else:
        left = slurm["supervisor_left_behind"]
        checked = ("its node is another machine: the supervisor's own check there left "
                   + (f"[bold red]{len(left)} process(es)[/]" if left else "nothing"))
    console.print(checked)
    if result["clean"]:
        console.print("nothing of the run is left: no job in the queue, no process of the run")


def show_job_array(result: dict, *, host: Host, as_json: bool) -> None:
    """`inv extract --array N`: the checks, the array job, each task's run."""
    if as_json:
        print_json(result)
        return
    if result["preflight"]:
        show_checks(result["preflight"])
    console.print(f"submitted sharded run [bold]{markup(result['sharded_run_id'])}[/] on {host.name} as Slurm job "
                  f"array {markup(result['job_id'])} (its script: {markup(result['script'])})")
    for run in result["runs"]:
        console.print(f"  task {run['task']}: run {markup(run['run_id'])} → {markup(run['out'])}")
    console.print(f"`inv status --host {host.name}` shows the tasks, `inv gather --host {host.name} --run "
                  f"{markup(result['sharded_run_id'])}` checks their union; `inv resume --host {host.name} --run RUN` "
                  f"resubmits one task alone")


JOB_ARRAY = TaskView("extract", show=show_job_array,
                     figures=lambda result: f"job array {result['job_id']} submitted",
                     show_findings=show_preflight_failed)


def show_node_job(result: dict, *, host: Host, as_json: bool) -> None:
    """`inv extract --nodes` on a Slurm login node: the checks, the job, each node's run."""
    if as_json:
        print_json(result)
        return
    if result["preflight"]:
        show_checks(result["preflight"])
    console.print(f"submitted multi-node job [bold]{markup(result['job_id'])}[/] ({markup(result['describe'])}) on "
                  f"{host.name} as Slurm job {markup(result['slurm_job_id'])} (its script: {markup(result['script'])})")
    for run in result["runs"]:
        console.print(f"  node {run['rank']} ({run['role']}): run {markup(run['run_id'])}")
    console.print(f"`inv status --host {host.name}` shows the nodes' runs, `inv stop --host {host.name} --run "
                  f"{markup(result['job_id'])}` cancels the job")


NODE_JOB = TaskView("extract", show=show_node_job,
                    figures=lambda result: f"multi-node job {result['job_id']} submitted",
                    show_findings=show_preflight_failed)
