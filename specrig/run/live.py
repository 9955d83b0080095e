"""The live views of runs: one run's panel (phase, progress and ETA, tokens/s, GPUs, the last log
lines), and a group's board of runs, one row per host.

They only read: a `runs status` call a second (specrig/run/runs.py: follow_run, watch_run).
Ctrl-C detaches and says so; the runs go on, on their hosts.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from specrig.contract import FAILED, RESTARTING, SUCCEEDED
from specrig.dataset.view import run_end_text
from specrig.errors import ConnectionFailed, RemoteTimeout
from specrig.exit_status import ExitStatus
from specrig.group import HostOutcome
from specrig.inventory import Host
from specrig.run.runs import follow_run
from specrig.run.view import (
    STATE_STYLE,
    describe_failure,
    pace_texts,
    samples,
    show_run,
)
from specrig.run.view_parts import training_text
from specrig.slurm.view import slurm_job_text
from specrig.ui import console, gpu_table
from specrig.ui.group import outcome_word
from specrig.ui.terminal import markup, visible

LOG_LINES = 8


def follow(host: Host, run_id: str) -> ExitStatus:
    """Show the run until it ends (OK if it succeeded, else FINDINGS) or the user detaches (OK: the run goes on)."""
    progress, bar = samples_bar()
    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            run = follow_run(host, run_id, lambda run: live.update(render(run, run["log_tail"], progress, bar)),
                             lines=LOG_LINES)
    except KeyboardInterrupt:
        console.print(f"detached from run {run_id}; it goes on on {host.name}. "
                      f"`inv status --host {host.name} --run {run_id}` shows it, "
                      f"`inv stop --host {host.name} --run {run_id}` stops it.")
        return ExitStatus.OK
    except (ConnectionFailed, RemoteTimeout) as exc:
        raise type(exc)(f"{exc.message}; run {run_id} goes on on {host.name}",
                        hint=f"`inv status --host {host.name} --run {run_id}` once the host is reachable") from None
    if not console.is_terminal:
        console.line()  # rich leaves a non-terminal's last Live frame without its line end
    console.print(f"run {markup(run_id)} {markup(run['state'])}")
    dataset = (run.get("exit") or {}).get("dataset")
    if dataset:  # what the run's end found of its output as the trainer reads it (issue 28)
        console.print(f"dataset: {run_end_text(dataset)}")
    draft = (run.get("exit") or {}).get("draft")
    if draft:  # a training's end: the checkpoint to serve, and to prove with `inv accept`
        console.print(f"draft: {markup(draft)}; `inv accept --host {host.name} --draft {markup(draft)}` measures it")
    if run["state"] != SUCCEEDED:
        show_run(run)
    return ExitStatus.OK if run["state"] == SUCCEEDED else ExitStatus.FINDINGS


def samples_bar() -> tuple[Progress, int]:
    """The progress bar of samples, with tokens/s and ETA, and its task id."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[rate]}"), TextColumn("ETA {task.fields[eta]}"))
    return progress, progress.add_task("samples", total=None, rate="", eta="-")


def render(run: dict, tail: str, progress: Progress, bar) -> Panel:
    beat = run.get("heartbeat") or {}
    done, total = beat.get("samples_done") or 0, beat.get("samples_total")
    rate, eta = pace_texts(run)
    progress.update(bar, completed=done, total=total, rate=rate, eta=eta or "-")
    style = STATE_STYLE.get(run["state"], "")
    header = Text.from_markup(f"[{style}]{markup(run['state'])}[/]  phase [bold]{markup(beat.get('phase') or '-')}[/]  "
                              f"attempt {len(run.get('attempts') or [])}"
                              + (f"  server [bold]{markup(beat['server'])}[/]" if beat.get("server") else "")
                              + (f"  [yellow]stalled {run.get('seconds_since_progress')} s[/]"
                                 if run.get("stalled") else ""))
    training = training_text(run.get("training"), run.get("checkpoint_plan"))
    parts = [header, Text(visible(training)) if training else progress]
    if run.get("slurm"):
        parts.insert(1, Text(visible(slurm_job_text(run["slurm"]))))
    failure = run.get("last_failure")
    if failure and run["state"] in (RESTARTING, FAILED):
        parts.append(Text.from_markup("last failure: " + describe_failure(failure)))
    gpus = (run.get("gpus") or {}).get("gpus") or []
    if gpus:
        table = gpu_table(gpus, apps=run.get("gpu_apps") or [], box=None, padding=(0, 1))
        parts.append(table)
    parts.append(Text(visible(tail), style="dim", overflow="ellipsis", no_wrap=True))
    return Panel(Group(*parts), title=f"run {markup(run['run_id'])}", subtitle="Ctrl-C detaches (the run goes on)")


class RunsBoard:
    """The newest status of each host's run in a group; the live view renders it as a table (rich
    calls __rich__ from its refresh thread while hosts' threads update)."""

    def __init__(self, names: Sequence[str] = ()):
        self._runs: dict[str, dict | None] = dict.fromkeys(names)
        #: Hosts whose part failed before or while following their run: what it came to.
        self._failed: dict[str, ExitStatus] = {}
        self._lock = threading.Lock()

    def expect(self, names: Sequence[str]) -> None:
        """The hosts of the group (each shows as waiting until its run's first status)."""
        with self._lock:
            self._runs = dict.fromkeys(names)

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
                table.add_row(markup(host), markup(run["run_id"]) if run else "-", outcome_word(failed[host]), "", "", "")
                continue
            if run is None:
                table.add_row(markup(host), "-", "[dim]waiting[/]", "", "", "")
                continue
            beat = run.get("heartbeat") or {}
            style = STATE_STYLE.get(run["state"], "")
            table.add_row(markup(host), markup(run["run_id"]), Text(visible(run["state"]), style=style),
                          markup(beat.get("phase") or "-"), samples(beat), board_eta(run))
        beats = [run.get("heartbeat") or {} for run in runs.values() if run]
        if len(runs) > 1 and any(beat.get("samples_total") for beat in beats):
            # A sharded run's shards: their samples added up.
            table.caption = (f"total: {sum(beat.get('samples_done') or 0 for beat in beats)}/"
                             f"{sum(beat.get('samples_total') or 0 for beat in beats)} samples")
            table.caption_justify = "left"
        return table


def board_eta(run: dict) -> str:
    """The board's ETA cell: the ETA, or how long since the last sample once they stopped coming."""
    speed, eta = pace_texts(run)
    return eta or (speed if (run.get("pace") or {}).get("stale") else "-")
