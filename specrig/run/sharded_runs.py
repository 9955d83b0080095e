"""A sharded run: one extraction over a group of hosts, each host one shard of the dataset: `inv
extract` on a group or a list, and `inv gather` (docs/runs.md, "Sharded runs"). Data only (run/sharded_view.py
shows it, specrig/cli/extract.py sequences it).

The dataset is split by global sample index: host k of n (in the order `--host` names them) takes
the indices i with i % n == k (server mode: speculators' own contiguous chunks), each file keeps
its global index (data_{i}.pt), so the shards' outputs merge as they are. One sharded-run id, made
here, goes into every host's run.json; `status`, `stop`, `resume`, `logs` and `gather` find each
host's run by it. On the host and in --json the record keeps the words of its first version:
`shard: {sharded_run_id, hosts, shard_index, shard_count}`, ids `sharded-<UTC stamp>-xxxx`.
"""
from __future__ import annotations

import datetime
import json
import os
import random
import string
import uuid
from collections.abc import Callable, Sequence

from specrig.contract import ACTIVE_STATES, load_host_module
from specrig.doctor import check_extraction_mode
from specrig.errors import AuthFailed, ConnectionFailed, Findings, HostKeyError, UsageError
from specrig.exit_status import ExitStatus
from specrig.group import GroupResult, HostOutcome, run_each, run_group
from specrig.inventory import Host
from specrig.run.preflight import preflight
from specrig.run.runs import launch_args, runs_call, watch_run
from specrig.run.settings import MODE_NAMES, Request, build_request
from specrig.transport import connect

#: A sharded run's id starts so.
SHARDED_PREFIX = "sharded-"
#: Sharded runs launched before they had a word of their own (then "fleet runs") have ids with this prefix.
EARLIER_SHARDED_PREFIX = "fleet-"
#: A multi-node job's id (specrig/run/node_runs.py): one run per node, found by it as a sharded run's shards are.
JOB_PREFIX = "nodes-"
#: In --out (or hosts.yaml's extract.out), replaced by each host's name: hosts sharing a filesystem
#: (the lab's) need an output directory each.
HOST_FIELD = "{host}"
GATHER_TIMEOUT_S = 3600


def new_group_run_id(prefix: str) -> str:
    """The id of a run over a group of hosts: with SHARDED_PREFIX a sharded run's, with JOB_PREFIX a
    multi-node job's."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return prefix + stamp + "-" + "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(4))


def is_group_run_id(run_id: str | None) -> bool:
    """Whether `run_id` names a sharded run or a multi-node job (each host finds its own run of it)."""
    return bool(run_id) and run_id.startswith((SHARDED_PREFIX, EARLIER_SHARDED_PREFIX, JOB_PREFIX))


def shard_requests(hosts: Sequence[Host], given: dict, *, shared_out: bool = False) -> dict[str, Request]:
    """Each host's launch: its settings (command line over its own hosts.yaml `extract:`), its
    output directory with {host} filled in, and its shard. Every bad value raises before any host
    is reached; with `shared_out` (one directory for every shard), an output that is not one path."""
    requests = {}
    for index, host in enumerate(hosts):
        request = build_request(host, given)
        driver_args = dict(request.driver_args, shard_index=index, shard_count=len(hosts))
        driver_args["output_dir"] = driver_args["output_dir"].replace(HOST_FIELD, host.name)
        requests[host.name] = Request(driver_args=driver_args, options=request.options, env=request.env,
                                      sources=request.sources)
    outs = {request.driver_args["output_dir"] for request in requests.values()}
    if shared_out and len(outs) > 1:
        raise UsageError(f"--shared-out: the shards' output directories differ ({', '.join(sorted(outs))}); one "
                         f"shared directory is one path on every host",
                         hint="give one --out without {host}, on storage every host mounts at that path")
    return requests


# ---- one output directory for several shards -----------------------------------------------------

#: remote/run/storage.py: the words for what a host that misses another's token saw.
storage = load_host_module("run/storage")
SHARED_CHECK = "out-shared"
UNREACHABLE = (ConnectionFailed, AuthFailed, HostKeyError)


def shared_output(hosts: Sequence[Host], requests: dict[str, Request], *, shared_out: bool) -> dict[str, dict]:
    """The `out-shared` check of each host whose shard writes the same output path as another host's:
    the first of them writes a token at that path (or its nearest existing parent), each other reads it.
    With `shared_out` every reader must see it (one storage, as asked); without, none may (the same
    path on several hosts is then each one's own disk: gather counts each host's files, and one shared
    directory would hold every shard on every host). Host → check."""
    by_path: dict[str, list[Host]] = {}
    for host in hosts:
        by_path.setdefault(requests[host.name].driver_args["output_dir"], []).append(host)
    found = {}
    for out, sharing in by_path.items():
        if len(sharing) > 1:
            found.update(token_proof(out, sharing, shared_out=shared_out))
    return found


def token_proof(out: str, hosts: Sequence[Host], *, shared_out: bool) -> dict[str, dict]:
    """One path's proof (shared_output()): host → its check."""
    writer, readers, token = hosts[0], hosts[1:], uuid.uuid4().hex
    try:
        with connect(writer) as remote:
            written = remote.call("shared-token.write", {"directory": out, "token": token})
            if written["error"]:
                return {host.name: check(False, f"{writer.name} could not write a token in {written['directory']} "
                                                f"to see which hosts share {out}: {written['error']}",
                                         "choose an --out this user can write on every host")
                        for host in hosts}
            path = written["path"]
            try:
                outcomes = run_each(readers, lambda host: _read_token(host, path, token), parallel=len(readers))
                seen = {outcome.host: outcome.result["seen"] if outcome.result
                        else "not reached (" + outcome.error.one_line() + ")" for outcome in outcomes}
            finally:
                remote.call("shared-token.remove", {"path": path})
    except UNREACHABLE:
        return {}  # the writer's own preflight says it is not reached, and nothing launches
    shared = [name for name, word in seen.items() if word == "shared"]
    own = [name for name in seen if name not in shared]
    where = f"{os.path.dirname(path)} ({out} on {len(hosts)} hosts)"
    checks = {}
    for name, word in seen.items():
        if word == "shared" and shared_out:
            checks[name] = check(True, f"{name} reads the token {writer.name} wrote in {where}: one storage")
        elif word == "shared":
            checks[name] = check(False, f"{out} is one directory for {writer.name} and {name} ({name} reads the token "
                                        f"{writer.name} wrote in {os.path.dirname(path)}): gather would count every "
                                        f"file there once per host",
                                 "put {host} in --out (a directory per host), or pass --shared-out (server mode) to "
                                 "write one shared directory on purpose")
        elif shared_out:
            checks[name] = check(False, f"{name} does not see the token {writer.name} wrote in {where}: "
                                        f"{storage.why_not_seen(word)}",
                                 f"mount {out} on every host from one storage, at that path; or drop --shared-out "
                                 "and put {host} in --out (gather then checks each host's shard)")
        else:
            checks[name] = check(True, f"{out} is {name}'s own (it does not see {writer.name}'s token): its shard "
                                       f"stays there, gather finds it")
    checks[writer.name] = check(not (shared_out and own) and not (shared and not shared_out),
                                f"wrote a token in {where}; read there by {', '.join(shared) or 'no other host'}",
                                "see the other hosts' out-shared check")
    return checks


def _read_token(host: Host, path: str, token: str) -> dict:
    with connect(host) as remote:
        return remote.call("shared-token.read", {"path": path, "token": token})


def check(ok: bool, detail: str, advice: str | None = None) -> dict:
    return {"name": SHARED_CHECK, "ok": bool(ok), "detail": detail, "advice": None if ok else advice}


def preflight_shards(hosts: Sequence[Host], requests: dict[str, Request], *, skip_preflight: bool,
                     shared_out: bool = False) -> tuple[GroupResult, dict[str, str | None]]:
    """Every host's preflight, in parallel (each result its checks, `out-shared` among them where hosts
    write one path: shared_output(); a failed check is Findings whose payload they are), and the
    extraction mode each host's speculators takes."""
    modes: dict[str, str | None] = {}
    shared = {} if skip_preflight else shared_output(hosts, requests, shared_out=shared_out)

    def check(host: Host) -> list[dict]:
        with connect(host) as remote:
            mode = modes[host.name] = check_extraction_mode(remote, host, "extract")["mode"]  # 0.5-0.7: exit 2
            checks = [] if skip_preflight else preflight(remote, host, requests[host.name].for_mode(mode, host))
            checks += [shared[host.name]] if host.name in shared else []
        failed = [item["name"] for item in checks if not item["ok"]]
        if failed:
            raise Findings(f"{host.name}: preflight failed: {', '.join(failed)}", payload=checks)
        return checks

    return run_group(hosts, check), modes


def one_mode(modes: dict[str, str | None]) -> str | None:
    """The one extraction mode of every host (host → mode); UsageError (exit 2) when they take several:
    the two modes split a dataset differently (i % n against contiguous chunks), the union would not hold."""
    by_mode: dict[str | None, list[str]] = {}
    for name, mode in modes.items():
        by_mode.setdefault(mode, []).append(name)
    if len(by_mode) > 1:
        raise UsageError("one sharded run needs one extraction mode, and these hosts take several: " + "; ".join(
            f"{', '.join(hosts_on)}: {MODE_NAMES.get(mode, 'none')}" for mode, hosts_on in by_mode.items()),
            hint="install the same speculators on every host (`inv doctor --host ...` shows them); nothing was "
                 "launched")
    return next(iter(by_mode), None)


def launch_shard(host: Host, request: Request, *, sharded_run_id: str, names: Sequence[str], shared_out: bool = False,
                 on_launched: Callable[[dict], None] | None = None,
                 on_update: Callable[[dict], None] | None = None) -> dict:
    """Launch one host's shard: {run_id, ..., sharded_run_id, hosts, shard_index, shard_count, shared_out, out,
    layers_source}, handed to on_launched once launched. With on_update, its run is followed on the same
    connection until it ends (`final`: its last status)."""
    shard = {"sharded_run_id": sharded_run_id, "hosts": list(names), "shard_index": request.driver_args["shard_index"],
             "shard_count": len(names), "shared_out": shared_out}
    with connect(host) as remote:
        launched = runs_call(remote, host, "launch", launch_args(host, request, shard=shard))
        result = {**launched, **shard, "out": request.driver_args["output_dir"],
                  "layers_source": request.sources.get("layers")}
        if on_launched is not None:
            on_launched(result)
        if on_update is None:
            return result
        return {**result, "final": watch_run(remote, host, launched["run_id"], on_update)}


# ---- gather: the union of the shards --------------------------------------------------------------

def verify_output(host: Host, run_id: str) -> dict:
    """The host's run of the sharded run (or a run id): its output's sample indices, each loaded on the host.

    A run that is no shard holds the whole dataset, yet an in-process output records the dataset's count only
    for a shard (data_config.json's `specrig.dataset_samples`): its count is then the driver's of the run's
    samples (its heartbeat's `samples_total`), without which the union could never be complete."""
    with connect(host) as remote:
        found = runs_call(remote, host, "verify-output", {"run": run_id}, timeout=GATHER_TIMEOUT_S)
        if found.get("dataset_samples") is None and not found.get("shard") and not found.get("missing_dir"):
            run = runs_call(remote, host, "status", {"run": found["run_id"]})["runs"][0]
            found["dataset_samples"] = (run.get("heartbeat") or {}).get("samples_total")
        return found


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
    if total is None and not failed_hosts:  # a host that did not answer is the reason, said above
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
    problems += identity_problems(outcomes)
    return {"complete": not problems, "dataset_samples": total, "samples": sum(map(len, holders.values())),
            "missing": missing, "duplicated": {str(i): h for i, h in duplicated.items()},
            "out_of_range": out_of_range if total is not None else [], "unloadable": unloadable,
            "problems": problems}


#: What every shard must share to be merged into one dataset, as the hosts report it (runs.verify-output's
#: `identity`): training reads axis 1 of the states as the layer ids, in one dtype and one storage type (fp8
#: files need --hidden-states-backend fp8, bf16 files the file backend), of one model.
IDENTITY = {"layer_ids": "layer ids", "dtype": "storage dtype", "storage": "storage type (--storage)",
            "model": "model (snapshot, config.json)"}


def identity_problems(outcomes: Sequence[HostOutcome]) -> list[str]:
    """One problem per part of IDENTITY on which the shards that answered disagree, each host's value named."""
    problems = []
    for key, what in IDENTITY.items():
        by_value: dict[str, list[str]] = {}
        for outcome in outcomes:
            identity = (outcome.result or {}).get("identity")
            if identity and identity.get(key) is not None:
                by_value.setdefault(json.dumps(identity[key], sort_keys=True), []).append(outcome.host)
        if len(by_value) > 1:
            problems.append(f"the shards differ in {what}, so they are not one dataset: " + "; ".join(
                f"{', '.join(hosts)}: {value}" for value, hosts in by_value.items()))
    return problems


def gather(hosts: Sequence[Host], run_id: str) -> tuple[GroupResult, dict]:
    """Each host's shard of the sharded run, checked on its host, and their union."""
    group = run_group(hosts, lambda host: verify_output(host, run_id))
    return group, union(group.outcomes)
