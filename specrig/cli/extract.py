"""`inv extract` and `inv gather`: the data functions of the run stage (run/runs.py, run/sharded_runs.py,
run/node_runs.py) sequenced, each step shown by their views (run/view.py, run/sharded_view.py,
run/node_view.py, slurm/view.py) and run/live.py.

`--host` decides: one host (one run, specrig/cli/runner.py), a group (a sharded run: one shard a host),
or with --nodes a group as one multi-node job.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specrig.cli.runner import run_on_group, run_on_host
from specrig.contract import SERVER
from specrig.errors import UsageError
from specrig.exit_status import ExitStatus, most_serious
from specrig.inventory import Host
from specrig.run import (
    live,
    node_runs,
    node_view,
    runs,
    sharded_runs,
    sharded_view,
    sizing,
    slurm_job_array,
    slurm_node_job,
    view,
    view_parts,
)
from specrig.run.settings import settings_given
from specrig.slurm import view as slurm_view
from specrig.slurm.submit import refuse_slurm_hosts, slurm_settings


def extract_on_host(host: Host, given: dict, *, skip_preflight: bool, attach: bool, as_json: bool) -> ExitStatus:
    """One run: preflight, launch, and (attached) the live view until it ends or Ctrl-C detaches."""
    return run_on_host(host, lambda target: runs.extract(target, given, skip_preflight=skip_preflight),
                       view.extract_view(live.follow if attach else None), as_json=as_json)


def extract_dry_run(host: Host, given: dict, *, as_json: bool) -> ExitStatus:
    """What a run of the model would need on `host` and the settings specrig would choose: from the model's
    config.json on this machine (--model, else extract.model, a directory here) and hosts.yaml's description
    of the host (run/sizing.py); nothing is reached."""
    gpus, memory = sizing.host_description(host)
    values, sources = settings_given(host, given, ("model", "tp", "layers", "max_len", "concurrency", "storage",
                                                        "gpu_memory_utilization"))
    model = values.get("model")
    config_path = Path(model).expanduser() / "config.json" if model else None
    if config_path is None or not config_path.is_file():
        raise UsageError(f"{sources.get('model', '--model')} {model!r}: --dry-run reads the model's config.json on "
                         "this machine, and there is none there", hint="copy the model's config.json into a "
                         "directory here and pass that directory with --model")
    config = sizing.read_config(config_path)
    layers = values.get("layer_ids")
    found = sizing.plan(config, gpus=gpus, gpu_memory_mib=memory, tp=values.get("tensor_parallel_size"),
                        max_len=values.get("max_length"), layer_count=len(layers) if layers else None,
                        storage=values.get("storage"), concurrency=values.get("concurrency"),
                        gpu_memory_utilization=values.get("gpu_memory_utilization"))
    view.show_sizing(dict(found, host=host.name, model=str(model)), as_json=as_json)
    return ExitStatus.OK


def extract_sharded(spec: str, hosts: Sequence[Host], given: dict, *, shared_out: bool, skip_preflight: bool,
                    attach: bool, as_json: bool) -> ExitStatus:
    """Preflight every host in parallel; launch on each only when every one passed; then follow them all
    on one board (or return at once with attach False)."""
    refuse_slurm_hosts(hosts, "a sharded run")
    requests = sharded_runs.shard_requests(hosts, given, shared_out=shared_out)
    preflight, modes = sharded_runs.preflight_shards(hosts, requests, skip_preflight=skip_preflight,
                                                     shared_out=shared_out)
    sharded_view.show_shards_preflight(preflight, as_json=as_json)
    if preflight.failed:
        return preflight.exit_status
    mode = sharded_runs.one_mode(modes)
    if shared_out and mode != SERVER:
        raise UsageError("--shared-out: these hosts extract in process (speculators <= 0.4), where each shard "
                         "writes its own data_config.json into its output", hint="put {host} in --out; nothing "
                         "was launched")
    sharded_run_id = sharded_runs.new_group_run_id(sharded_runs.SHARDED_PREFIX)
    names = [host.name for host in hosts]
    board = live.RunsBoard(names) if attach else None

    def launch(host: Host) -> dict:
        return sharded_runs.launch_shard(
            host, requests[host.name], sharded_run_id=sharded_run_id, names=names, shared_out=shared_out,
            on_launched=None if as_json else lambda launched: view_parts.show_layers_note(launched, host=host.name),
            on_update=(lambda run: board.update(host.name, run)) if board else None)

    if not as_json:
        sharded_view.show_sharded_run(sharded_run_id, names, server=mode == SERVER)
    return run_on_group(hosts, launch, sharded_view.shards_view(sharded_run_id), as_json=as_json, board=board,
                        detach_note=f"detached; the runs go on. `inv status --host {spec} --run {sharded_run_id}` "
                                    f"shows them, `inv stop --host {spec} --run {sharded_run_id}` stops them."
                        if attach else None)


def extract_job(spec: str, hosts: Sequence[Host], given: dict, *, mode: str, sizes: dict, skip_preflight: bool,
                attach: bool, as_json: bool) -> ExitStatus:
    """Check, launch the head then each worker, and follow the job's nodes as one (attach False: return at
    once). `sizes`: pp, dp_local, rendezvous_port, watch_port (None: their defaults). On one Slurm login
    node the job is one Slurm job of slurm.nodes nodes, submitted (specrig/run/slurm_node_job.py)."""
    if len(hosts) == 1 and slurm_settings(hosts[0]) is not None:
        return run_on_host(hosts[0], lambda target: slurm_node_job.extract_job(
            target, given, mode=mode, sizes=sizes, skip_preflight=skip_preflight), slurm_view.NODE_JOB, as_json=as_json)
    refuse_slurm_hosts(hosts, "a multi-node job over several login nodes (--nodes)")
    request, records = node_runs.plan_job(hosts, given, mode=mode, **sizes)
    head = hosts[0]
    node_runs.refuse_in_process(head)
    request = request.for_mode(SERVER, head)
    if not skip_preflight:
        nodes, job = node_runs.job_preflight(hosts, request, records)
        status = node_runs.job_status(nodes, job)
        node_view.show_job_preflight(nodes, job, status, as_json=as_json)
        if status != ExitStatus.OK:
            return status
    job_id = records[head.name]["job_id"]
    launched = node_runs.launch_job(hosts, request, records)
    node_view.show_job_launched(job_id, records, launched, node_runs.layout.describe(records[head.name]),
                                as_json=as_json)
    if as_json or not attach:
        return ExitStatus.OK
    board = live.RunsBoard([h.name for h in hosts])

    def follow(host: Host) -> dict:
        return node_runs.follow_node(host, launched[host.name]["run_id"], records[host.name]["role"],
                                     lambda run: board.update(host.name, run))

    return run_on_group(hosts, follow, node_view.job_view(job_id), as_json=False, board=board,
                        detach_note=f"detached; the job goes on. `inv status --host {spec} --run {job_id}` shows it, "
                                    f"`inv stop --host {spec} --run {job_id}` stops every node.")


def extract_array(host: Host, given: dict, *, tasks: int, skip_preflight: bool, as_json: bool) -> ExitStatus:
    """A sharded run as one Slurm job array on a login node: checks, the tasks' runs, one submission."""
    return run_on_host(host, lambda target: slurm_job_array.extract_array(target, given, tasks=tasks,
                                                                    skip_preflight=skip_preflight),
                       slurm_view.JOB_ARRAY, as_json=as_json)


def gather(hosts: Sequence[Host], run_id: str, *, as_json: bool) -> ExitStatus:
    """Each host's shard checked on its host, then their union: exit 1 unless every index is there once,
    each loading whole. On one Slurm login node, the tasks of its job array are the shards."""
    if len(hosts) == 1 and slurm_settings(hosts[0]) is not None:
        shards, found = slurm_job_array.gather_array(hosts[0], run_id)
    else:
        shards, found = sharded_runs.gather(hosts, run_id)
    sharded_view.show_gather(run_id, shards, found, as_json=as_json)
    return most_serious([shards.exit_status, ExitStatus.OK if found["complete"] else ExitStatus.FINDINGS])
