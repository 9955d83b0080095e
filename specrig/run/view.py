"""How people see runs: the runs table, one run in detail, its failures, the preflight checks, a
run's log; and the run tasks' views (specrig/ui/task.py): one host's output, a group's figures,
the exit status.
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
)
from specrig.exit_status import ExitStatus
from specrig.group import GroupResult, HostOutcome
from specrig.inventory import Host
from specrig.ui import console, gpu_table, print_json
from specrig.ui.group import OUTPUT_LOCK, outcomes_json, show_summary
from specrig.ui.task import TaskView
from specrig.ui.terminal import markup, visible, visible_on, write_raw


def show_checks(checks: list[dict]) -> None:
    table = Table(title="preflight")
    for column in ("check", "", "detail"):
        table.add_column(column, overflow="fold")
    for item in checks:
        mark = "[green]ok[/]" if item["ok"] else "[bold red]FAIL[/]"
        detail = markup(item["detail"]) + (f"\n[yellow]→ {markup(item['advice'])}[/]" if item.get("advice") else "")
        table.add_row(markup(item["name"]), mark, detail)
    console.print(table)


STATE_STYLE = {SUCCEEDED: "green", RUNNING: "cyan", STARTING: "cyan", RESTARTING: "yellow",
               STALLED: "yellow", FAILED: "bold red", LOST: "bold red", STOPPED: "magenta"}


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
                      markup((run.get("heartbeat") or {}).get("phase") or "-"), samples(run.get("heartbeat") or {}),
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
    grid.add_row("phase", ", ".join(filter(None, (markup(beat.get("phase") or "-"), f"{samples(beat)} samples",
                                                  rate_text(beat),
                                                  f"ETA {format_duration(beat['eta_s'])}" if beat.get("eta_s") else ""))))
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
    if run.get("stalled"):
        grid.add_row("stalled", f"no progress for {run.get('seconds_since_progress')} s")
    console.print(grid)
    show_gpus(run.get("gpus"), run.get("gpu_apps") or [])
    if log_tail:
        console.rule("last log lines")
        print_log(log_tail)


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


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def slurm_job_text(slurm: dict) -> str:
    """A run's Slurm job as Slurm says it (remote/slurm/jobs.py lookup): "job 12 pending: Resources, start
    estimate 2026-12-01T21:00:00", "job 12 running on lab-node1, 0:42 of 30:00", "job 12 COMPLETED", or
    why Slurm no longer says anything (no accounting storage: sacct has no record)."""
    job = slurm.get("job") or {}
    name = f"job {slurm['job_id']}"
    state = job.get("state")
    if state is None:
        return f"{name}: {job.get('detail') or 'Slurm says nothing of it'}"
    if state == "PENDING":
        if job.get("reason") in (None, "None"):
            return f"{name} pending: the scheduler has not weighed it yet"
        estimate = job.get("start_time")
        known = estimate and estimate not in ("Unknown", "N/A", "None")
        return f"{name} pending: {job.get('reason')}" + (f", start estimate {estimate}" if known else ", no start estimate yet")
    if state == "RUNNING":
        return f"{name} running on {job.get('nodes')}, {job.get('run_time')} of {job.get('time_limit')}"
    reason = job.get("reason")
    return f"{name} {state}" + (f" ({reason})" if reason and reason != "None" else "")


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


def show_stopped_job(result: dict, slurm: dict) -> None:
    """`inv stop` of a run that is a Slurm job: scancel, the queue, then what is left of its processes."""
    queue = ("[bold red]still in the queue[/]: " if slurm["in_queue"] else "no longer in the queue: ")
    console.print(f"run {markup(result['run_id'])}: was {markup(result['was'])}, now {markup(result['state'])}; "
                  f"job {markup(slurm['job_id'])} cancelled, {queue}"
                  f"{markup(slurm_job_text({'job_id': slurm['job_id'], 'job': slurm['after']}))}")
    for proc in result["left"]:
        console.print(f"[bold red]still alive:[/] pid {proc['pid']} ({markup(proc['state'])}) {markup(proc['cmdline'])}")
    if slurm["before"].get("state") == "PENDING":
        checked = "the job was pending: no process of it had started"
    elif slurm["checked_here"]:
        checked = f"its node is this machine: {len(result['pids'])} process(es) of the run's groups were looked for"
    else:
        left = slurm["supervisor_left_behind"]
        checked = ("its node is another machine: the supervisor's own check there left "
                   + (f"[bold red]{len(left)} process(es)[/]" if left else "nothing"))
    console.print(checked)
    if result["clean"]:
        console.print("nothing of the run is left: no job in the queue, no process of the run")


# ---- the run tasks' views: one host's output, a group's figures, the exit status ------------------

def final_verdict(result: dict) -> ExitStatus:
    """A result that followed its run to the end ("final"): OK only if the run succeeded."""
    final = result.get("final")
    return ExitStatus.OK if final is None or final["state"] == SUCCEEDED else ExitStatus.FINDINGS


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


def layers_note(layers: dict | None, source: str | None) -> str | None:
    """One line when a server-mode run stores other layer ids than speculators' training takes by default:
    a choice when --layers asked for them, a warning when they come from hosts.yaml (issue 17)."""
    if not layers or layers["ids"] == layers["training_default"]:
        return None
    ids, default = layers["ids"], layers["training_default"]
    if source == "--layers":
        return (f"layers {ids}, as --layers asks; speculators' training defaults to {default}: "
                f"train with these ids (specrig-layers.json beside the files records them)")
    return (f"[yellow]warning:[/] layers {ids} ({markup(source or 'the run')}) differ from speculators' training "
            f"default {default}, which training assumes: pass --layers to choose them, or drop that setting")


def storage_note(storage: dict | None) -> str | None:
    """One line when a server-mode run stores fp8: which connector writes, and how training reads the files."""
    if not storage or storage["type"] != "fp8":
        return None
    return (f"fp8 storage: {markup(storage['connector'])} writes the files (hidden_states F8_E4M3 with per-token "
            f"scales); speculators' training reads them with --hidden-states-backend fp8")


def show_layers_note(launched: dict, *, host: str | None = None) -> None:
    """layers_note's line for a launch (its `layers` and `layers_source`), if it has one; on a group
    (a shard, a multi-node job) `host` says whose."""
    note = layers_note(launched.get("layers"), launched.get("layers_source"))
    if note:
        with OUTPUT_LOCK:
            console.print(f"[bold]{markup(host)}[/]: {note}" if host else note)


def show_preflight_failed(found, *, host: Host, as_json: bool) -> None:
    """A failed preflight: its checks (--json: {launched: false, preflight}); nothing was launched."""
    if as_json:
        print_json({"launched": False, "preflight": found.payload})
    else:
        show_checks(found.payload)


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
    shard = newest.get("fleet")
    part = (f" (shard {shard['shard_index']} of {shard['shard_count']}, {shard['fleet_run_id']})"
            if shard else "")
    return (f"{len(runs)} run(s), {len(active)} active; newest {newest['run_id']}{part} {newest['state']}, "
            f"{samples(newest.get('heartbeat') or {})} samples")


def status_total(outcomes: Sequence[HostOutcome]) -> str | None:
    """The total line of `inv status` on a group: the samples of each host's run shown (the one
    asked for, else its newest) added up."""
    return runs_total([runs[-1] for outcome in outcomes
                       if outcome.exit_status == ExitStatus.OK for runs in [(outcome.result or {}).get("runs")]
                       if runs])


def runs_total(runs: Sequence[dict]) -> str | None:
    done = total = hosts = 0
    states: dict[str, int] = {}
    for run in runs:
        beat = run.get("heartbeat") or {}
        hosts += 1
        states[run["state"]] = states.get(run["state"], 0) + 1
        done += beat.get("samples_done") or 0
        total += beat.get("samples_total") or 0
    if not hosts:
        return None
    return (f"total: {done}/{total or '?'} samples over {hosts} host(s) ("
            + ", ".join(f"{n} {state}" for state, n in states.items()) + ")")


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


# ---- a sharded run: preflight, launch, gather ------------------------------------------------------

def preflight_figures(checks: list) -> str:
    return f"{len(checks)} check(s) passed" if checks else "preflight skipped"


def show_shards_preflight(preflight: GroupResult, *, as_json: bool) -> None:
    """Every shard's preflight: the summary; when it failed, each failed host's checks first and that
    nothing was launched (--json: only a failure, {launched: false, preflight: {host: outcome}})."""
    if as_json:
        if preflight.failed:
            print_json({"launched": False, "preflight": outcomes_json(preflight.outcomes)})
        return
    for outcome in preflight.failed:
        if isinstance(outcome.result, list):
            console.print(f"[bold]{outcome.host}[/]:")
            show_checks(outcome.result)
    show_summary("preflight", preflight.outcomes, figures=preflight_figures)
    if preflight.failed:
        console.print(f"nothing was launched: the preflight failed on {', '.join(o.host for o in preflight.failed)}")


def shard_figures(result: dict) -> str:
    text = (f"shard {result['shard_index']} of {result['shard_count']}: run {result['run_id']} launched, "
            f"writing {result['out']}")
    final = result.get("final")
    return text + (f"; {final['state']}" if final else "")


def shards_total(outcomes: Sequence[HostOutcome]) -> str | None:
    """The total line of an attached sharded extraction: each host's run as it ended."""
    return runs_total([outcome.result["final"] for outcome in outcomes
                       if isinstance(outcome.result, dict) and outcome.result.get("final")])


def show_sharded_run(sharded_run_id: str, names: Sequence[str], *, server: bool) -> None:
    split = "speculators' own split, in contiguous chunks" if server else f"sample i goes to host i % {len(names)}"
    console.print(f"fleet run [bold]{sharded_run_id}[/]: {len(names)} shards ({split}: "
                  f"{', '.join(f'{k}={name}' for k, name in enumerate(names))})")


def gather_figures(result: dict) -> str:
    shard = result.get("fleet") or {}
    part = (f"shard {shard['shard_index']} of {shard['shard_count']}, " if shard else "")
    bad = f", {len(result['unloadable'])} do not load" if result["unloadable"] else ""
    where = "no output directory" if result.get("missing_dir") else result["out"]
    return f"{part}run {result['run_id']} {result['state']}: {len(result['indices'])} sample(s){bad} in {where}"


def show_gather(run_id: str, shards: GroupResult, found: dict, *, as_json: bool) -> None:
    """`inv gather`: each shard's line and what they hold together (--json: the union and {host: outcome})."""
    if as_json:
        print_json({"run": run_id, **found, "hosts": outcomes_json(shards.outcomes)})
        return
    show_summary(f"gather {run_id}", shards.outcomes, figures=gather_figures)
    show_union(found, shards.outcomes)


def show_union(found: dict, outcomes: Sequence[HostOutcome]) -> None:
    """What `inv gather` found the shards hold together."""
    if found["complete"]:
        console.print(f"complete: {found['dataset_samples']} samples, every index once, each loads whole "
                      f"(outputs: {visible(', '.join(o.host + ':' + o.result['out'] for o in outcomes))})", markup=False)
    else:
        console.print("incomplete: " + visible("; ".join(found["problems"])), style="bold red", markup=False)


# ---- a sharded run as a Slurm job array ----------------------------------------------------------

def show_array(result: dict, *, host: Host, as_json: bool) -> None:
    """`inv extract --array N`: the checks, the array job, each task's run."""
    if as_json:
        print_json(result)
        return
    if result["preflight"]:
        show_checks(result["preflight"])
    console.print(f"submitted sharded run [bold]{markup(result['fleet_run_id'])}[/] on {host.name} as Slurm job "
                  f"array {markup(result['job_id'])} (its script: {markup(result['script'])})")
    for run in result["runs"]:
        console.print(f"  task {run['task']}: run {markup(run['run_id'])} → {markup(run['out'])}")
    console.print(f"`inv status --host {host.name}` shows the tasks, `inv gather --host {host.name} --run "
                  f"{markup(result['fleet_run_id'])}` checks their union; `inv resume --host {host.name} --run RUN` "
                  f"resubmits one task alone")


ARRAY = TaskView("extract", show=show_array, figures=lambda result: f"job array {result['job_id']} submitted",
                 show_findings=show_preflight_failed)


def show_slurm_nodes(result: dict, *, host: Host, as_json: bool) -> None:
    """`inv extract --nodes` on a Slurm login node: the checks, the job, each node's run."""
    if as_json:
        print_json(result)
        return
    if result["preflight"]:
        show_checks(result["preflight"])
    console.print(f"submitted multi-node job [bold]{markup(result['job_id'])}[/] ({markup(result['describe'])}) on "
                  f"{host.name} as Slurm job {markup(result['slurm_job_id'])} (its script: {markup(result['script'])})")
    for run in result["runs"]:
        console.print(f"  node {run['rank']} ({run['role']}): run {markup(run['run_id'])}")
    console.print(f"`inv status --host {host.name}` shows the nodes' runs, `inv stop --host {host.name} --run "
                  f"{markup(result['job_id'])}` cancels the job")


SLURM_NODES = TaskView("extract", show=show_slurm_nodes,
                       figures=lambda result: f"multi-node job {result['job_id']} submitted",
                       show_findings=show_preflight_failed)


# ---- a multi-node job ---------------------------------------------------------------------------

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


def sharded_view(sharded_run_id: str) -> TaskView:
    """The shards launched (and, attached, followed to their end): each host's line, then the summary."""
    return TaskView(f"extract {sharded_run_id}", show=None, figures=shard_figures, judge=final_verdict,
                    total=shards_total)
