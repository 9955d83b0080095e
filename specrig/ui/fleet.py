"""How people see a task on many hosts: a line per host as it finishes, then a summary table.

Readable at 80 columns: the table's last column folds. Every write of whole lines takes
OUTPUT_LOCK, since hosts' threads print too (`logs` lines prefixed by host): a line is never cut
by another host's. Also here: each task's key figures (what a result holds, in a few words), and
the board of runs that a fleet's live view refreshes.
"""
from __future__ import annotations

import contextlib
import threading
from pathlib import PurePosixPath
from typing import Any, Callable, Iterator, Sequence

from rich.live import Live
from rich.table import Table
from rich.text import Text

from specrig.contract import ACTIVE_STATES
from specrig.exit_status import ExitStatus
from specrig.fleet import HostOutcome
from specrig.run.view import STATE_STYLE, format_duration
from specrig.ui import console, human_bytes, print_json
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


def _outcome_word(status: ExitStatus) -> Text:
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
    line = Text.assemble((outcome.host, "bold"), ": ", _outcome_word(outcome.exit_status),
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
        table.add_row(markup(outcome.host), _outcome_word(outcome.exit_status), f"{outcome.elapsed_s:.1f}",
                      Text(_what(outcome, figures)))
    with OUTPUT_LOCK:
        console.print(table)
        if total:
            console.print(total, markup=False, highlight=False)


def print_outcomes_json(outcomes: Sequence[HostOutcome]) -> None:
    """--json: {host: {exit_status, elapsed_s, result and/or error (+ detail)}}, hosts in the order named."""
    print_json({outcome.host: outcome.as_json() for outcome in outcomes})


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


# ---- a fleet's live view: the runs, refreshed ---------------------------------------------------

class RunsBoard:
    """The newest status of each host's run; the live view renders it as a table (rich calls
    __rich__ from its refresh thread while hosts' threads update)."""

    def __init__(self, names: Sequence[str]):
        self._runs: dict[str, dict | None] = dict.fromkeys(names)
        #: Hosts whose part failed before or while following their run: what it came to.
        self._failed: dict[str, ExitStatus] = {}
        self._lock = threading.Lock()

    def update(self, host: str, run: dict) -> None:
        with self._lock:
            self._runs[host] = run

    def finished(self, outcome: HostOutcome) -> None:
        if outcome.error is not None:
            with self._lock:
                self._failed[outcome.host] = outcome.exit_status

    def __rich__(self) -> Table:
        with self._lock:
            runs, failed = dict(self._runs), dict(self._failed)
        table = Table(title="runs (Ctrl-C detaches; the runs go on)", title_justify="left", expand=True)
        for column in ("host", "run", "state", "phase", "samples", "ETA"):
            table.add_column(column, overflow="fold")
        for host, run in runs.items():
            if host in failed:
                table.add_row(markup(host), markup(run["run_id"]) if run else "-", _outcome_word(failed[host]), "", "", "")
                continue
            if run is None:
                table.add_row(markup(host), "-", "[dim]waiting[/]", "", "", "")
                continue
            beat = run.get("heartbeat") or {}
            style = STATE_STYLE.get(run["state"], "")
            table.add_row(markup(host), markup(run["run_id"]), Text(visible(run["state"]), style=style),
                          markup(beat.get("phase") or "-"), _samples(beat),
                          format_duration(beat["eta_s"]) if beat.get("eta_s") else "-")
        beats = [run.get("heartbeat") or {} for run in runs.values() if run]
        if len(runs) > 1 and any(beat.get("samples_total") for beat in beats):
            # A fleet run's shards: their samples added up.
            table.caption = (f"total: {sum(beat.get('samples_done') or 0 for beat in beats)}/"
                             f"{sum(beat.get('samples_total') or 0 for beat in beats)} samples")
            table.caption_justify = "left"
        return table


# ---- each task's key figures --------------------------------------------------------------------

def _samples(beat: dict) -> str:
    done, total = beat.get("samples_done"), beat.get("samples_total")
    if done is None:
        return "-"
    return f"{done}/{total}" if total else str(done)


def doctor_figures(facts: dict) -> str:
    packages = facts["packages"]
    gpu = facts["gpu"]
    gpus = f"{len(gpu['gpus'])} GPU(s)" if gpu["available"] else "no GPUs"
    return (f"{facts['user']}/{PurePosixPath(facts['login_shell']).name}, python {facts['python']['version']}, "
            f"speculators {packages.get('speculators') or '-'}, vllm {packages.get('vllm') or '-'}, {gpus}, "
            f"{human_bytes(facts['disk']['free_bytes'])} free")


def verify_figures(report: dict) -> str:
    counts = report["counts"]
    consumers = ", ".join(f"{c.get('name') or c.get('package')} {c.get('version', '?')}" for c in report["consumers"])
    provider = report["provider"]
    return (f"{counts['drift']} drift finding(s), {counts['note']} note(s); {consumers} against "
            f"{provider.get('name') or provider.get('package')} {provider.get('version', '?')}")


def patches_figures(result: dict) -> str:
    """apply-patches and patch-status: the patchset and its patches by state; what applying wrote."""
    if result["action"] == "revert":
        return revert_figures(result)
    if not result.get("patchset"):
        return result.get("patchset_problem") or "no patchset"
    states: dict[str, int] = {}
    for patch in result["patches"]:
        states[patch["state"]] = states.get(patch["state"], 0) + 1
    text = f"patchset {result['patchset']['name']}: " + ", ".join(f"{n} {state}" for state, n in states.items())
    if result.get("dry_run"):
        return text + f"; dry run: {sum(bool(f['diff']) for f in result['files'])} file(s) would change"
    if result["action"] == "apply" and "files" in result:
        written = result["bytes_written"]
        text += (f"; wrote {written} bytes to {sum(bool(f['bytes_written']) for f in result['files'])} file(s)"
                 if written else "; nothing to do")
        if result.get("verification") is not None:
            other = len(result["verification"]["other_drift"])
            text += "; verified" + (f", {other} other drift finding(s)" if other else "")
    return text


def revert_figures(result: dict) -> str:
    if not result["files"]:
        return "nothing to revert"
    return f"{len(result['files'])} file(s) reverted, {result['bytes_written']} bytes written"


def smoke_figures(result: dict) -> str:
    versions = result.get("versions") or {}
    return (f"passed: {result['samples']} samples in {result['elapsed_s']} s (speculators "
            f"{versions.get('speculators')}, vllm {versions.get('vllm')})")


def status_figures(result: dict) -> str:
    runs = result["runs"]
    if not runs:
        return "no runs yet"
    newest = runs[-1]
    active = [run for run in runs if run["state"] in ACTIVE_STATES]
    fleet = newest.get("fleet")
    shard = f" (shard {fleet['shard_index']} of {fleet['shard_count']}, {fleet['fleet_run_id']})" if fleet else ""
    return (f"{len(runs)} run(s), {len(active)} active; newest {newest['run_id']}{shard} {newest['state']}, "
            f"{_samples(newest.get('heartbeat') or {})} samples")


def stop_figures(result: dict) -> str:
    text = (f"run {result['run_id']}: was {result['was']}, now {result['state']}; "
            f"{len(result['pids'])} process(es) ended")
    if result["clean"]:
        return text + "; nothing left"
    left = [f"{len(result['left'])} process(es) still alive"] if result["left"] else []
    if result["gpu_memory_held"] or any(gpu["not_released"] for gpu in result["gpu_memory"]):
        left.append("GPU memory not released")
    return text + "; " + ", ".join(left)


def resume_figures(result: dict) -> str:
    if result.get("skipped"):
        text = f"run {result['run_id']} left as it is ({result['resumed_from']})"
    else:
        text = f"resumed run {result['run_id']} (was {result['resumed_from']})"
    final = result.get("final")
    return text + (f", now {final['state']}" if final else "")


def logs_figures(result: dict) -> str:
    return f"run {result['run_id']} {result['state']}"
