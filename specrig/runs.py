"""`inv extract`, `status`, `logs`, `stop`, `resume`: supervised extraction runs on a host.

The host does the work (remote/runs.py, remote/supervisor.py); this side turns
arguments and hosts.yaml's `extract:` defaults into the driver's arguments,
runs the preflight, launches, and shows what the host reports.
"""
from __future__ import annotations

import dataclasses
import time

from rich.table import Table

from specrig.errors import Locked, RemoteScriptError, SpecrigError, UsageError
from specrig.exit_status import ExitStatus
from specrig.inventory import Host
from specrig.remote import Remote, connect
from specrig.ui import console, gpu_table, print_json


@dataclasses.dataclass(frozen=True)
class Setting:
    """One `inv extract` setting: its name here and in hosts.yaml, the driver's name, its type."""

    name: str
    driver_key: str
    kind: type
    help: str


#: What `inv extract` takes and hosts.yaml's `extract:` may hold, mapped to the driver's arguments.
SETTINGS = {s.name: s for s in (
    Setting("model", "model", str, "model directory on the host"),
    Setting("data", "dataset", str, "dataset on the host (.json/.jsonl conversations), or sharegpt/ultrachat"),
    Setting("out", "output_dir", str, "output directory on the host"),
    Setting("tp", "tensor_parallel_size", int, "tensor-parallel size (default: all visible GPUs)"),
    Setting("layers", "layer_ids", list, "layer ids to capture, e.g. 2,30,58,60 (default: speculators' choice)"),
    Setting("batch_size", "batch_size", int, "samples per generate() call"),
    Setting("max_len", "max_length", int, "tokens per sample"),
    Setting("max_samples", "max_samples", int, "take at most this many conversations"),
    Setting("seed", "seed", int, "dataset shuffle seed"),
    Setting("load_format", "load_format", str, "vLLM load format (dummy: random weights)"),
    Setting("gpu_memory_utilization", "gpu_memory_utilization", float, "fraction of GPU memory vLLM may take"),
)}
#: Supervision options hosts.yaml's `extract:` may also hold (remote/runs.py OPTION_DEFAULTS).
OPTIONS = {"max_restarts": int, "backoff_s": float, "backoff_max_s": float, "stall_timeout_s": float,
           "load_timeout_s": float,
           "stall_restart": bool, "grace_s": float, "telemetry_interval_s": float}
REQUIRED = ("model", "data", "out")
RUN_TIMEOUT_S = 120


class PreflightFailed(SpecrigError):
    """A preflight check failed; nothing was launched."""

    exit_status = ExitStatus.FINDINGS

    def __init__(self, message: str, *, checks: list, **kwargs):
        super().__init__(message, **kwargs)
        self.checks = checks


def parse_layers(text: str | list) -> list[int]:
    """`2,30,58,60` (or a YAML list) as a list of layer ids."""
    items = text if isinstance(text, list) else [p for p in str(text).replace(" ", "").split(",") if p]
    try:
        layers = [int(item) for item in items]
    except (TypeError, ValueError):
        raise UsageError(f"--layers {text!r}: give layer ids separated by commas, e.g. 2,30,58,60") from None
    if not layers or any(layer < 0 for layer in layers):
        raise UsageError(f"--layers {text!r}: give non-negative layer ids, e.g. 2,30,58,60")
    return layers


def _coerce(name: str, value, kind: type, where: str):
    if kind is list:
        return parse_layers(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise UsageError(f"{where} {value!r}: expected true or false")
    try:
        coerced = kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"{where} {value!r}: expected {kind.__name__}") from None
    if kind in (int, float) and (isinstance(value, bool) or coerced <= 0) and name != "seed":
        raise UsageError(f"{where} {value!r}: expected a positive number")
    return coerced


@dataclasses.dataclass(frozen=True)
class Request:
    """A launch: the driver's arguments, the supervisor's options, the env of the job."""

    driver_args: dict
    options: dict
    env: dict


def build_request(host: Host, given: dict) -> Request:
    """Command-line values over hosts.yaml's `extract:` defaults; every bad value named."""
    defaults = dict(host.extract)
    unknown = sorted(set(defaults) - set(SETTINGS) - set(OPTIONS))
    if unknown:
        raise UsageError(f"hosts.yaml: hosts.{host.name}.extract.{unknown[0]}: unknown key",
                         hint=f"allowed: {', '.join([*SETTINGS, *OPTIONS])}")
    driver_args, options = {}, {}
    for name, setting in SETTINGS.items():
        value, where = given.get(name), f"--{name.replace('_', '-')}"
        if value is None:
            value, where = defaults.get(name), f"hosts.yaml: hosts.{host.name}.extract.{name}"
        if value is not None:
            driver_args[setting.driver_key] = _coerce(name, value, setting.kind, where)
    for name, kind in OPTIONS.items():
        if name in defaults:
            options[name] = _coerce(name, defaults[name], kind, f"hosts.yaml: hosts.{host.name}.extract.{name}")
    for name in REQUIRED:
        if SETTINGS[name].driver_key not in driver_args:
            raise UsageError(f"no --{name} given and hosts.yaml has no hosts.{host.name}.extract.{name}",
                             hint=f"pass --{name} or add it under `extract:` for {host.name}")
    return Request(driver_args=driver_args, options=options, env=dict(host.env))


# -- preflight ----------------------------------------------------------------------------------

def preflight(remote: Remote, host: Host, request: Request) -> list[dict]:
    """The host's checks plus verify-signatures, each {name, ok, detail, advice}."""
    result = remote.call("preflight", {"workdir": host.workdir, "driver_args": request.driver_args},
                         timeout=RUN_TIMEOUT_S)
    return [verify_check(remote, host, request.driver_args.get("model"))] + result["checks"]


def verify_check(remote: Remote, host: Host, model: str | None) -> dict:
    """verify-signatures as a preflight check: any finding of severity `drift` fails it."""
    from specrig.verify import CouldNotCheck, verify_host

    advice = (f"`inv verify-signatures --host {host.name}` lists it; "
              f"`inv apply-patches --host {host.name}` fixes the known drift")
    try:
        report = verify_host(remote, model=model)
    except CouldNotCheck as exc:
        return {"name": "verify-signatures", "ok": False, "detail": f"could not check: {exc.one_line()}",
                "advice": f"`inv doctor --host {host.name}` shows the host's packages"}
    if not report.drift:
        return {"name": "verify-signatures", "ok": True, "advice": None,
                "detail": f"no drift ({len(report.findings)} note(s))"}
    ids = sorted(report.ids)
    return {"name": "verify-signatures", "ok": False, "advice": advice,
            "detail": f"{len(report.drift)} drift finding(s): " + "; ".join(ids[:3]) + (" …" if len(ids) > 3 else "")}


def show_checks(checks: list[dict]) -> None:
    table = Table(title="preflight")
    for column in ("check", "", "detail"):
        table.add_column(column, overflow="fold")
    for item in checks:
        mark = "[green]ok[/]" if item["ok"] else "[bold red]FAIL[/]"
        detail = item["detail"] + (f"\n[yellow]→ {item['advice']}[/]" if item.get("advice") else "")
        table.add_row(item["name"], mark, detail)
    console.print(table)


# -- tasks --------------------------------------------------------------------------------------

def _runs_call(remote: Remote, host: Host, action: str, args: dict, *, timeout: float = RUN_TIMEOUT_S) -> dict:
    try:
        return remote.call("runs", {"action": action, "workdir": host.workdir, **args}, timeout=timeout)
    except RemoteScriptError as exc:
        message = f"{host.name}: {exc.error.get('message', exc.message)}"
        if exc.kind == "output-busy":
            raise Locked(message, hint=_USAGE_HINTS["output-busy"].format(host=host.name)) from None
        if exc.kind in ("unknown-run", "run-active", "run-finished", "bad-argument"):
            raise UsageError(message, hint=_USAGE_HINTS.get(exc.kind, "").format(host=host.name) or None) from None
        raise


_USAGE_HINTS = {"unknown-run": "`inv status --host {host}` lists the runs",
                "output-busy": "`inv stop --host {host}` stops it, or choose another --out",
                "run-active": "`inv status --host {host}` shows it"}


def extract(host: Host, given: dict, *, skip_preflight: bool, attach: bool, as_json: bool) -> int:
    request = build_request(host, given)
    with connect(host) as remote:
        checks = [] if skip_preflight else preflight(remote, host, request)
        failed = [c for c in checks if not c["ok"]]
        if failed:
            if as_json:
                print_json({"launched": False, "preflight": checks})
            else:
                show_checks(checks)
            raise PreflightFailed(f"{host.name}: preflight failed: {', '.join(c['name'] for c in failed)}; "
                                  f"nothing was launched", checks=checks,
                                  hint="fix what it says, or pass --skip-preflight to launch anyway")
        if checks and not as_json:
            show_checks(checks)
        launched = _runs_call(remote, host, "launch", {"host": host.name, "driver_args": request.driver_args,
                                                      "env": request.env, "options": request.options})
        if as_json:
            print_json({"launched": True, "preflight": checks, **launched})
            return ExitStatus.OK
        console.print(f"launched run [bold]{launched['run_id']}[/] on {host.name} ({launched['path']})")
        if not attach:
            return ExitStatus.OK
        return _attach(remote, host, launched["run_id"])


def _attach(remote: Remote, host: Host, run_id: str) -> int:
    from specrig.live import follow

    final = follow(remote, host, run_id)
    if final is None:
        return ExitStatus.OK  # detached: the run goes on
    return ExitStatus.OK if final["state"] == "succeeded" else ExitStatus.FINDINGS


def status(host: Host, run_id: str | None, *, as_json: bool) -> int:
    with connect(host) as remote:
        result = _runs_call(remote, host, "status", {"run": run_id})
    if as_json:
        print_json(result)
        return ExitStatus.OK
    if run_id:
        show_run(result["runs"][0], log_tail=result.get("log_tail"))
    else:
        show_runs(result["runs"], host)
    return ExitStatus.OK


def logs(host: Host, run_id: str | None, *, follow: bool, lines: int) -> int:
    if lines < 1:
        raise UsageError(f"-n {lines!r}: give a positive number of lines")
    with connect(host) as remote:
        result = _runs_call(remote, host, "logs", {"run": run_id, "lines": lines})
        console.print(result["text"], markup=False, highlight=False, soft_wrap=True)
        if not follow:
            return ExitStatus.OK
        offset, run_id = result["offset"], result["run_id"]
        try:
            while True:
                time.sleep(1)
                chunk = _runs_call(remote, host, "logs", {"run": run_id, "offset": offset})
                if chunk["text"]:
                    console.out(chunk["text"], end="", highlight=False)
                offset = chunk["offset"]
                if chunk["state"] not in ("starting", "running", "restarting", "stalled"):
                    console.print(f"\n(run {run_id} is {chunk['state']})", markup=False)
                    return ExitStatus.OK
        except KeyboardInterrupt:
            console.print(f"\nstopped following; run {run_id} goes on")
            return ExitStatus.OK


def stop(host: Host, run_id: str | None, *, as_json: bool) -> int:
    with connect(host) as remote:
        result = _runs_call(remote, host, "stop", {"run": run_id}, timeout=300)
    if as_json:
        print_json(result)
    else:
        console.print(f"run {result['run_id']}: was {result['was']}, now {result['state']}; "
                      f"{len(result['pids'])} process(es) of its group ended")
        for proc in result["left"]:
            console.print(f"[bold red]still alive:[/] pid {proc['pid']} ({proc['state']}) {proc['cmdline']}")
        for app in result["gpu_memory_held"]:
            console.print(f"[bold red]GPU memory still held:[/] pid {app['pid']} {app['memory_used_mib']:.0f} MiB "
                          f"on {app['gpu_uuid']}")
        for gpu in result["gpu_memory"]:
            if gpu["held_by_run_mib"]:
                verdict = "[bold red]NOT released[/]" if gpu["not_released"] else "released"
                console.print(f"GPU {gpu['index']}: the run held {gpu['held_by_run_mib']:.0f} MiB: {verdict} "
                              f"(used {gpu['used_before_mib']:.0f} → {gpu['used_after_mib']:.0f} MiB)")
        if result["clean"]:
            console.print("nothing of the run is left: no process of its group, no GPU memory held by it")
    return ExitStatus.OK if result["clean"] else ExitStatus.FINDINGS


def resume(host: Host, run_id: str | None, *, attach: bool, as_json: bool) -> int:
    with connect(host) as remote:
        result = _runs_call(remote, host, "resume", {"run": run_id})
        if as_json:
            print_json(result)
            return ExitStatus.OK
        console.print(f"resumed run [bold]{result['run_id']}[/] (was {result['resumed_from']})")
        return _attach(remote, host, result["run_id"]) if attach else ExitStatus.OK


# -- views --------------------------------------------------------------------------------------

STATE_STYLE = {"succeeded": "green", "running": "cyan", "starting": "cyan", "restarting": "yellow",
               "stalled": "yellow", "failed": "bold red", "lost": "bold red", "stopped": "magenta"}


def _progress(run: dict) -> str:
    beat = run.get("heartbeat") or {}
    done, total = beat.get("samples_done"), beat.get("samples_total")
    if done is None:
        return "-"
    return f"{done}/{total}" if total else str(done)


def show_runs(runs: list[dict], host: Host) -> None:
    if not runs:
        console.print(f"no runs on {host.name} yet")
        return
    table = Table(title=f"runs on {host.name}")
    for column in ("run", "state", "phase", "samples", "attempts", "output", "last failure"):
        table.add_column(column, overflow="fold")
    for run in runs:
        failure = run.get("last_failure") or {}
        style = STATE_STYLE.get(run["state"], "")
        table.add_row(run["run_id"], f"[{style}]{run['state']}[/]" if style else run["state"],
                      (run.get("heartbeat") or {}).get("phase") or "-", _progress(run),
                      str(len(run.get("attempts") or [])), run.get("out") or "-",
                      failure["kind"] + (f" ({failure['callee']})" if failure.get("callee") else "")
                      if failure else "")
    console.print(table)


def show_run(run: dict, *, log_tail: str | None = None) -> None:
    grid = Table.grid(padding=(0, 2))
    style = STATE_STYLE.get(run["state"], "")
    grid.add_row("run", run["run_id"])
    grid.add_row("state", f"[{style}]{run['state']}[/]" if style else run["state"])
    beat = run.get("heartbeat") or {}
    grid.add_row("phase", f"{beat.get('phase') or '-'}, {_progress(run)} samples"
                          + (f", {beat['tokens_per_s']:.0f} tokens/s" if beat.get("tokens_per_s") else "")
                          + (f", ETA {format_duration(beat['eta_s'])}" if beat.get("eta_s") else ""))
    grid.add_row("output", run.get("out") or "-")
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
        console.print(log_tail, markup=False, highlight=False, soft_wrap=True)


def describe_failure(failure: dict) -> str:
    text = f"[bold]{failure['kind']}[/]: {failure['explain']}"
    if failure.get("callee"):
        text += f"\n    callee: {failure['callee']}"
    if failure.get("caller"):
        text += f"\n    at: {failure['caller']}"
    if failure.get("evidence"):
        text += f"\n    log: {failure['evidence']}"
    text += f"\n    [yellow]→ {failure['advice']}[/]"
    text += "\n    " + ("restarted (retryable)" if failure.get("retryable") else "not restarted: it would repeat")
    return text


def show_gpus(gpus: dict | None, apps: list[dict]) -> None:
    if gpus and gpus.get("available"):
        console.print(gpu_table(gpus["gpus"], apps=apps, title="GPUs"))


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"

