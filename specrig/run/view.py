"""How people see runs: the runs table, one run in detail, its failures, the preflight checks."""
from __future__ import annotations

from rich.table import Table

from specrig.inventory import Host
from specrig.ui import console, gpu_table
from specrig.ui.terminal import markup, visible


def show_checks(checks: list[dict]) -> None:
    table = Table(title="preflight")
    for column in ("check", "", "detail"):
        table.add_column(column, overflow="fold")
    for item in checks:
        mark = "[green]ok[/]" if item["ok"] else "[bold red]FAIL[/]"
        detail = markup(item["detail"]) + (f"\n[yellow]→ {markup(item['advice'])}[/]" if item.get("advice") else "")
        table.add_row(markup(item["name"]), mark, detail)
    console.print(table)


STATE_STYLE = {"succeeded": "green", "running": "cyan", "starting": "cyan", "restarting": "yellow",
               "stalled": "yellow", "failed": "bold red", "lost": "bold red", "stopped": "magenta"}


def _progress(run: dict) -> str:
    beat = run.get("heartbeat") or {}
    done, total = beat.get("samples_done"), beat.get("samples_total")
    if done is None:
        return "-"
    return f"{done}/{total}" if total else str(done)


def rate_text(beat: dict) -> str:
    """The run's speed: tokens/s (in-process driver) or samples/s (server mode), or ''."""
    if beat.get("tokens_per_s"):
        return f"{beat['tokens_per_s']:.0f} tokens/s"
    if beat.get("samples_per_s"):
        return f"{beat['samples_per_s']:.2f} samples/s"
    return ""


#: Terminal width from which the runs table has room for an output column.
WIDE_COLUMNS = 110


def short_path(path: str | None) -> str:
    """An output directory in a table cell: its last two parts (`inv status --run` shows it whole)."""
    if not path:
        return "-"
    parts = path.rstrip("/").split("/")
    return path if len(parts) <= 3 else "…/" + "/".join(parts[-2:])


def show_runs(runs: list[dict], host: Host) -> None:
    if not runs:
        console.print(f"no runs on {host.name} yet")
        return
    table = Table(title=f"runs on {host.name}")
    # The run id stays whole (it is what --run takes); the output directory only where there is room
    # for it (`inv status --run ID` shows it whole).
    wide = console.width >= WIDE_COLUMNS
    table.add_column("run", no_wrap=True)
    for column in ("state", "phase", "samples", "tries", *(("output",) if wide else ()), "last failure"):
        table.add_column(column, overflow="fold")
    for run in runs:
        failure = run.get("last_failure") or {}
        style = STATE_STYLE.get(run["state"], "")
        table.add_row(markup(run["run_id"]), f"[{style}]{run['state']}[/]" if style else markup(run["state"]),
                      markup((run.get("heartbeat") or {}).get("phase") or "-"), _progress(run),
                      str(len(run.get("attempts") or [])), *((markup(short_path(run.get("out"))),) if wide else ()),
                      markup(failure["kind"] + (f" ({failure['callee']})" if failure.get("callee") else ""))
                      if failure else "")
    console.print(table)


def show_run(run: dict, *, log_tail: str | None = None) -> None:
    grid = Table.grid(padding=(0, 2))
    style = STATE_STYLE.get(run["state"], "")
    grid.add_row("run", markup(run["run_id"]))
    grid.add_row("state", f"[{style}]{run['state']}[/]" if style else markup(run["state"]))
    beat = run.get("heartbeat") or {}
    grid.add_row("phase", ", ".join(filter(None, (markup(beat.get("phase") or "-"), f"{_progress(run)} samples",
                                                  rate_text(beat),
                                                  f"ETA {format_duration(beat['eta_s'])}" if beat.get("eta_s") else ""))))
    if beat.get("server"):
        grid.add_row("server", f"vLLM server {markup(beat['server'])}")
    grid.add_row("output", markup(run.get("out") or "-"))
    grid.add_row("attempts", f"{len(run.get('attempts') or [])} (restarts this supervisor: {run.get('restarts', 0)})")
    for attempt in run.get("attempts") or []:
        failure = attempt.get("failure")
        if failure:
            grid.add_row(f"  attempt {attempt['attempt']}", describe_failure(failure))
    if run.get("stalled"):
        grid.add_row("stalled", f"no progress for {run.get('seconds_since_progress')} s")
    console.print(grid)
    show_gpus(run.get("gpus"), run.get("gpu_apps") or [])
    if log_tail:
        console.rule("last log lines")
        console.print(visible(log_tail), markup=False, highlight=False, soft_wrap=True)


def describe_failure(failure: dict) -> str:
    """A classified failure as rich markup: kind and rule, why, where, the log line, advice, verdict.
    What came from the host is escaped: a log line's `[enforce fail at …]` is text, not markup."""
    rule = f" [dim]({markup(failure['rule'])})[/]" if failure.get("rule") else ""
    text = f"[bold]{markup(failure['kind'])}[/]{rule}: {markup(failure['explain'])}"
    for label, key in (("callee", "callee"), ("at", "caller"), ("log", "evidence")):
        if failure.get(key):
            text += f"\n    {label}: {markup(str(failure[key]))}"
    text += f"\n    [yellow]→ {markup(failure['advice'])}[/]"
    return text + "\n    " + _restart_verdict(failure)


def _restart_verdict(failure: dict) -> str:
    # `restarted` is recorded by supervisors since the retry policy; older runs have only `retryable`.
    restarted = failure.get("restarted", failure.get("retryable"))
    if restarted:
        return "restarted (retryable)"
    if failure.get("retryable"):
        return "not restarted: the restarts are used up"
    return "not restarted: it would repeat"


def show_gpus(gpus: dict | None, apps: list[dict]) -> None:
    if gpus and gpus.get("available"):
        console.print(gpu_table(gpus["gpus"], apps=apps, title="GPUs"))


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def show_stop(result: dict) -> None:
    """What `inv stop` ended, and whether the GPUs let go of the run's memory."""
    console.print(f"run {markup(result['run_id'])}: was {markup(result['was'])}, now {markup(result['state'])}; "
                  f"{len(result['pids'])} process(es) of its group ended")
    for proc in result["left"]:
        console.print(f"[bold red]still alive:[/] pid {proc['pid']} ({markup(proc['state'])}) {markup(proc['cmdline'])}")
    for app in result["gpu_memory_held"]:
        console.print(f"[bold red]GPU memory still held:[/] pid {app['pid']} {app['memory_used_mib']:.0f} MiB "
                      f"on {markup(app['gpu_uuid'])}")
    for gpu in result["gpu_memory"]:
        if gpu["held_by_run_mib"]:
            verdict = "[bold red]NOT released[/]" if gpu["not_released"] else "released"
            console.print(f"GPU {gpu['index']}: the run held {gpu['held_by_run_mib']:.0f} MiB: {verdict} "
                          f"(used {gpu['used_before_mib']:.0f} → {gpu['used_after_mib']:.0f} MiB)")
    if result["clean"]:
        console.print("nothing of the run is left: no process of its group, no GPU memory held by it")
