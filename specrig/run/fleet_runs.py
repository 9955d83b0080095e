"""One extraction over many hosts (speculators <= 0.4, the in-process driver): `inv extract` on a
group or a list, and `inv gather` (docs/runs.md, "Fleet runs").

The dataset is split by global sample index: host k of n (in the order `--host` names them) takes
the indices i with i % n == k, each file keeps its global index (data_{i}.pt), so the shards'
outputs merge as they are. One fleet-run id, made here, goes into every host's run.json
(`fleet: {fleet_run_id, hosts, shard_index, shard_count}`); `status`, `stop`, `resume`, `logs` and
`gather` find each host's run by it.
"""
from __future__ import annotations

import datetime
import random
import string
from typing import Sequence

from specrig.contract import ACTIVE_STATES, SERVER
from specrig.doctor import check_extraction_mode
from specrig.errors import Findings, UsageError
from specrig.exit_status import ExitStatus, most_serious
from specrig.fleet import HostOutcome, parallelism, run_each, run_task
from specrig.inventory import Host
from specrig.run.preflight import preflight
from specrig.run.runs import final_verdict, launch_args, runs_call, watch_run
from specrig.run.settings import MODE_NAMES, Request, build_request
from specrig.transport import connect
from specrig.ui import console, print_json
from specrig.ui.terminal import visible

FLEET_PREFIX = "fleet-"
#: A multi-node job's id (specrig/run/node_runs.py): one run per node, found by it as a fleet run's shards are.
JOB_PREFIX = "nodes-"
#: In --out (or hosts.yaml's extract.out), replaced by each host's name: hosts sharing a filesystem
#: (the lab's) need an output directory each.
HOST_FIELD = "{host}"
GATHER_TIMEOUT_S = 3600


def new_group_id(prefix: str = FLEET_PREFIX) -> str:
    """The id of a run over several hosts: a fleet run's, or with JOB_PREFIX a multi-node job's."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return prefix + stamp + "-" + "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(4))


def is_group_id(run_id: str | None) -> bool:
    """Whether `run_id` names a fleet run or a multi-node job (each host finds its own run of it)."""
    return bool(run_id) and run_id.startswith((FLEET_PREFIX, JOB_PREFIX))


def shard_requests(hosts: Sequence[Host], given: dict) -> dict[str, Request]:
    """Each host's launch: its settings (command line over its own hosts.yaml `extract:`), its
    output directory with {host} filled in, and its shard. Every bad value raises before any host
    is reached."""
    requests = {}
    for index, host in enumerate(hosts):
        request = build_request(host, given)
        driver_args = dict(request.driver_args, shard_index=index, shard_count=len(hosts))
        driver_args["output_dir"] = driver_args["output_dir"].replace(HOST_FIELD, host.name)
        requests[host.name] = Request(driver_args=driver_args, options=request.options, env=request.env)
    return requests


def extract(spec: str, hosts: Sequence[Host], given: dict, *, skip_preflight: bool, attach: bool,
            as_json: bool) -> int:
    """Preflight every host in parallel; launch on each only when every one passed; then follow
    them all on one board (or return at once with attach False)."""
    from specrig.ui import fleet as view

    requests = shard_requests(hosts, given)
    names = [host.name for host in hosts]

    modes: dict[str, str | None] = {}

    def check(host: Host) -> list[dict]:
        with connect(host) as remote:
            mode = modes[host.name] = check_extraction_mode(remote, host, "extract")["mode"]  # 0.5-0.7: exit 2
            request = requests[host.name].for_mode(mode, host)
            checks = [] if skip_preflight else preflight(remote, host, request)
        failed = [item["name"] for item in checks if not item["ok"]]
        if failed:
            raise Findings(f"{host.name}: preflight failed: {', '.join(failed)}", payload=checks)
        return checks

    outcomes = {outcome.host: outcome for outcome in run_each(hosts, check, parallel=parallelism())}
    ordered = [outcomes[name] for name in names]
    failed = [outcome for outcome in ordered if outcome.exit_status != ExitStatus.OK]
    if failed:
        if as_json:
            print_json({"launched": False, "preflight": {o.host: o.as_json() for o in ordered}})
        else:
            from specrig.run.view import show_checks

            for outcome in failed:
                if isinstance(outcome.result, list):
                    console.print(f"[bold]{outcome.host}[/]:")
                    show_checks(outcome.result)
            view.show_summary("preflight", ordered, figures=preflight_figures)
            console.print(f"nothing was launched: the preflight failed on {', '.join(o.host for o in failed)}")
        return most_serious(outcome.exit_status for outcome in failed)
    if not as_json:
        view.show_summary("preflight", ordered, figures=preflight_figures)
    by_mode: dict[str | None, list[str]] = {}
    for name in names:
        by_mode.setdefault(modes[name], []).append(name)
    if len(by_mode) > 1:
        # The two modes split a dataset differently (i % n against contiguous chunks): the union would not hold.
        raise UsageError("one fleet run needs one extraction mode, and these hosts take several: " + "; ".join(
            f"{', '.join(hosts_on)}: {MODE_NAMES.get(mode, 'none')}" for mode, hosts_on in by_mode.items()),
            hint="install the same speculators on every host (`inv doctor --host ...` shows them); nothing was "
                 "launched")

    fleet_run_id = new_group_id()
    board = view.RunsBoard(names) if attach else None

    def launch(host: Host) -> dict:
        request = requests[host.name]
        shard = {"fleet_run_id": fleet_run_id, "hosts": names, "shard_index": request.driver_args["shard_index"],
                 "shard_count": len(names)}
        with connect(host) as remote:
            launched = runs_call(remote, host, "launch", launch_args(host, request, fleet=shard))
            result = {**launched, **shard, "out": request.driver_args["output_dir"]}
            if board is None:
                return result
            return {**result, "final": watch_run(remote, host, launched["run_id"],
                                                 lambda run: board.update(host.name, run))}

    if not as_json:
        split = ("speculators' own split, in contiguous chunks" if modes[names[0]] == SERVER
                 else f"sample i goes to host i % {len(names)}")
        console.print(f"fleet run [bold]{fleet_run_id}[/]: {len(names)} shards ({split}: "
                      f"{', '.join(f'{k}={name}' for k, name in enumerate(names))})")
    return run_task(f"extract {fleet_run_id}", hosts, launch, as_json=as_json, figures=extract_figures,
                    judge=final_verdict, board=board, total=extract_total,
                    detach_note=f"detached; the runs go on. `inv status --host {spec} --run {fleet_run_id}` "
                                f"shows them, `inv stop --host {spec} --run {fleet_run_id}` stops them."
                    if attach else None,
                    parallel=len(hosts) if attach else None)


def preflight_figures(checks: list) -> str:
    return f"{len(checks)} check(s) passed" if checks else "preflight skipped"


def extract_figures(result: dict) -> str:
    text = (f"shard {result['shard_index']} of {result['shard_count']}: run {result['run_id']} launched, "
            f"writing {result['out']}")
    final = result.get("final")
    return text + (f"; {final['state']}" if final else "")


# ---- gather: the union of the shards --------------------------------------------------------------

def verify_output(host: Host, run_id: str) -> dict:
    """The host's run of the fleet run (or a run id): its output's sample indices, each loaded on the host."""
    with connect(host) as remote:
        return runs_call(remote, host, "verify-output", {"run": run_id}, timeout=GATHER_TIMEOUT_S)


def ranges(indices: Sequence[int]) -> str:
    """3, 6-8, 12: a list of indices in a few words."""
    parts: list[str] = []
    ordered = sorted(indices)
    start = previous = None
    for index in ordered + [None]:
        if start is not None and index == previous + 1:
            previous = index
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = index
    return ", ".join(parts)


def union(outcomes: Sequence[HostOutcome]) -> dict:
    """What the shards hold together: every sample index 0 .. dataset_samples - 1 exactly once, and
    each file loading whole; the missing, duplicated, out-of-range and unloadable indices named."""
    holders: dict[int, list[str]] = {}
    counts = set()
    unloadable = []
    for outcome in outcomes:
        if outcome.result is None:
            continue
        for index in outcome.result["indices"]:
            holders.setdefault(index, []).append(outcome.host)
        unloadable += [{"host": outcome.host, **bad} for bad in outcome.result["unloadable"]]
        if outcome.result.get("dataset_samples") is not None:
            counts.add(outcome.result["dataset_samples"])
    total = max(counts) if counts else None
    missing = [i for i in range(total) if i not in holders] if total is not None else []
    duplicated = {i: hosts for i, hosts in sorted(holders.items()) if len(hosts) > 1}
    out_of_range = sorted(i for i in holders if total is None or i >= total)
    failed_hosts = [outcome.host for outcome in outcomes if outcome.exit_status != ExitStatus.OK]
    active = [outcome.host for outcome in outcomes
              if outcome.result is not None and outcome.result["state"] in ACTIVE_STATES]
    problems = []
    if active:
        problems.append(f"still running on {', '.join(active)}")
    if failed_hosts:
        problems.append(f"no answer from {', '.join(failed_hosts)}")
    if total is None:
        problems.append("the dataset's sample count is unknown: no shard wrote its data_config.json yet")
    if len(counts) > 1:
        problems.append(f"the shards disagree on the dataset's sample count: {sorted(counts)}")
    if missing:
        problems.append(f"{len(missing)} missing: {ranges(missing)}")
    if duplicated:
        problems.append(f"{len(duplicated)} duplicated: " + "; ".join(f"{i} on {', '.join(h)}"
                                                                      for i, h in list(duplicated.items())[:20]))
    if out_of_range and total is not None:
        problems.append(f"{len(out_of_range)} beyond the dataset's {total}: {ranges(out_of_range)}")
    if unloadable:
        problems.append(f"{len(unloadable)} do not load whole: " + "; ".join(
            f"{bad['index']} on {bad['host']} ({bad['reason']})" for bad in unloadable[:10]))
    return {"complete": not problems, "dataset_samples": total, "samples": sum(map(len, holders.values())),
            "missing": missing, "duplicated": {str(i): h for i, h in duplicated.items()},
            "out_of_range": out_of_range if total is not None else [], "unloadable": unloadable,
            "problems": problems}


def gather(hosts: Sequence[Host], run_id: str, *, as_json: bool) -> int:
    """Each host's shard of the fleet run, checked on its host; then the union. Exit 1 when it is
    not every index exactly once, each loading whole."""
    from specrig.ui import fleet as view

    outcomes = {outcome.host: outcome for outcome in run_each(hosts, lambda host: verify_output(host, run_id),
                                                             parallel=parallelism())}
    ordered = [outcomes[host.name] for host in hosts]
    found = union(ordered)
    status = most_serious([*(o.exit_status for o in ordered),
                           ExitStatus.OK if found["complete"] else ExitStatus.FINDINGS])
    if as_json:
        print_json({"run": run_id, **found, "hosts": {o.host: o.as_json() for o in ordered}})
        return status
    view.show_summary(f"gather {run_id}", ordered, figures=gather_figures)
    if found["complete"]:
        console.print(f"complete: {found['dataset_samples']} samples, every index once, each loads whole "
                      f"(outputs: {visible(', '.join(o.host + ':' + o.result['out'] for o in ordered))})", markup=False)
    else:
        console.print("incomplete: " + visible("; ".join(found["problems"])), style="bold red", markup=False)
    return status


def gather_figures(result: dict) -> str:
    fleet = result.get("fleet") or {}
    shard = (f"shard {fleet['shard_index']} of {fleet['shard_count']}, " if fleet else "")
    bad = f", {len(result['unloadable'])} do not load" if result["unloadable"] else ""
    where = "no output directory" if result.get("missing_dir") else result["out"]
    return f"{shard}run {result['run_id']} {result['state']}: {len(result['indices'])} sample(s){bad} in {where}"


def status_total(outcomes: Sequence[HostOutcome]) -> str | None:
    """The total line of `inv status` on many hosts: the samples of each host's run shown (the one
    asked for, else its newest) added up."""
    return runs_total([runs[-1] for outcome in outcomes
                       if outcome.exit_status == ExitStatus.OK for runs in [(outcome.result or {}).get("runs")]
                       if runs])


def extract_total(outcomes: Sequence[HostOutcome]) -> str | None:
    """The total line of an attached fleet extraction: each host's run as it ended."""
    return runs_total([outcome.result["final"] for outcome in outcomes
                       if isinstance(outcome.result, dict) and outcome.result.get("final")])


def runs_total(runs: Sequence[dict]) -> str | None:
    done = total = hosts = 0
    states: dict[str, int] = {}
    for run in runs:
        beat = run.get("heartbeat") or {}
        hosts += 1
        states[run["state"]] = states.get(run["state"], 0) + 1
        done += beat.get("samples_done") or 0
        total += beat.get("samples_total") or 0
    if not hosts:
        return None
    return (f"total: {done}/{total or '?'} samples over {hosts} host(s) ("
            + ", ".join(f"{n} {state}" for state, n in states.items()) + ")")
