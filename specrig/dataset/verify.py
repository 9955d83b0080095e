"""`inv verify-dataset`'s data: an extraction output checked on its host as the host's trainer will read it,
and, for a sharded run over several hosts, the shards together (never prints).

The host's `dataset.verify` (remote/dataset/verify.py) does the work: every row's file, the trainer's own
loading code, the refusals and the training command. Over a group, each host answers for its shard and
`union()` adds what no host alone can see: a row held on two hosts, a row on none, shards of another storage
type or other layers.
"""
from __future__ import annotations

from collections.abc import Sequence

from specrig.exit_status import ExitStatus
from specrig.group import GroupResult, HostOutcome, run_group
from specrig.inventory import Host

#: The trainer's loading code over every row of a large output reads it all: an 8B model's 512 rows are 22 GB.
VERIFY_TIMEOUT_S = 3600
#: What every shard of one training must share, as the hosts' plans give it.
SHARED = {"storage": "storage type", "layer_ids": "layer ids", "hidden_size": "hidden size"}


def verify(host: Host, *, run: str | None, outs: Sequence[str] | None, data: str | None, full: bool,
           backend: str | None, target_layer_ids: Sequence[int] | None) -> dict:
    """The host's verdict on the output: {trainable, counts, bad, problems, refusals, command, ...}."""
    from specrig.transport import connect

    with connect(host) as remote:
        return remote.call("dataset.verify", {
            "workdir": host.workdir, "run": run, "out": list(outs) if outs else None, "data": data, "full": full,
            "backend": backend, "target_layer_ids": list(target_layer_ids) if target_layer_ids is not None else None,
        }, timeout=VERIFY_TIMEOUT_S)


def judge(result: dict) -> ExitStatus:
    return ExitStatus.OK if result["trainable"] else ExitStatus.FINDINGS


def verify_group(hosts: Sequence[Host], **options) -> tuple[GroupResult, dict]:
    """Each host's shard verified on its host, and their union."""
    group = run_group(hosts, lambda host: verify(host, **options), judge=judge)
    return group, union(group.outcomes)


def union(outcomes: Sequence[HostOutcome]) -> dict:
    """What the hosts' shards are together: {"rows", "problems", "trainable"}; each problem names its rows."""
    answered = [outcome for outcome in outcomes if outcome.result is not None]
    holders: dict[int, list[str]] = {}
    for outcome in answered:
        for row in outcome.result["held"]:
            holders.setdefault(row, []).append(outcome.host)
    problems = []
    doubled = {row: hosts for row, hosts in sorted(holders.items()) if len(hosts) > 1}
    problems += [f"row {row} is held on {' and '.join(hosts)}: the trainer would read it twice"
                 for row, hosts in doubled.items()]
    totals = {outcome.result["counts"]["rows"] for outcome in answered}
    total = max(totals | {len(holders)}) if answered else 0
    problems += [f"row {row} is on no host" for row in range(total) if row not in holders]
    for key, what in SHARED.items():
        values = {repr(outcome.result["plan"].get(key)): outcome.host for outcome in answered}
        if len(values) > 1:
            problems.append(f"the shards differ in {what}: " + "; ".join(f"{host}: {value}"
                                                                       for value, host in values.items()))
    if len({share["out"] for outcome in answered for share in outcome.result["shares"]}) > 1:
        problems.append(f"the shards are on {len(answered)} hosts, where the trainer reads one directory: copy them "
                        f"to one host and run `inv verify-dataset --out` there")
    silent = [outcome.host for outcome in outcomes if outcome.result is None]
    if silent:
        problems.append(f"no answer from {', '.join(silent)}")
    return {"rows": total, "problems": problems,
            "trainable": not problems and all(outcome.result["trainable"] for outcome in answered)}
