"""How people see a sharded run (one extraction split over a group of hosts, run/sharded_runs.py): every
shard's preflight, the run launched, each shard followed, and what `inv gather` found the shards hold.
"""
from __future__ import annotations

from collections.abc import Sequence

from specrig.group import GroupResult, HostOutcome
from specrig.run.view_parts import final_verdict, runs_total
from specrig.ui import console, print_json
from specrig.ui.group import outcomes_json, show_summary
from specrig.ui.preflight_checks import show_checks
from specrig.ui.task import TaskView
from specrig.ui.terminal import visible


def preflight_figures(checks: list) -> str:
    return f"{len(checks)} check(s) passed" if checks else "preflight skipped"


def show_shards_preflight(preflight: GroupResult, *, as_json: bool) -> None:
    """Every shard's preflight: the summary; when it failed, each failed host's checks first and that
    nothing was launched (--json: only a failure, {launched: false, preflight: {host: outcome}})."""
    if as_json:
        if preflight.failed:
            print_json({"launched": False, "preflight": outcomes_json(preflight.outcomes)})
        return
    for outcome in preflight.failed:
        if isinstance(outcome.result, list):
            console.print(f"[bold]{outcome.host}[/]:")
            show_checks(outcome.result)
    show_summary("preflight", preflight.outcomes, figures=preflight_figures)
    if preflight.failed:
        console.print(f"nothing was launched: the preflight failed on {', '.join(o.host for o in preflight.failed)}")


def shard_figures(result: dict) -> str:
    text = (f"shard {result['shard_index']} of {result['shard_count']}: run {result['run_id']} launched, "
            f"writing {result['out']}")
    final = result.get("final")
    return text + (f"; {final['state']}" if final else "")


def shards_total(outcomes: Sequence[HostOutcome]) -> str | None:
    """The total line of an attached sharded extraction: each host's run as it ended."""
    return runs_total([outcome.result["final"] for outcome in outcomes
                       if isinstance(outcome.result, dict) and outcome.result.get("final")])


def show_sharded_run(sharded_run_id: str, names: Sequence[str], *, server: bool) -> None:
    split = "speculators' own split, in contiguous chunks" if server else f"sample i goes to host i % {len(names)}"
    console.print(f"sharded run [bold]{sharded_run_id}[/]: {len(names)} shards ({split}: "
                  f"{', '.join(f'{k}={name}' for k, name in enumerate(names))})")


def gather_figures(result: dict) -> str:
    shard = result.get("shard") or {}
    part = (f"shard {shard['shard_index']} of {shard['shard_count']}, " if shard else "")
    bad = f", {len(result['unloadable'])} do not load" if result["unloadable"] else ""
    where = "no output directory" if result.get("missing_dir") else result["out"]
    return f"{part}run {result['run_id']} {result['state']}: {len(result['indices'])} sample(s){bad} in {where}"


def show_gather(run_id: str, shards: GroupResult, found: dict, *, as_json: bool) -> None:
    """`inv gather`: each shard's line and what they hold together (--json: the union and {host: outcome})."""
    if as_json:
        print_json({"run": run_id, **found, "hosts": outcomes_json(shards.outcomes)})
        return
    show_summary(f"gather {run_id}", shards.outcomes, figures=gather_figures)
    show_union(found, shards.outcomes)


def show_union(found: dict, outcomes: Sequence[HostOutcome]) -> None:
    """What `inv gather` found the shards hold together."""
    if found["complete"]:
        console.print(f"complete: {found['dataset_samples']} samples, every index once, each loads whole "
                      f"(outputs: {visible(', '.join(o.host + ':' + o.result['out'] for o in outcomes))})", markup=False)
    else:
        console.print("incomplete: " + visible("; ".join(found["problems"])), style="bold red", markup=False)


def shards_view(sharded_run_id: str) -> TaskView:
    """The shards launched (and, attached, followed to their end): each host's line, then the summary."""
    return TaskView(f"extract {sharded_run_id}", show=None, figures=shard_figures, judge=final_verdict,
                    total=shards_total)
