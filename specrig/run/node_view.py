"""How people see a multi-node job (one model over a group of hosts, run/node_runs.py): its preflight, node
by node and the nodes together, the job launched, and its nodes followed to their end.
"""
from __future__ import annotations

from specrig.exit_status import ExitStatus
from specrig.group import GroupResult
from specrig.run.view_parts import final_verdict, show_layers_note
from specrig.ui import console, print_json
from specrig.ui.group import outcomes_json, show_summary
from specrig.ui.preflight_checks import show_checks
from specrig.ui.task import TaskView


def show_job_preflight(nodes: GroupResult, job: list[dict], status: ExitStatus, *, as_json: bool) -> None:
    """A multi-node job's preflight: the nodes' summary and the nodes together; when it failed, every
    node's checks first and that nothing was launched (--json: only a failure)."""
    if as_json:
        if status != ExitStatus.OK:
            print_json({"launched": False, "preflight": outcomes_json(nodes.outcomes), "job": job})
        return
    for outcome in nodes.outcomes:
        if status != ExitStatus.OK and isinstance(outcome.result, dict) and "checks" in outcome.result:
            console.print(f"[bold]{outcome.host}[/]:")
            show_checks(outcome.result["checks"])
    show_summary("preflight", nodes.outcomes, figures=lambda r: f"{len(r['checks'])} check(s)")
    if job:
        console.print("[bold]the nodes together[/]:")
        show_checks(job)
    if status != ExitStatus.OK:
        console.print("nothing was launched: the preflight failed")


def show_job_launched(job_id: str, records: dict[str, dict], launched: dict[str, dict], describe: str, *,
                      as_json: bool) -> None:
    """The job's nodes, launched (--json: {launched: true, job_id, nodes: {host: launch + rank and role}})."""
    if as_json:
        print_json({"launched": True, "job_id": job_id, "nodes": {
            name: {**run, "node_rank": records[name]["node_rank"], "role": records[name]["role"]}
            for name, run in launched.items()}})
        return
    head, *workers = records
    console.print(f"multi-node job [bold]{job_id}[/]: {describe}; head {head} "
                  f"({records[head]['master_addr']}), workers {', '.join(workers)}")
    show_layers_note(launched[head])  # the head's plan: its files are the job's


def job_view(job_id: str) -> TaskView:
    """The job's nodes followed to their end: each node's line, then the summary."""
    return TaskView(f"extract {job_id}", show=None, judge=final_verdict,
                    figures=lambda r: f"{r['role']}: run {r['run_id']} {r['final']['state']}")
