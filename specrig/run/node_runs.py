"""A target larger than one host: `inv extract --host GROUP --nodes dp|tp-pp` (docs/runs.md, "Multi-node").

vLLM spans the nodes itself (data parallel, or tensor x pipeline parallel); specrig starts one server-mode
run per node under one job id (`nodes-<UTC stamp>-xxxx`, made here), the head (the group's first host,
whose settings every node takes) first, and follows them as one. Each run.json holds its node's part,
`nodes: {job_id, role, node_rank, nnodes, hosts, addresses, master_addr, rendezvous_port, watch_port,
mode, ...sizes}` (remote/base/nodes.py, loaded here from its file to check the shape before any
host is reached). `status`, `logs`, `stop` and `resume` take the job id as they take a sharded run's id.
Data only: run/node_view.py shows it, specrig/cli/extract.py sequences it.

The preflight checks what it can before anything starts: each node alone (the head: the whole
server-mode preflight; a worker: its server environment, model, GPUs, torch build, ports, and
verify-signatures), then the nodes against each other: the same versions, patches and model on every
node, the GPU counts adding up to the world, the rendezvous and watch ports reachable between head and
workers, and the connector's staging directory one storage for all (each engine writes the states of
its requests on its own node; the client on the head moves them).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from specrig.contract import SERVER, load_host_module
from specrig.errors import Findings, UsageError
from specrig.exit_status import ExitStatus, most_serious
from specrig.group import GroupResult, run_each, run_group
from specrig.inventory import Host
from specrig.patching.patches import IN_FORCE, patch_status
from specrig.run.preflight import PREFLIGHT_TIMEOUT_S, preflight, verify_check
from specrig.run.runs import follow_run, launch_args, runs_call, stop
from specrig.run.settings import Request, build_request
from specrig.run.sharded_runs import JOB_PREFIX, new_group_run_id
from specrig.transport import connect

#: How long the nodes have to reach each other in the rendezvous check.
RENDEZVOUS_TIMEOUT_S = 20


#: remote/base/nodes.py, the one definition of a job's shape and records (it imports nothing).
layout = load_host_module("base/nodes")
#: remote/run/storage.py: what a host that misses another's token saw, in words.
storage = load_host_module("run/storage")
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
    job_id = new_group_run_id(JOB_PREFIX)
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
                         hint="nothing was launched; without --nodes a group is a sharded run, one shard per host")


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
            checks = [verify_check(remote, host, request.driver_args.get("model"), request.driver_args.get("storage"))]
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


def not_shared(worker: str, head: str, result: dict) -> str:
    """Why `worker` failed staging-shared, from its rendezvous result: the path it read and what it found."""
    if result["staging"] is None:
        return f"{worker}: not checked (it never reached the head)"
    return (f"{worker} does not see the token {head} (the head) wrote in {result['staging_path']}: "
            f"{storage.why_not_seen(result['staging'])}")


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
            staging.append(not_shared(host.name, head, result))
    return [check("rendezvous", not problems,
                  "; ".join(problems) or f"{len(hosts) - 1} worker(s) reached {where}; the head reached their watch "
                                         f"ports ({record['watch_port']} + their rank)",
                  "open the rendezvous and watch ports between the nodes (vLLM also opens ports it picks at "
                  "random: the nodes must reach each other on any port), or set VLLM_HOST_IP in each host's env:"),
            check("staging-shared", not staging,
                  "; ".join(staging) or "every node reads what the head wrote into the connector's staging directory",
                  "put --out (or extract.staging) on storage every node mounts at the same path: each engine writes "
                  "the states of its requests on its own node")]


def job_preflight(hosts: Sequence[Host], request: Request, records: dict[str, dict]) -> tuple[GroupResult, list[dict]]:
    """Every node's checks (each a Findings when one failed, its payload node_preflight()'s), then the
    nodes against each other and, when every node passed, the rendezvous: (the nodes, the job's checks)."""

    def one(host: Host) -> dict:
        found = node_preflight(host, request, records[host.name])
        failed = [item["name"] for item in found["checks"] if not item["ok"]]
        if failed:
            raise Findings(f"{host.name}: preflight failed: {', '.join(failed)}", payload=found)
        return found

    nodes = run_group(hosts, one)
    found = {o.host: o.result for o in nodes.outcomes if isinstance(o.result, dict) and "facts" in o.result}
    job = cross_checks(records[hosts[0].name], found) if len(found) == len(hosts) else []
    if not nodes.failed:
        job += rendezvous(hosts, request, records)
    return nodes, job


def job_status(nodes: GroupResult, job: list[dict]) -> ExitStatus:
    """What the preflight came to: the most serious of the nodes' statuses and the job's checks'."""
    return most_serious([nodes.exit_status] + [ExitStatus.OK if c["ok"] else ExitStatus.FINDINGS for c in job])


# ---- launch and follow ------------------------------------------------------------------------

def launch_job(hosts: Sequence[Host], request: Request, records: dict[str, dict]) -> dict[str, dict]:
    """Launch the head, then each worker (the head's server leads the rendezvous the workers join):
    host → its launch. A job without all its nodes is no job: on any failure the launched nodes are stopped."""
    job_id = records[hosts[0].name]["job_id"]
    launched = {}
    try:
        for host in hosts:
            with connect(host) as remote:
                launched[host.name] = {**runs_call(remote, host, "launch", launch_args(
                    host, node_request(host, request, records[host.name]), nodes=records[host.name])),
                    "layers_source": request.sources.get("layers")}
    except BaseException:
        for name in launched:
            stop(next(h for h in hosts if h.name == name), job_id)
        raise
    return launched


def follow_node(host: Host, run_id: str, role: str, on_update: Callable[[dict], None]) -> dict:
    """A node's run followed until it ends: {run_id, role, final}."""
    return {"run_id": run_id, "role": role, "final": follow_run(host, run_id, on_update)}
