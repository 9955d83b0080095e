"""How `inv accept` shows a draft's acceptance: the two drafts side by side, position by position, and the
verdict (specrig/train/accept.py returns the data; --json prints it as it is)."""
from __future__ import annotations

from rich.table import Table

from specrig.exit_status import ExitStatus
from specrig.inventory import Host
from specrig.train.accept import better
from specrig.ui import console, print_json
from specrig.ui.task import TaskView
from specrig.ui.terminal import markup

DRAFTS = ("trained", "untrained")


def show(result: dict, *, host: Host, as_json: bool) -> ExitStatus | None:
    if as_json:
        print_json(result)
        return None
    if "state" not in result:  # launched, not followed (--detach)
        run_id = result["run_id"]
        console.print(f"{markup(host.name)}: acceptance run {markup(run_id)} launched. `inv accept --host "
                      f"{markup(host.name)} --run {markup(run_id)}` shows its report, `inv stop` ends it.")
        return None
    console.print(about(result, host))
    drafts = result.get("drafts") or {}
    if any(drafts.get(name) for name in DRAFTS):
        console.print(side_by_side(drafts))
    failure = result.get("failure")
    if failure and result["state"] != "succeeded":
        console.print(f"[red]failed[/red]: {markup(failure.get('explain') or failure.get('kind') or '?')}")
        if failure.get("advice"):
            console.print(f"  fix: {markup(failure['advice'])}")
    verdict = result.get("verdict")
    if verdict:
        word = "[green]better[/green]" if verdict["better"] else "[red]not better[/red]"
        console.print(f"verdict: {word}: {markup(verdict['reason'])}")
    elif result["state"] in ("running", "starting", "restarting"):
        console.print("verdict: not yet (the run goes on)")
    return None


def about(result: dict, host: Host) -> Table:
    """What was measured, a line each: the run, the target, the prompts, the drafts."""
    grid = Table.grid(padding=(0, 2))
    grid.add_row("run", f"{markup(host.name)}: {markup(result['run_id'])}, {markup(result['state'])}")
    plan = result.get("plan")
    if plan:
        grid.add_row("target", markup(str(plan["model"])))
        grid.add_row("prompts", f"{plan['num_prompts']} from row {plan['first_row']} of {markup(str(plan['prompts']))}"
                                f"; greedy, at most {plan['max_tokens']} tokens, k={plan['k']}")
        grid.add_row("trained", markup(str(plan["draft"])))
        grid.add_row("untrained", markup(str(plan["untrained"])))
    return grid


def side_by_side(drafts: dict) -> Table:
    """position | trained | untrained: each position's acceptance rate, then the totals."""
    table = Table("", *DRAFTS, box=None, pad_edge=False)
    shown = [drafts.get(name) for name in DRAFTS]
    positions = max(len(found["acceptance_per_position"]) for found in shown if found)
    for position in range(positions):
        table.add_row(f"position {position}", *(rate_cell(found, position) for found in shown))
    table.add_row("mean acceptance length", *(f"{found['mean_acceptance_length'] or 1:.2f}" if found else "-"
                                              for found in shown))
    table.add_row("position 0, 95% bounds", *(bounds_cell(found) for found in shown))
    for label, key in (("drafts", "drafts"), ("prompts", "prompts"), ("tokens generated", "generated_tokens")):
        table.add_row(label, *(cell(found, key) for found in shown))
    return table


def rate_cell(found: dict | None, position: int) -> str:
    if not found or position >= len(found["acceptance_per_position"]):
        return "-"
    return f"{found['acceptance_per_position'][position]:.3f} ({found['accepted_per_position'][position]})"


def bounds_cell(found: dict | None) -> str:
    return f"{found['position0']['low']:.3f}-{found['position0']['high']:.3f}" if found else "-"


def cell(found: dict | None, key: str) -> str:
    value = found.get(key) if found else None
    return "-" if value is None else str(value)


def figures(result: dict) -> str:
    verdict = result.get("verdict")
    if "state" not in result:
        return f"launched {result['run_id']}"
    return f"{result['state']}, " + ("better" if better(result) else "not better" if verdict else "no verdict")


def judge(result: dict) -> ExitStatus:
    """0: the draft is clearly better; 1: it is not, or the run did not finish; a launch not followed: 0."""
    if "state" not in result:
        return ExitStatus.OK
    return ExitStatus.OK if better(result) else ExitStatus.FINDINGS


ACCEPT = TaskView(title="accept", show=show, figures=figures, judge=judge)
