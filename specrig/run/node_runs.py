"""A target larger than one host: `inv extract --host GROUP --nodes dp|tp-pp` (docs/runs.md, "Multi-node").

vLLM spans the nodes itself (data parallel, or tensor x pipeline parallel); specrig starts one server-mode
run per node under one job id (`nodes-<UTC stamp>-xxxx`, made here), the head (the group's first host,
whose settings every node takes) first, and follows them as one. Each run.json holds its node's part,
`nodes: {job_id, role, node_rank, nnodes, hosts, addresses, master_addr, rendezvous_port, watch_port,
mode, ...sizes}` (remote/run/server/nodes.py, loaded here from its file to check the shape before any
host is reached). `status`, `logs`, `stop` and `resume` take the job id as they take a fleet-run id.

The preflight checks what it can before anything starts: each node alone (the head: the whole
server-mode preflight; a worker: its server environment, model, GPUs, torch build, ports, and
verify-signatures), then the nodes against each other: the same versions, patches and model on every
node, the GPU counts adding up to the world, the rendezvous and watch ports reachable between head and
workers, and the connector's staging directory one storage for all (each engine writes the states of
its requests on its own node; the client on the head moves them).
"""
from __future__ import annotations

import importlib.util
import uuid
from typing import Sequence

from specrig.contract import SERVER
from specrig.errors import Findings, UsageError
from specrig.exit_status import ExitStatus, most_serious
from specrig.fleet import parallelism, run_each, run_task
from specrig.inventory import Host
from specrig.patching.engine import IN_FORCE, patch_status
from specrig.paths import remote_dir
from specrig.run.fleet_runs import JOB_PREFIX, new_group_id
from specrig.run.preflight import PREFLIGHT_TIMEOUT_S, preflight, verify_check
from specrig.run.runs import final_verdict, launch_args, runs_call, stop_run, watch_run
from specrig.run.settings import Request, build_request
from specrig.transport import connect
from specrig.ui import console, print_json

#: How long the nodes have to reach each other in the rendezvous check.
RENDEZVOUS_TIMEOUT_S = 20


def _load_layout():
    """remote/run/server/nodes.py, the one definition of a job's shape and records (it imports nothing)."""
    spec = importlib.util.spec_from_file_location("specrig._host.nodes", remote_dir() / "run" / "server" / "nodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


layout = _load_layout()
MODES: tuple[str, ...] = layout.MODES


def node_address(host: Host) -> str:
    """The address the other nodes reach `host` at: VLLM_HOST_IP in its hosts.yaml `env:` (vLLM's own
    variable for it), else its hostname."""
    return str(host.env.get("VLLM_HOST_IP") or host.hostname or host.name)


def port_number(value: int | None, *, option: str) -> int | None:
    if value is not None and not 0 < value < 65536:
        raise UsageError(f"{option} {value!r}: give a port number, 1-65535")
    return value


def plan_job(hosts: Sequence[Host], given: dict, *, mode: str, pp: int | None = None, dp_local: int | None = None,
             rendezvous_port: int | None = None, watch_port: int | None = None) -> tuple[Request, dict[str, dict]]:
    """The head's request (every node's settings) and each node's record; every bad value raises before any
    host is reached."""
    if len(hosts) < 2:
        raise UsageError(f"--nodes {mode!r}: a multi-node job needs a group of two hosts or more; "
                         f"{', '.join(h.name for h in hosts)} is one", hint="name a group or a comma list in --host")
    request = build_request(hosts[0], given)
    try:
        shape = layout.layout(mode, len(hosts), tensor_parallel_size=request.driver_args.get("tensor_parallel_size"),
                              pipeline_parallel_size=pp, data_parallel_size_local=dp_local)
    except ValueError as exc:
        raise UsageError(f"--nodes {mode!r}: {exc}") from None
    job_id = new_group_id(JOB_PREFIX)
    names, addresses = [h.name for h in hosts], [node_address(h) for h in hosts]
    records = {host.name: layout.record(job_id, shape, node_rank=rank, hosts=names, addresses=addresses,
                                        rendezvous_port=port_number(rendezvous_port, option="--rendezvous-port"),
                                        watch_port=port_number(watch_port, option="--watch-port"))
               for rank, host in enumerate(hosts)}
    return request, records


def node_request(host: Host, request: Request, record: dict) -> Request:
    """A node's launch: the head's settings and options, this host's environment with its address for vLLM."""
    return Request(driver_args=request.driver_args, options=request.options, sources=request.sources,
                   env={**host.env, "VLLM_HOST_IP": record["addresses"][record["node_rank"]]})


def refuse_in_process(head: Host) -> None:
    """Exit 2 unless the head takes server mode: speculators <= 0.4 generates in process, on one host."""
    from specrig.doctor import check_extraction_mode

    with connect(head) as remote:
        found = check_extraction_mode(remote, head, "extract")  # 0.5-0.7: its own exit 2
    if found["mode"] != SERVER:
        raise UsageError(f"{head.name}: a multi-node job runs vLLM's server (speculators >= 0.8); speculators "
                         f"{found['packages'].get('speculators') or 'is not installed'} generates in process, on "
                         f"one host by design",
                         hint="nothing was launched; without --nodes a group is a fleet run, one shard per host")


# ---- preflight --------------------------------------------------------------------------------

def node_preflight(host: Host, request: Request, record: dict) -> dict:
    """One node's checks and the facts the nodes are compared by: {checks, facts, patches}."""
    head = record["role"] == layout.HEAD
    with connect(host) as remote:
        facts = remote.call("node-preflight.facts", {"driver_args": request.driver_args,
                                               "nodes": record, "server_python": host.server_python},
                            timeout=PREFLIGHT_TIMEOUT_S)
        if head:
            # The whole server-mode preflight, its GPU check counting this node's share of the world.
            share = Request(driver_args=dict(request.driver_args, tensor_parallel_size=record["gpus_per_node"]),
                            options=request.options, env=request.env, sources=request.sources)
            checks = preflight(remote, host, share)
        else:
            checks = [verify_check(remote, host, request.driver_args.get("model"))]
    names = {check["name"] for check in checks}
    checks += [check for check in facts["checks"] if check["name"] not in names]
    patches = patch_status(host)["patches"]
    return {"checks": checks, "facts": facts,
            "patches": sorted(p["id"] for p in patches if p["state"] in IN_FORCE)}


def check(name: str, ok: bool, detail: str, advice: str | None = None) -> dict:
    return {"name": name, "ok": bool(ok), "detail": detail, "advice": None if ok else advice}


def same_on_every_node(name: str, values: dict[str, object], *, what: str, advice: str) -> dict:
    """One check: `values` (host → what it holds) agree."""
    distinct: dict[str, list[str]] = {}
    for host, value in values.items():
        distinct.setdefault(repr(value), []).append(host)
    if len(distinct) == 1:
        return check(name, True, f"{what}: {next(iter(values.values()))!r} on every node")
    return check(name, False, f"{what} differ: " + "; ".join(f"{', '.join(hosts)}: {value}"
                                                             for value, hosts in distinct.items()), advice)


def gpus_add_up(record: dict, visible: dict[str, int | None]) -> dict:
    """Each node sees the GPUs of its share (world / nodes) and the shares make the world; a node without
    nvidia-smi (None: vLLM's CPU backend) takes one rank."""
    need, nodes = record["gpus_per_node"], record["nnodes"]
    usable = {host: min(need, count if count is not None else 1) for host, count in visible.items()}
    short = [f"{host} sees {'no GPU (CPU)' if visible[host] is None else visible[host]}"
             for host, count in usable.items() if count < need]
    detail = (f"{nodes} nodes x {need} = {nodes * need} ({layout.describe(record)}); visible: "
              + ", ".join(f"{host} {'CPU' if count is None else count}" for host, count in visible.items()))
    return check("gpus-add-up", not short and sum(usable.values()) == nodes * need, detail,
                 f"{'; '.join(short)}: every node needs {need}; change --tp/--pp/--dp-local, or CUDA_VISIBLE_DEVICES "
                 f"in hosts.yaml")


def cross_checks(record: dict, found: dict[str, dict]) -> list[dict]:
    """The nodes against each other, from each node's preflight (`found`: host → node_preflight())."""
    facts = {host: item["facts"] for host, item in found.items()}
    return [
        same_on_every_node("same-versions", {h: f["versions"] for h, f in facts.items()},
                           what="vllm, torch, transformers of the server environment",
                           advice="install the same versions on every node (`inv doctor --host GROUP`)"),
        same_on_every_node("same-patches", {h: item["patches"] for h, item in found.items()},
                           what="patches in force", advice="`inv apply-patches --host GROUP` on every node"),
        same_on_every_node("same-model", {h: (f["model"] or {}).get("sha256") for h, f in facts.items()},
                           what="the model (config.json and file sizes)",
                           advice="copy the same model (or hub snapshot) to every node"),
        gpus_add_up(record, {h: f["gpus"] for h, f in facts.items()}),
    ]


def rendezvous(hosts: Sequence[Host], request: Request, records: dict[str, dict]) -> list[dict]:
    """Every node at once: the workers reach the head's rendezvous port, the head each worker's watch port,
    and each worker reads the token the head wrote into the staging directory."""
    token = uuid.uuid4().hex

    def meet(host: Host) -> dict:
        with connect(host) as remote:
            return remote.call("node-preflight.rendezvous", {"driver_args": request.driver_args,
                                                  "nodes": records[host.name], "token": token,
                                                  "timeout_s": RENDEZVOUS_TIMEOUT_S}, timeout=RENDEZVOUS_TIMEOUT_S + 60)

    outcomes = {o.host: o for o in run_each(hosts, meet, parallel=len(hosts))}
    head, record = hosts[0].name, records[hosts[0].name]
    if outcomes[head].result is None:
        return [check("rendezvous", False, f"{head}: {outcomes[head].error.one_line()}")]
    met = outcomes[head].result
    where = f"{record['master_addr']}:{record['rendezvous_port']}"
    problems, staging = [], []
    if met["listen_error"]:
        problems.append(f"{head}: {met['listen_error']}")
    for host in hosts[1:]:
        rank, outcome = str(records[host.name]["node_rank"]), outcomes[host.name]
        if outcome.result is None:
            problems.append(f"{host.name}: {outcome.error.one_line()}")
            continue
        result = outcome.result
        if result["reached"] is not True:
            problems.append(f"{host.name} cannot reach the head at {where}: {result['reached']}")
        if met["reached"].get(rank) is not True:
            problems.append(f"{head} cannot reach {host.name}'s watch port: {met['reached'].get(rank)}")
        if result["staging"] != "shared":
            staging.append(f"{host.name}: {result['staging'] or 'not checked'}")
    return [check("rendezvous", not problems,
                  "; ".join(problems) or f"{len(hosts) - 1} worker(s) reached {where}; the head reached their watch "
                                         f"port {record['watch_port']}",
                  "open the rendezvous and watch ports between the nodes (vLLM also opens ports it picks at "
                  "random: the nodes must reach each other on any port), or set VLLM_HOST_IP in each host's env:"),
            check("staging-shared", not staging,
                  "; ".join(staging) or "every node reads what the head wrote into the connector's staging directory",
                  "put --out (or extract.staging) on storage every node mounts at the same path: each engine writes "
                  "the states of its requests on its own node")]


def job_preflight(hosts: Sequence[Host], request: Request, records: dict[str, dict], *, as_json: bool) -> int:
    """Every check; ExitStatus.OK when all pass, else the failures shown and the most serious status."""
    from specrig.run.view import show_checks
    from specrig.ui import fleet as view

    def one(host: Host) -> dict:
        found = node_preflight(host, request, records[host.name])
        failed = [item["name"] for item in found["checks"] if not item["ok"]]
        if failed:
            raise Findings(f"{host.name}: preflight failed: {', '.join(failed)}", payload=found)
        return found

    outcomes = {o.host: o for o in run_each(hosts, one, parallel=parallelism())}
    ordered = [outcomes[h.name] for h in hosts]
    found = {o.host: o.result for o in ordered if isinstance(o.result, dict) and "facts" in o.result}
    job = cross_checks(records[hosts[0].name], found) if len(found) == len(hosts) else []
    if all(o.exit_status == ExitStatus.OK for o in ordered):
        job += rendezvous(hosts, request, records)
    statuses = [o.exit_status for o in ordered] + [ExitStatus.OK if c["ok"] else ExitStatus.FINDINGS for c in job]
    status = most_serious(statuses)
    if as_json and status != ExitStatus.OK:
        print_json({"launched": False, "preflight": {o.host: o.as_json() for o in ordered}, "job": job})
    elif not as_json:
        for outcome in ordered:
            if status != ExitStatus.OK and isinstance(outcome.result, dict) and "checks" in outcome.result:
                console.print(f"[bold]{outcome.host}[/]:")
                show_checks(outcome.result["checks"])
        view.show_summary("preflight", ordered, figures=lambda r: f"{len(r['checks'])} check(s)")
        if job:
            console.print("[bold]the nodes together[/]:")
            show_checks(job)
        if status != ExitStatus.OK:
            console.print("nothing was launched: the preflight failed")
    return status


# ---- launch and follow ------------------------------------------------------------------------

def extract(spec: str, hosts: Sequence[Host], given: dict, *, mode: str, pp: int | None, dp_local: int | None,
            rendezvous_port: int | None, watch_port: int | None, skip_preflight: bool, attach: bool,
            as_json: bool) -> int:
    """Check, launch the head then each worker, and follow the job's nodes as one (attach False: return at once)."""
    from specrig.ui import fleet as view

    request, records = plan_job(hosts, given, mode=mode, pp=pp, dp_local=dp_local, rendezvous_port=rendezvous_port,
                                watch_port=watch_port)
    head = hosts[0]
    refuse_in_process(head)
    request = request.for_mode(SERVER, head)
    if not skip_preflight:
        status = job_preflight(hosts, request, records, as_json=as_json)
        if status != ExitStatus.OK:
            return status
    job_id = records[head.name]["job_id"]
    launched = {}
    try:
        for host in hosts:  # the head first: its server leads the rendezvous the workers join
            with connect(host) as remote:
                launched[host.name] = runs_call(remote, host, "launch", launch_args(
                    host, node_request(host, request, records[host.name]), nodes=records[host.name]))
    except BaseException:
        for name in launched:  # a job without all its nodes is no job: nothing is left half-launched
            stop_run(next(h for h in hosts if h.name == name), job_id)
        raise
    if as_json:
        print_json({"launched": True, "job_id": job_id, "nodes": {
            name: {**run, "node_rank": records[name]["node_rank"], "role": records[name]["role"]}
            for name, run in launched.items()}})
        return ExitStatus.OK
    console.print(f"multi-node job [bold]{job_id}[/]: {layout.describe(records[head.name])}; head {head.name} "
                  f"({records[head.name]['master_addr']}), workers {', '.join(h.name for h in hosts[1:])}")
    if not attach:
        return ExitStatus.OK
    board = view.RunsBoard([h.name for h in hosts])

    def follow(host: Host) -> dict:
        with connect(host) as remote:
            run_id = launched[host.name]["run_id"]
            return {"run_id": run_id, "role": records[host.name]["role"],
                    "final": watch_run(remote, host, run_id, lambda run: board.update(host.name, run))}

    return run_task(f"extract {job_id}", hosts, follow, as_json=False, judge=final_verdict, board=board,
                    figures=lambda r: f"{r['role']}: run {r['run_id']} {r['final']['state']}",
                    detach_note=f"detached; the job goes on. `inv status --host {spec} --run {job_id}` shows it, "
                                f"`inv stop --host {spec} --run {job_id}` stops every node.",
                    parallel=len(hosts))
