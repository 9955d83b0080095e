"""The one place a task becomes one host's output or a group's per-host summary.

A task names its data function (Host → result, never printing) and its view (specrig/ui/task.py);
`--host` decides: one host (its own output, --json its result) or a group (a line per host as it
finishes, then the summary; --json {host: outcome}), whatever the task (Fabric's Group.run →
GroupResult, pyinfra's api/ against pyinfra_cli/prints.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specrig.errors import Findings
from specrig.exit_status import ExitStatus
from specrig.group import Detached, GroupResult, group_hosts, run_group
from specrig.inventory import Host, load_inventory
from specrig.ui import group as group_view
from specrig.ui.task import TaskView


def run_task(spec: str, work: Callable[[Host], Any], view: TaskView, *, as_json: bool,
             group_work: Callable[[Sequence[Host]], Callable[[Host], Any]] | None = None, board=None,
             detach_note: str | None = None) -> ExitStatus:
    """`work` on the host or hosts `spec` names, shown by `view`; the task's exit status.

    On a group, `group_work(hosts)` (default: `work`) is what each host does (its log's lines
    prefixed with its name; its run followed): a host that follows its run hands its statuses to
    `board` (run/live.RunsBoard), kept live below the hosts' lines. With
    `detach_note`, the hosts follow their runs, all at once (a bound would leave the hosts past it
    waiting for another host's run to end), and Ctrl-C detaches (the note says how to see them);
    the finished hosts decide the exit status. Without, Ctrl-C interrupts (130).
    """
    inventory = load_inventory()
    hosts = group_hosts(inventory, spec)
    if hosts is None:
        return run_on_host(inventory.host(spec), work, view, as_json=as_json)
    return run_on_group(hosts, group_work(hosts) if group_work else work, view, as_json=as_json, board=board,
                        detach_note=detach_note)


def run_on_host(host: Host, work: Callable[[Host], Any], view: TaskView, *, as_json: bool) -> ExitStatus:
    """One host: its result as `view` shows it; a check that found something is shown, then raised."""
    try:
        result = work(host)
    except Findings as found:
        status = view.show_found(host, found, as_json=as_json)
        if status is None:
            raise
        return status
    return view.show_one(host, result, as_json=as_json)


def run_on_group(hosts: Sequence[Host], work: Callable[[Host], Any], view: TaskView, *, as_json: bool, board=None,
                 detach_note: str | None = None) -> ExitStatus:
    """A group: each host's line as it finishes, then the summary (--json: {host: outcome} once all
    are in); the most serious exit status among the hosts. `board` and `detach_note`: run_task's."""
    if board is not None:
        board.expect([host.name for host in hosts])
    try:
        group = show_as_it_goes(hosts, work, view, as_json=as_json, board=board,
                                parallel=len(hosts) if detach_note else None)
    except Detached as detached:
        if detach_note is None:
            raise
        group_view.show_detached(detach_note)
        return detached.result.exit_status
    show_group(view, group, as_json=as_json)
    return group.exit_status


def show_as_it_goes(hosts: Sequence[Host], work: Callable[[Host], Any], view: TaskView, *, as_json: bool,
                    board=None, parallel: int | None = None) -> GroupResult:
    """`work` on every host, each host's line shown as it finishes (none with --json)."""

    def finished(outcome) -> None:
        if board is not None:
            board.finished(outcome)
        if not as_json:
            group_view.show_outcome(outcome, figures=view.figures)

    with group_view.live(board):
        return run_group(hosts, work, parallel=parallel, judge=view.judge, on_outcome=finished)


def show_group(view: TaskView, group: GroupResult, *, as_json: bool) -> None:
    group_view.show_group(view.title, group, as_json=as_json, figures=view.figures, result_json=view.result_json,
                          total=view.total(group.outcomes) if view.total else None)
