"""How people see one run on a host: the runs table, one run in detail, its failures, its log, what a stop
ended; and the run tasks' views (specrig/ui/task.py) on one run: one host's output, a group's figures, the
exit status. A sharded run's views are in sharded_view.py, a multi-node job's in node_view.py, a Slurm
job's in specrig/slurm/view.py; what they all draw alike in view_parts.py and specrig/ui/preflight_checks.py.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence

from rich.table import Table

from specrig.contract import (
    ACTIVE_STATES,
    FAILED,
    LOST,
    RESTARTING,
    RUNNING,
    SERVER,
    STALLED,
    STARTING,
    STOPPED,
    SUCCEEDED,
    UNRESPONSIVE,
)
from specrig.dataset.view import run_end_text
from specrig.exit_status import ExitStatus
from specrig.group import HostOutcome
from specrig.inventory import Host
from specrig.run.view_parts import (
    final_verdict,
    format_duration,
    runs_total,
    show_layers_note,
    storage_note,
    training_text,
)
from specrig.slurm.view import show_stopped_job, slurm_job_text
from specrig.ui import console, gpu_table, print_json
from specrig.ui.preflight_checks import show_checks, show_preflight_failed
from specrig.ui.task import TaskView
from specrig.ui.terminal import markup, visible, visible_on, write_raw

STATE_STYLE = {SUCCEEDED: "green", RUNNING: "cyan", STARTING: "cyan", RESTARTING: "yellow",
               STALLED: "yellow", FAILED: "bold red", LOST: "bold red", UNRESPONSIVE: "bold red", STOPPED: "magenta"}


def samples(beat: dict) -> str:
    """A heartbeat's samples: done/total, done, or '-'."""
    done, total = beat.get("samples_done"), beat.get("samples_total")
    if done is None:
        return "-"
    return f"{done}/{total}" if total else str(done)


def print_log(text: str, *, end: str = "\n", raw: bool = False) -> None:
    """Text of a run's log: no markup, no wrapping (every log line shown goes through here); its control
    characters escaped on a terminal, or (`raw`, `inv logs --raw`) the bytes as the host wrote them."""
    if raw:
        write_raw(text + end)
    else:
        console.out(visible_on(console, text), end=end, highlight=False)


def rate_text(beat: dict) -> str:
    """The run's speed: tokens/s (in-process driver) or samples/s (server mode), or ''."""
    if beat.get("tokens_per_s"):
        return f"{beat['tokens_per_s']:.0f} tokens/s"
    if beat.get("samples_per_s"):
        return f"{beat['samples_per_s']:.2f} samples/s"
    return ""


def pace_texts(run: dict) -> tuple[str, str]:
    """(speed, ETA) of a run, '' where there is none; once its samples stopped coming (the host's `pace` says
    stale: remote/base/contract.py pace_now), how long since the last one instead, and no ETA."""
    beat = run.get("heartbeat") or {}
    pace = run.get("pace")
    if pace and pace.get("stale"):
        since = format_duration(pace["since_sample_s"])
        return (f"no new sample for {since}" if pace.get("last_sample_at") else f"no sample yet, {since} in"), ""
    return rate_text(beat), format_duration(beat["eta_s"]) if beat.get("eta_s") else ""


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
        state = f"[{style}]{run['state']}[/]" if style else markup(run["state"])
        if run.get("slurm") and run["state"] in ACTIVE_STATES:
            state += f"\n[dim]{markup(slurm_job_text(run['slurm']))}[/]"
        table.add_row(markup(run["run_id"]), state,
                      markup((run.get("heartbeat") or {}).get("phase") or "-"), progress_cell(run),
                      str(len(run.get("attempts") or [])), *((markup(short_path(run.get("out"))),) if wide else ()),
                      markup(failure["kind"] + (f" ({failure['callee']})" if failure.get("callee") else ""))
                      if failure else "")
    console.print(table)


def progress_cell(run: dict) -> str:
    """The runs table's progress: a training's steps, an extraction's samples."""
    training = run.get("training")
    if training and training.get("global_step") is not None:
        return f"step {training['global_step']}/{training.get('total_steps') or '?'}"
    return samples(run.get("heartbeat") or {})


def show_run(run: dict, *, log_tail: str | None = None) -> None:
    grid = Table.grid(padding=(0, 2))
    style = STATE_STYLE.get(run["state"], "")
    grid.add_row("run", markup(run["run_id"]))
    grid.add_row("state", f"[{style}]{run['state']}[/]" if style else markup(run["state"]))
    beat = run.get("heartbeat") or {}
    speed, eta = pace_texts(run)
    training = training_text(run.get("training"), run.get("checkpoint_plan"))
    if training:  # a training's progress is its steps, not samples
        grid.add_row("phase", markup(beat.get("phase") or "-"))
        grid.add_row("training", markup(training))
    else:
        grid.add_row("phase", ", ".join(filter(None, (markup(beat.get("phase") or "-"), f"{samples(beat)} samples",
                                                      speed, eta and f"ETA {eta}"))))
    if beat.get("server"):
        grid.add_row("server", f"vLLM server {markup(beat['server'])}")
    started = beat.get("startup") or {}
    if started.get("health_to_first_file_s") is not None:
        # Server mode: what the start-up took once the server served (remote/run/server/warm_steps.py).
        grid.add_row("start-up", f"first file {started['health_to_first_file_s']:.1f} s after /health, prepare-data "
                                 f"{markup(started.get('prepare') or '-')}")
    grid.add_row("output", markup(run.get("out") or "-"))
    if run.get("slurm"):
        grid.add_row("Slurm", markup(slurm_job_text(run["slurm"])))
    grid.add_row("attempts", f"{len(run.get('attempts') or [])} (restarts this supervisor: {run.get('restarts', 0)})")
    for attempt in run.get("attempts") or []:
        failure = attempt.get("failure")
        if failure:
            grid.add_row(f"  attempt {attempt['attempt']}", describe_failure(failure))
    refused = run.get("last_failure")
    if run["state"] == FAILED and refused and "attempt" not in refused:
        # Its supervisor refused it before any attempt (the output cannot be written, or has no room).
        grid.add_row("failure", describe_failure(refused))
    if (run.get("exit") or {}).get("dataset"):
        grid.add_row("dataset", run_end_text(run["exit"]["dataset"]))
    if (run.get("exit") or {}).get("draft"):  # a training's end: what `inv accept --draft` takes
        grid.add_row("draft", markup(run["exit"]["draft"]))
    if run.get("acceptance"):
        grid.add_row("acceptance", acceptance_text(run["acceptance"]))
    if run.get("stalled"):
        grid.add_row("stalled", f"no progress for {run.get('seconds_since_progress')} s")
    if run.get("supervisor_unanswering"):
        grid.add_row("supervisor", f"pid {run.get('supervisor_pid')} {markup(run['supervisor_unanswering'])}: "
                                   f"`inv stop --run {markup(run['run_id'])}` ends it, then `inv resume`")
    console.print(grid)
    show_gpus(run.get("gpus"), run.get("gpu_apps") or [])
    if log_tail:
        console.rule("last log lines")
        print_log(log_tail)


def acceptance_text(acceptance: dict) -> str:
    """An acceptance run's drafts in a line each (position 0's rate, the mean acceptance length), and its verdict
    (remote/run/acceptance/verdict.py); `inv accept --run` shows them side by side."""
    lines = []
    for name, found in (acceptance.get("drafts") or {}).items():
        lines.append(f"{name}: " + (f"position 0 {found['position0']['rate'] or 0:.3f} ({found['drafts']} drafts), "
                                    f"mean length {found['mean_acceptance_length'] or 1:.2f}" if found
                                    else "not measured yet"))
    verdict = acceptance.get("verdict")
    if verdict:
        lines.append(("better: " if verdict["better"] else "not better: ") + markup(verdict["reason"]))
    return "\n".join(lines)


def describe_failure(failure: dict) -> str:
    """A classified failure as rich markup: kind and rule, why, where, the log line, advice, verdict.
    What came from the host is escaped: a log line's `[enforce fail at …]` is text, not markup."""
    rule = f" [dim]({markup(failure['rule'])})[/]" if failure.get("rule") else ""
    head, explain = failure["kind"], failure["explain"]
    if explain.lower().startswith(head.replace("-", " ") + ": "):
        # The explanation names its kind in words ("disk low: …"): said once.
        head, explain = explain.split(": ", 1)
    text = f"[bold]{markup(head)}[/]{rule}: {markup(explain)}"
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


def show_stop(result: dict) -> None:
    """What `inv stop` ended, and whether the GPUs let go of the run's memory."""
    slurm = result.get("slurm")
    if slurm:
        show_stopped_job(result, slurm)
        return
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


# ---- the run tasks' views: one host's output, a group's figures, the exit status ------------------

def show_extract(result: dict, *, host: Host, as_json: bool, follow: Callable[[Host, str], ExitStatus] | None
                 ) -> ExitStatus | None:
    """The preflight's checks and the launch; then, given `follow` (the live view), the run until it ends."""
    if as_json:
        print_json(result)
        return None
    if result["preflight"]:
        show_checks(result["preflight"])
    show_layers_note(result)
    note = storage_note(result.get("storage"))
    if note:
        console.print(note)
    console.print(f"launched run [bold]{markup(result['run_id'])}[/] on {host.name} ({markup(result['path'])})")
    if result.get("slurm"):
        console.print(f"submitted Slurm job {markup(result['slurm']['job_id'])} "
                      f"(its script: {markup(result['slurm']['script'])})")
    for entry in result.get("startup_flags") or []:
        console.print(f"the server gets {markup(entry['flag'])}: {markup(entry['because'])}")
    return follow(host, result["run_id"]) if follow else None


def show_sizing(found: dict, *, as_json: bool) -> None:
    """`inv extract --dry-run` (run/sizing.py): per GPU, the weights, the KV cache, the staging; the settings."""
    if as_json:
        print_json(found)
        return
    gib, settings = 1 << 30, found["settings"]
    weights = found["weights_per_gpu"]
    console.print(f"{markup(found['host'])}: {found['gpus']} GPUs of {found['gpu_memory_bytes'] / gib:.1f} GiB, "
                  f"tp {found['tp']}; {markup(found['model'])} (nothing reached)")
    table = Table(title="per GPU", show_header=False)
    for part, size in weights.items():
        table.add_row("weights: " + part.replace("_", " "), f"{size / gib:.2f} GiB")
    table.add_row("runtime reserve", f"{found['runtime_reserve_bytes'] / gib:.2f} GiB")
    table.add_row("KV cache", f"{found['kv_budget_bytes'] / gib:.2f} GiB: {found['kv_tokens']:,} tokens of "
                              f"{found['kv_bytes_per_token'] / 1024:.1f} KiB (MLA latent)")
    table.add_row("staging per request", f"{found['staging_bytes_per_request'] / (1 << 20):.0f} MiB "
                                         f"({found['layer_count']} layers, {found['storage']})")
    console.print(table)
    console.print(f"settings: --max-model-len {settings['max_model_len']}, --max-num-batched-tokens "
                  f"{settings['max_num_batched_tokens']}, --concurrency {settings['concurrency']} "
                  f"({found['concurrency_bound']}), staging {settings['staging_bytes'] / gib:.1f} GiB")


def extract_view(follow: Callable[[Host, str], ExitStatus] | None) -> TaskView:
    """`inv extract` on one host; `follow` (run/live.py's) shows the run live after the launch."""
    return TaskView("extract", show=lambda result, **shown: show_extract(result, follow=follow, **shown),
                    figures=lambda result: f"run {result['run_id']} launched",
                    show_findings=show_preflight_failed)


def show_status(result: dict, *, host: Host, as_json: bool) -> None:
    """The host's runs as a table, or the one run asked for (it comes with its log's tail) in detail."""
    if as_json:
        print_json(result)
    elif "log_tail" in result:
        show_run(result["runs"][0], log_tail=result["log_tail"])
    else:
        show_runs(result["runs"], host)


def status_figures(result: dict) -> str:
    runs = result["runs"]
    if not runs:
        return "no runs yet"
    newest = runs[-1]
    active = [run for run in runs if run["state"] in ACTIVE_STATES]
    shard = newest.get("shard")
    part = (f" (shard {shard['shard_index']} of {shard['shard_count']}, {shard['sharded_run_id']})"
            if shard else "")
    return (f"{len(runs)} run(s), {len(active)} active; newest {newest['run_id']}{part} {newest['state']}, "
            f"{samples(newest.get('heartbeat') or {})} samples")


def status_total(outcomes: Sequence[HostOutcome]) -> str | None:
    """The total line of `inv status` on a group: the samples of each host's run shown (the one
    asked for, else its newest) added up."""
    return runs_total([runs[-1] for outcome in outcomes
                       if outcome.exit_status == ExitStatus.OK for runs in [(outcome.result or {}).get("runs")]
                       if runs])


STATUS = TaskView("status", show=show_status, figures=status_figures, total=status_total)


def show_logs(pieces: Iterator[dict], *, host: Host, as_json: bool, raw: bool = False) -> None:
    """One host's log: its last lines, then (following) the new text until the run ends or Ctrl-C."""
    piece = next(pieces)
    print_log(piece["text"], raw=raw)
    run_id = piece["run_id"]
    try:
        followed = False
        for piece in pieces:
            followed = True
            if piece["text"]:
                print_log(piece["text"], end="", raw=raw)
        if followed:
            console.print(f"\n(run {visible(run_id)} is {visible(piece['state'])})", markup=False)
    except KeyboardInterrupt:
        console.print(f"\nstopped following; run {run_id} goes on")


def write_log(pieces: Iterator[dict], write: Callable[[str], None]) -> dict:
    """One host's log among a group's: its text handed to `write` (the group's view prefixes whole
    lines with the host); {run_id, state} as it ended."""
    first = last = next(pieces)
    if first["text"]:
        write(first["text"] + "\n")  # the last lines come without their final line end
    for last in pieces:
        write(last["text"])
    return {"run_id": first["run_id"], "state": last["state"]}


LOGS = TaskView("logs", show=show_logs, figures=lambda result: f"run {result['run_id']} {result['state']}")
#: `inv logs --raw`: the same, the log's bytes as the host wrote them.
RAW_LOGS = dataclasses.replace(LOGS, show=functools.partial(show_logs, raw=True))


def stop_figures(result: dict) -> str:
    text = (f"run {result['run_id']}: was {result['was']}, now {result['state']}; "
            f"{len(result['pids'])} process(es) ended")
    if result["clean"]:
        return text + "; nothing left"
    left = [f"{len(result['left'])} process(es) still alive"] if result["left"] else []
    if result["gpu_memory_held"] or any(gpu["not_released"] for gpu in result["gpu_memory"]):
        left.append("GPU memory not released")
    return text + "; " + ", ".join(left)


STOP = TaskView("stop", show=lambda result, *, host, as_json: print_json(result) if as_json else show_stop(result),
                figures=stop_figures,
                judge=lambda result: ExitStatus.OK if result["clean"] else ExitStatus.FINDINGS)


def show_resume(result: dict, *, host: Host, as_json: bool, follow: Callable[[Host, str], ExitStatus] | None
                ) -> ExitStatus | None:
    if as_json:
        print_json(result)
        return None
    console.print(f"resumed run [bold]{markup(result['run_id'])}[/] (was {markup(result['resumed_from'])})")
    if result.get("slurm"):
        console.print(f"submitted Slurm job {markup(result['slurm']['job_id'])}")
    return follow(host, result["run_id"]) if follow else None


def resume_figures(result: dict) -> str:
    if result.get("skipped"):
        text = f"run {result['run_id']} left as it is ({result['resumed_from']})"
    else:
        text = f"resumed run {result['run_id']} (was {result['resumed_from']})"
    final = result.get("final")
    return text + (f", now {final['state']}" if final else "")


def resume_view(follow: Callable[[Host, str], ExitStatus] | None) -> TaskView:
    """`inv resume`; on one host `follow` (run/live.py's) shows the run live after it resumed."""
    return TaskView("resume", show=lambda result, **shown: show_resume(result, follow=follow, **shown),
                    figures=resume_figures, judge=final_verdict)


# ---- smoke ----------------------------------------------------------------------------------------

def show_smoke(result: dict, *, host: Host, as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    versions = result.get("versions") or {}
    mode = " (server mode)" if result.get("mode") == SERVER else ""
    console.print(f"[bold green]smoke passed[/] on {host.name}{mode}: {result['samples']} samples of "
                  f"{markup(', '.join(result.get('architectures') or ['?']))} ({markup(result['resolved'])}) "
                  f"shrunk to {result['shrunk']}, "
                  f"layers {result['layer_ids']}"
                  + (f", {result['storage']} storage by {markup(result['connector'])}" if result.get("storage") else "")
                  + f", {result['elapsed_s']} s "
                  f"(speculators {versions.get('speculators')}, vllm {versions.get('vllm')})")


def show_smoke_failed(found, *, host: Host, as_json: bool) -> None:
    """For --json: the failure as JSON on stdout (people get the guarded one-line error)."""
    if as_json:
        print_json({"ok": False, "message": found.message, "failure": found.payload})


def smoke_figures(result: dict) -> str:
    versions = result.get("versions") or {}
    return (f"passed: {result['samples']} samples in {result['elapsed_s']} s (speculators "
            f"{versions.get('speculators')}, vllm {versions.get('vllm')})")


SMOKE = TaskView("smoke", show=show_smoke, figures=smoke_figures, show_findings=show_smoke_failed)
