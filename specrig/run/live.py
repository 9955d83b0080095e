"""The live view of a run: phase, progress and ETA, tokens/s, GPUs, the last log lines.

It only reads: one `runs status` call a second over the task's connection.
Ctrl-C detaches and says so; the run goes on, on the host.
"""
from __future__ import annotations

import time

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from specrig.contract import ACTIVE_STATES, SUCCEEDED
from specrig.errors import ConnectionFailed, RemoteTimeout
from specrig.inventory import Host
from specrig.run.view import STATE_STYLE, describe_failure, format_duration, rate_text, show_run
from specrig.transport import Remote
from specrig.ui import console, gpu_table
from specrig.ui.terminal import markup, visible

POLL_S = 1.0
LOG_LINES = 8


def follow(remote: Remote, host: Host, run_id: str) -> dict | None:
    """Show the run until it ends (its summary is returned) or the user detaches (None)."""
    progress, bar = samples_bar()
    run, tail = None, ""
    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while True:
                result = remote.call("runs.status", {"workdir": host.workdir, "run": run_id,
                                              "lines": LOG_LINES}, timeout=60)
                run, tail = result["runs"][0], result.get("log_tail") or ""
                live.update(render(run, tail, progress, bar))
                if run["state"] not in ACTIVE_STATES:
                    break
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        console.print(f"detached from run {run_id}; it goes on on {host.name}. "
                      f"`inv status --host {host.name} --run {run_id}` shows it, "
                      f"`inv stop --host {host.name} --run {run_id}` stops it.")
        return None
    except (ConnectionFailed, RemoteTimeout) as exc:
        raise type(exc)(f"{exc.message}; run {run_id} goes on on {host.name}",
                        hint=f"`inv status --host {host.name} --run {run_id}` once the host is reachable") from None
    if not console.is_terminal:
        console.line()  # rich leaves a non-terminal's last Live frame without its line end
    console.print(f"run {markup(run_id)} {markup(run['state'])}")
    if run["state"] != SUCCEEDED:
        show_run(run)
    return run


def samples_bar() -> tuple[Progress, int]:
    """The progress bar of samples, with tokens/s and ETA, and its task id."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[rate]}"), TextColumn("ETA {task.fields[eta]}"))
    return progress, progress.add_task("samples", total=None, rate="", eta="-")


def render(run: dict, tail: str, progress: Progress, bar) -> Panel:
    beat = run.get("heartbeat") or {}
    done, total = beat.get("samples_done") or 0, beat.get("samples_total")
    rate = rate_text(beat)
    eta = format_duration(beat["eta_s"]) if beat.get("eta_s") else "-"
    progress.update(bar, completed=done, total=total, rate=rate, eta=eta)
    style = STATE_STYLE.get(run["state"], "")
    header = Text.from_markup(f"[{style}]{markup(run['state'])}[/]  phase [bold]{markup(beat.get('phase') or '-')}[/]  "
                              f"attempt {len(run.get('attempts') or [])}"
                              + (f"  server [bold]{markup(beat['server'])}[/]" if beat.get("server") else "")
                              + (f"  [yellow]stalled {run.get('seconds_since_progress')} s[/]"
                                 if run.get("stalled") else ""))
    parts = [header, progress]
    failure = run.get("last_failure")
    if failure and run["state"] in ("restarting", "failed"):
        parts.append(Text.from_markup("last failure: " + describe_failure(failure)))
    gpus = (run.get("gpus") or {}).get("gpus") or []
    if gpus:
        table = gpu_table(gpus, apps=run.get("gpu_apps") or [], box=None, padding=(0, 1))
        parts.append(table)
    parts.append(Text(visible(tail), style="dim", overflow="ellipsis", no_wrap=True))
    return Panel(Group(*parts), title=f"run {markup(run['run_id'])}", subtitle="Ctrl-C detaches (the run goes on)")

