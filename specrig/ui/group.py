"""How people see a task on a group of hosts: a line per host as it finishes, then a summary table.

Readable at 80 columns: the table's last column folds. Every write of whole lines takes
OUTPUT_LOCK, since hosts' threads print too (`logs` lines prefixed by host): a line is never cut
by another host's. What a host's result holds, in a few words (its figures), each stage's view
says (TaskView.figures).
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich.live import Live
from rich.table import Table
from rich.text import Text

from specrig.exit_status import ExitStatus
from specrig.group import GroupResult, HostOutcome
from specrig.ui import console, print_json
from specrig.ui.terminal import markup, visible, visible_on, write_raw

OUTPUT_LOCK = threading.Lock()

#: An outcome in a word or two, by exit status (README, "Exit codes").
OUTCOME_WORDS = {
    ExitStatus.OK: "ok",
    ExitStatus.FINDINGS: "findings",
    ExitStatus.USAGE: "could not run",
    ExitStatus.CONNECTION: "unreachable",
    ExitStatus.AUTH: "auth failed",
    ExitStatus.HOST_KEY: "host key",
    ExitStatus.REMOTE_PYTHON: "remote python",
    ExitStatus.REMOTE_ERROR: "script error",
    ExitStatus.TIMEOUT: "timed out",
    ExitStatus.LOCKED: "locked",
    ExitStatus.INTERRUPTED: "interrupted",
}


def outcome_word(status: ExitStatus) -> Text:
    word = OUTCOME_WORDS[status] + ("" if status == ExitStatus.OK else f" ({int(status)})")
    style = "green" if status == ExitStatus.OK else "yellow" if status == ExitStatus.FINDINGS else "bold red"
    return Text(word, style=style)


def _what(outcome: HostOutcome, figures: Callable[[Any], str]) -> str:
    """The failure's one line (without the host name it may start with: the host is shown beside
    it), else the result's figures."""
    if outcome.error is not None:
        return visible(outcome.error.one_line().removeprefix(f"{outcome.host}: "))
    return visible(figures(outcome.result))


def show_outcome(outcome: HostOutcome, *, figures: Callable[[Any], str]) -> None:
    """One host's line, the moment it finishes (and a failure's traceback under it)."""
    line = Text.assemble((outcome.host, "bold"), ": ", outcome_word(outcome.exit_status),
                         f" in {outcome.elapsed_s:.2f} s: ", _what(outcome, figures))
    with OUTPUT_LOCK:
        console.print(line)
        if outcome.error is not None and outcome.error.detail:
            console.print(visible(outcome.error.detail.rstrip()), style="dim", markup=False, highlight=False,
                          soft_wrap=True)


def show_summary(title: str, outcomes: Sequence[HostOutcome], *, figures: Callable[[Any], str],
                 total: str | None = None) -> None:
    ok = sum(outcome.exit_status == ExitStatus.OK for outcome in outcomes)
    table = Table(title=f"{markup(title)}: {len(outcomes)} hosts, {ok} ok, {len(outcomes) - ok} not ok",
                  title_justify="left", expand=True)
    table.add_column("host", overflow="fold")
    table.add_column("outcome", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    table.add_column("figures / reason", ratio=1, overflow="fold")
    for outcome in outcomes:
        table.add_row(markup(outcome.host), outcome_word(outcome.exit_status), f"{outcome.elapsed_s:.1f}",
                      Text(_what(outcome, figures)))
    with OUTPUT_LOCK:
        console.print(table)
        if total:
            console.print(total, markup=False, highlight=False)


def outcomes_json(outcomes: Sequence[HostOutcome], result_json: Callable[[Any], Any] = lambda result: result) -> dict:
    """--json: {host: {exit_status, elapsed_s, result and/or error (+ detail)}}, hosts in the order named."""
    return {outcome.host: outcome.as_json(result_json) for outcome in outcomes}


def show_group(title: str, group: GroupResult, *, as_json: bool, figures: Callable[[Any], str],
               result_json: Callable[[Any], Any] = lambda result: result, total: str | None = None) -> None:
    """Once every host is in: the summary table (each host's line came as it finished), or --json's
    {host: outcome}."""
    if as_json:
        print_json(outcomes_json(group.outcomes, result_json))
    else:
        show_summary(title, group.outcomes, figures=figures, total=total)


def show_detached(note: str) -> None:
    with OUTPUT_LOCK:
        console.print(f"\n{note}", markup=False)


@contextlib.contextmanager
def live(board) -> Iterator[None]:
    """Keep `board` refreshed at the bottom of the terminal while hosts run (lines print above it);
    nothing if None. Transient: once every host is in, the summary table says what they came to."""
    if board is None:
        yield
        return
    with Live(board, console=console, refresh_per_second=2, transient=True):
        yield


# ---- streamed lines ---------------------------------------------------------------------------

class PrefixedLines:
    """Text streamed by many hosts at once, as whole lines each prefixed by its host's name."""

    def __init__(self, names: Sequence[str], *, raw: bool = False):
        self.width = max(map(len, names), default=0)
        #: The hosts' text as it came (`inv logs --raw`); else its control characters escaped on a terminal.
        self.raw = raw

    @contextlib.contextmanager
    def writer(self, host: str) -> Iterator[Callable[[str], None]]:
        """A write(text) for one host's stream: a line shows once whole; the last unfinished line
        shows when the stream ends."""
        pending = [""]

        def write(text: str) -> None:
            text = text if self.raw else visible_on(console, text)
            *lines, pending[0] = (pending[0] + text).split("\n")
            self._print(host, lines)

        try:
            yield write
        finally:
            if pending[0]:
                self._print(host, pending)

    def _print(self, host: str, lines: list[str]) -> None:
        if not lines:
            return
        prefix = f"{host:<{self.width}} | "
        with OUTPUT_LOCK:
            if self.raw:
                write_raw("".join(prefix + line + "\n" for line in lines))
            else:
                console.out("\n".join(prefix + line for line in lines), highlight=False)
