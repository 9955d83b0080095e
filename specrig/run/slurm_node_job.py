"""A multi-node job inside one Slurm allocation: `inv extract --host LOGIN --nodes dp|tp-pp` on a cluster's
login node (docs/slurm.md, "A multi-node job in one allocation"). Data only (specrig/slurm/view.py shows it).

The job is the one node_runs.py starts over SSH (one server-mode run per node under one job id, the
head's settings every node's, remote/base/nodes.py records, node_roles.py's head and workers),
with Slurm in the hosts' place: the runs are launched on the login node (runs.launch with `nodes` and
`slurm`: their directories, not yet submitted), then `runs.submit-nodes` submits one job of
`slurm.nodes` nodes. Its script (remote/slurm/jobs.py nodes_script) runs the head's supervisor on the
allocation's first node and each worker's in an `srun --overlap` step on its node; the nodes' names and
addresses, unknown until Slurm allocates them, are filled in then (remote/run/slurm_allocation.py).
"""
from __future__ import annotations

from specrig.contract import SERVER
from specrig.doctor import check_extraction_mode
from specrig.errors import Findings, UsageError
from specrig.inventory import Host
from specrig.run.node_runs import layout, port_number
from specrig.run.preflight import preflight
from specrig.run.runs import launch_args, runs_call
from specrig.run.settings import build_request
from specrig.run.sharded_runs import JOB_PREFIX, new_group_run_id
from specrig.slurm.submit import refuse_impossible, slurm_settings
from specrig.transport import connect

#: A node's name and address before Slurm has allocated the job (remote/run/slurm_allocation.py replaces them).
UNALLOCATED = "(allocated at the job's start)"


def plan_job(host: Host, given: dict, *, mode: str, pp: int | None = None, dp_local: int | None = None,
             rendezvous_port: int | None = None, watch_port: int | None = None) -> tuple:
    """The request (every node's settings) and each node's record, by rank; every bad value raises before
    the login node is reached."""
    settings = slurm_settings(host)
    nnodes = settings.get("nodes") or 1
    if nnodes < 2:
        raise UsageError(f"--nodes {mode!r} on {host.name}: hosts.{host.name}.slurm.nodes is {nnodes!r}, and a "
                         f"multi-node job needs two nodes or more",
                         hint=f"set hosts.{host.name}.slurm.nodes to the job's node count, e.g. 2")
    request = build_request(host, given)
    try:
        shape = layout.layout(mode, nnodes, tensor_parallel_size=request.driver_args.get("tensor_parallel_size"),
                              pipeline_parallel_size=pp, data_parallel_size_local=dp_local)
    except ValueError as exc:
        raise UsageError(f"--nodes {mode!r}: {exc}") from None
    job_id = new_group_run_id(JOB_PREFIX)
    unallocated = [UNALLOCATED] * nnodes
    records = [layout.record(job_id, shape, node_rank=rank, hosts=unallocated, addresses=unallocated,
                             rendezvous_port=port_number(rendezvous_port, option="--rendezvous-port"),
                             watch_port=port_number(watch_port, option="--watch-port"))
               for rank in range(nnodes)]
    return request, records


def extract_job(host: Host, given: dict, *, mode: str, sizes: dict, skip_preflight: bool) -> dict:
    """Check, launch each node's run, submit the job: {job_id, slurm_job_id, script, describe, runs: [{rank,
    role, run_id}], preflight}. A failed check is Findings (its payload: the checks); nothing is queued."""
    request, records = plan_job(host, given, mode=mode, **sizes)
    with connect(host) as remote:
        found = check_extraction_mode(remote, host, "extract")  # 0.5-0.7: its own exit 2
        if found["mode"] != SERVER:
            raise UsageError(f"{host.name}: a multi-node job runs vLLM's server (speculators >= 0.8); speculators "
                             f"{found['packages'].get('speculators') or 'is not installed'} generates in process, "
                             f"on one node by design", hint="nothing was queued; point python at an environment "
                                                            "with speculators >= 0.8 and set server_python")
        request = request.for_mode(SERVER, host)
        refuse_impossible(remote, host, paths=[f"{host.workdir}/runs", request.driver_args["output_dir"]])
        # One login node, one environment: the head's one-node checks stand for every node's.
        checks = [] if skip_preflight else preflight(remote, host, request)
        failed = [check["name"] for check in checks if not check["ok"]]
        if failed:
            raise Findings(f"{host.name}: preflight failed: {', '.join(failed)}; nothing was queued", payload=checks,
                           hint="fix what it says, or pass --skip-preflight to submit anyway")
        job_id = records[0]["job_id"]
        runs = [{"rank": record["node_rank"], "role": record["role"],
                 "run_id": runs_call(remote, host, "launch", launch_args(host, request, nodes=record))["run_id"]}
                for record in records]
        submitted = runs_call(remote, host, "submit-nodes", {"job_id": job_id})
    return {"launched": True, "job_id": job_id, "slurm_job_id": submitted["job_id"], "script": submitted["script"],
            "describe": layout.describe(records[0]), "out": request.driver_args["output_dir"], "runs": runs,
            "preflight": checks, "layers_source": request.sources.get("layers")}
