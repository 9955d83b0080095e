"""TaskView: how people see one task's result, on one host or in a group's summary.

Each stage's view module holds its tasks' views (the data functions return results and print
nothing); specrig/cli/runner.py hands a result to one or the other: one host's output, or a line
per host and the summary (specrig/ui/group.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from specrig.errors import Findings
from specrig.exit_status import ExitStatus
from specrig.group import HostOutcome
from specrig.inventory import Host


def _ok(result: Any) -> ExitStatus:
    return ExitStatus.OK


def _as_is(result: Any) -> Any:
    return result


@dataclasses.dataclass(frozen=True)
class TaskView:
    #: The summary's title on a group ("doctor", "patch-status").
    title: str
    #: One host's output: show(result, host=, as_json=). It may return the exit status of what it
    #: showed when that decides (a run followed to its end); None leaves it to `judge`. None for a
    #: view of groups only (a sharded run's shards, a multi-node job's nodes).
    show: Callable[..., ExitStatus | None] | None
    #: What a result holds, in a few words: a group's line for the host.
    figures: Callable[[Any], str]
    #: The exit status of a result that came back: a drift report is FINDINGS without being an error.
    judge: Callable[[Any], ExitStatus] = _ok
    #: One host's Findings (a check that found something), shown before its one-line error:
    #: show_findings(found, host=, as_json=). A status returned ends the task with it, without the error line.
    show_findings: Callable[..., ExitStatus | None] | None = None
    #: A group's line under the summary (a sharded run's samples), or None.
    total: Callable[[Sequence[HostOutcome]], str | None] | None = None
    #: What --json prints of a result that is not plain data (a drift Report).
    result_json: Callable[[Any], Any] = _as_is

    def show_one(self, host: Host, result: Any, *, as_json: bool) -> ExitStatus:
        shown = self.show(result, host=host, as_json=as_json)
        return self.judge(result) if shown is None else shown

    def show_found(self, host: Host, found: Findings, *, as_json: bool) -> ExitStatus | None:
        return self.show_findings(found, host=host, as_json=as_json) if self.show_findings else None
