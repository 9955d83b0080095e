"""A sharded run as one Slurm job array, on a cluster's login node: `inv extract --array N` and `inv gather`
on it (docs/slurm.md, "A sharded run as a job array"). Data only (specrig/slurm/view.py shows it).

Task k of N is shard k of a sharded run (sharded_runs.py): its own run, launched on the login node
as any run (runs.launch with `array`: the run directory, not yet submitted), shard_index k and
shard_count N (in-process: i % N == k; server mode: speculators' --world-size N --rank k), its output
`<out>/task-<k>`, in server mode its server on port + k (tasks may share a node); then one `sbatch --array=0-(N-1)` runs each task's supervisor
(runs.submit-array). `inv resume --run <a task's run id>` resubmits that task alone; `inv gather`
checks the tasks' union.
"""
from __future__ import annotations

import dataclasses
import time

from specrig.contract import SERVER, SERVER_DEFAULTS
from specrig.doctor import check_extraction_mode
from specrig.errors import Findings, SpecrigError, UsageError
from specrig.exit_status import ExitStatus
from specrig.group import GroupResult, HostOutcome
from specrig.inventory import Host
from specrig.run.preflight import preflight
from specrig.run.runs import launch_args, runs_call
from specrig.run.settings import Request, build_request
from specrig.run.sharded_runs import GATHER_TIMEOUT_S, SHARDED_PREFIX, new_group_run_id, union
from specrig.slurm.submit import refuse_impossible, refuse_nodes, slurm_settings
from specrig.transport import connect

#: Each task's output directory, under --out.
TASK_OUTPUT = "{out}/task-{task}"


def task_requests(host: Host, given: dict, tasks: int) -> list[Request]:
    """Each task's request: the run's settings, its shard and its own output directory."""
    if slurm_settings(host) is None:
        raise UsageError(f"--array on {host.name!r}, which is no Slurm login node",
                         hint="a job array needs `scheduler: slurm`; over hosts reached by SSH, pass a group "
                              "to --host (one shard a host)")
    if tasks < 2:
        raise UsageError(f"--array {tasks!r}: give 2 or more tasks (one task is `inv extract` without --array)")
    refuse_nodes(host)
    request = build_request(host, given)
    return [Request(driver_args=dict(request.driver_args, shard_index=task, shard_count=tasks,
                                     output_dir=TASK_OUTPUT.format(out=request.driver_args["output_dir"].rstrip("/"),
                                                                   task=task)),
                    options=request.options, env=request.env) for task in range(tasks)]


def own_port(request: Request, task: int) -> Request:
    """A server-mode task's request with its server on the run's port + `task`: Slurm may put several tasks
    on one node (a task a GPU), where one port would serve only the first."""
    port = request.driver_args.get("port", SERVER_DEFAULTS["port"]) + task
    return dataclasses.replace(request, driver_args=dict(request.driver_args, port=port))


def extract_array(host: Host, given: dict, *, tasks: int, skip_preflight: bool) -> dict:
    """Check, launch each task's run, submit the array: {sharded_run_id, job_id, script, runs: [{task,
    run_id, out}], preflight}. A failed check is Findings (its payload: the checks); nothing is queued."""
    requests = task_requests(host, given, tasks)
    with connect(host) as remote:
        mode = check_extraction_mode(remote, host, "extract")["mode"]
        requests = [request.for_mode(mode, host) for request in requests]
        if mode == SERVER:
            requests = [own_port(request, task) for task, request in enumerate(requests)]
        refuse_impossible(remote, host, paths=[f"{host.workdir}/runs", requests[0].driver_args["output_dir"]])
        # One host, one environment: the first task's checks stand for every task's.
        checks = [] if skip_preflight else preflight(remote, host, requests[0])
        failed = [check["name"] for check in checks if not check["ok"]]
        if failed:
            raise Findings(f"{host.name}: preflight failed: {', '.join(failed)}; nothing was queued", payload=checks,
                           hint="fix what it says, or pass --skip-preflight to submit anyway")
        sharded_run_id = new_group_run_id(SHARDED_PREFIX)
        runs = []
        for task, request in enumerate(requests):
            shard = {"sharded_run_id": sharded_run_id, "hosts": [host.name], "shard_index": task, "shard_count": tasks}
            launched = runs_call(remote, host, "launch", launch_args(host, request, shard=shard,
                                                                     array={"task": task, "tasks": tasks}))
            runs.append({"task": task, "run_id": launched["run_id"], "out": request.driver_args["output_dir"]})
        submitted = runs_call(remote, host, "submit-array", {"sharded_run_id": sharded_run_id})
    return {"sharded_run_id": sharded_run_id, "job_id": submitted["job_id"], "script": submitted["script"],
            "runs": runs, "preflight": checks}


def gather_array(host: Host, run_id: str) -> tuple[GroupResult, dict]:
    """Each task's output of the sharded run on the login node, checked there (one outcome a task, named
    `<host>#<task>`), and their union."""
    outcomes = []
    with connect(host) as remote:
        runs = [run for run in runs_call(remote, host, "status", {"run": None})["runs"]
                if (run.get("shard") or {}).get("sharded_run_id") == run_id]
        if not runs:
            raise UsageError(f"{host.name}: no task of sharded run {run_id!r}",
                             hint=f"`inv status --host {host.name}` lists the runs")
        for run in sorted(runs, key=lambda found: found["shard"]["shard_index"]):
            name, started = f"{host.name}#{run['shard']['shard_index']}", time.monotonic()
            try:
                found = runs_call(remote, host, "verify-output", {"run": run["run_id"]}, timeout=GATHER_TIMEOUT_S)
                outcomes.append(HostOutcome(name, ExitStatus.OK, time.monotonic() - started, result=found))
            except SpecrigError as failed:
                outcomes.append(HostOutcome(name, failed.exit_status, time.monotonic() - started, error=failed))
    return GroupResult(tuple(outcomes)), union(outcomes)
