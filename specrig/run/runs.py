"""`inv extract`, `status`, `logs`, `stop`, `resume`: supervised extraction runs on a host.

The host does the work (remote/run/runs.py, remote/run/supervisor.py); this side turns
arguments and hosts.yaml's `extract:` defaults into the driver's arguments (settings.py),
runs the preflight (preflight.py), launches, and shows what the host reports (view.py, live.py).
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

from specrig.contract import ACTIVE_STATES, SUCCEEDED
from specrig.doctor import check_extraction_mode
from specrig.errors import Findings, UsageError
from specrig.exit_status import ExitStatus
from specrig.inventory import Host
from specrig.run.live import POLL_S, follow
from specrig.run.preflight import preflight
from specrig.run.settings import Request, build_request
from specrig.run.view import show_checks, show_run, show_runs, show_stop
from specrig.transport import Remote, connect
from specrig.ui import console, print_json
from specrig.ui.terminal import markup, visible, visible_on, write_raw

RUN_TIMEOUT_S = 120


def runs_call(remote: Remote, host: Host, action: str, args: dict, *, timeout: float = RUN_TIMEOUT_S) -> dict:
    """One of the host's `runs.*` commands (launch, status, logs, stop, resume, verify-output)."""
    return remote.call(f"runs.{action}", {"workdir": host.workdir, **args}, timeout=timeout)


def extract(host: Host, given: dict, *, skip_preflight: bool, attach: bool, as_json: bool) -> int:
    request = build_request(host, given)
    with connect(host) as remote:
        mode = check_extraction_mode(remote, host, "extract")["mode"]  # speculators 0.5-0.7: exit 2
        request = request.for_mode(mode, host)
        checks = [] if skip_preflight else preflight(remote, host, request)
        failed = [c for c in checks if not c["ok"]]
        if failed:
            if as_json:
                print_json({"launched": False, "preflight": checks})
            else:
                show_checks(checks)
            raise Findings(f"{host.name}: preflight failed: {', '.join(c['name'] for c in failed)}; "
                           f"nothing was launched", payload=checks,
                           hint="fix what it says, or pass --skip-preflight to launch anyway")
        if checks and not as_json:
            show_checks(checks)
        launched = runs_call(remote, host, "launch", launch_args(host, request))
        if as_json:
            print_json({"launched": True, "preflight": checks, **launched})
            return ExitStatus.OK
        console.print(f"launched run [bold]{markup(launched['run_id'])}[/] on {host.name} ({markup(launched['path'])})")
        if not attach:
            return ExitStatus.OK
        return _attach(remote, host, launched["run_id"])


def launch_args(host: Host, request: Request, **more) -> dict:
    """The host's `runs launch` arguments for `request` (server mode reads `server_python`)."""
    return {"host": host.name, "driver_args": request.driver_args, "env": request.env, "options": request.options,
            "server_python": host.server_python, **more}


def _attach(remote: Remote, host: Host, run_id: str) -> int:
    final = follow(remote, host, run_id)
    if final is None:
        return ExitStatus.OK  # detached: the run goes on
    return ExitStatus.OK if final["state"] == SUCCEEDED else ExitStatus.FINDINGS


def run_status(host: Host, run_id: str | None) -> dict:
    """The host's runs (or one run, with its log's last lines), on a connection of its own."""
    with connect(host) as remote:
        return runs_call(remote, host, "status", {"run": run_id})


def status(host: Host, run_id: str | None, *, as_json: bool) -> int:
    result = run_status(host, run_id)
    if as_json:
        print_json(result)
        return ExitStatus.OK
    if run_id:
        show_run(result["runs"][0], log_tail=result.get("log_tail"))
    else:
        show_runs(result["runs"], host)
    return ExitStatus.OK


def log_lines(lines: int) -> int:
    """`inv logs -n`: a positive number of lines (checked before any host is reached)."""
    if lines < 1:
        raise UsageError(f"-n {lines!r}: give a positive number of lines")
    return lines


def new_log_text(remote: Remote, host: Host, run_id: str, offset: int, *, log: str) -> Iterator[dict]:
    """The log's new text each second from byte `offset` ({text, offset, state}), until the run
    is no longer active: the last chunk's state says how it ended."""
    while True:
        time.sleep(1)
        chunk = runs_call(remote, host, "logs", {"run": run_id, "offset": offset, "log": log})
        yield chunk
        if chunk["state"] not in ACTIVE_STATES:
            return
        offset = chunk["offset"]


def logs(host: Host, run_id: str | None, *, follow: bool, lines: int, log: str = "driver", raw: bool = False) -> int:
    """The log on stdout: its control characters escaped on a terminal (specrig.ui.terminal); `raw`:
    the text as the host has it, whatever stdout is."""
    log_lines(lines)
    with connect(host) as remote:
        result = runs_call(remote, host, "logs", {"run": run_id, "lines": lines, "log": log})
        if raw:
            write_raw(result["text"] + "\n")
        else:
            console.print(visible_on(console, result["text"]), markup=False, highlight=False, soft_wrap=True)
        if not follow:
            return ExitStatus.OK
        run_id = result["run_id"]
        try:
            for chunk in new_log_text(remote, host, run_id, result["offset"], log=log):
                if chunk["text"] and raw:
                    write_raw(chunk["text"])
                elif chunk["text"]:
                    console.out(visible_on(console, chunk["text"]), end="", highlight=False)
            console.print(f"\n(run {visible(run_id)} is {visible(chunk['state'])})", markup=False)
            return ExitStatus.OK
        except KeyboardInterrupt:
            console.print(f"\nstopped following; run {run_id} goes on")
            return ExitStatus.OK


def stream_logs(host: Host, run_id: str | None, *, follow: bool, lines: int,
                write: Callable[[str], None], log: str = "driver") -> dict:
    """`logs` of one host among many: its text goes to `write` (the fleet view prefixes whole lines
    with the host), and {run_id, state} comes back."""
    with connect(host) as remote:
        result = runs_call(remote, host, "logs", {"run": run_id, "lines": lines, "log": log})
        if result["text"]:
            write(result["text"] + "\n")  # the last lines come without their final line end
        state = result["state"]
        if follow:
            for chunk in new_log_text(remote, host, result["run_id"], result["offset"], log=log):
                write(chunk["text"])
                state = chunk["state"]
    return {"run_id": result["run_id"], "state": state}


def stop_run(host: Host, run_id: str | None) -> dict:
    """Stop a run (the newest active one by default) and report what is left of it."""
    with connect(host) as remote:
        return runs_call(remote, host, "stop", {"run": run_id}, timeout=300)


def stop(host: Host, run_id: str | None, *, as_json: bool) -> int:
    result = stop_run(host, run_id)
    if as_json:
        print_json(result)
    else:
        show_stop(result)
    return ExitStatus.OK if result["clean"] else ExitStatus.FINDINGS


def resume(host: Host, run_id: str | None, *, attach: bool, as_json: bool) -> int:
    with connect(host) as remote:
        result = runs_call(remote, host, "resume", {"run": run_id})
        if as_json:
            print_json(result)
            return ExitStatus.OK
        console.print(f"resumed run [bold]{markup(result['run_id'])}[/] (was {markup(result['resumed_from'])})")
        return _attach(remote, host, result["run_id"]) if attach else ExitStatus.OK


def resume_and_watch(host: Host, run_id: str | None, *, on_update: Callable[[dict], None] | None,
                     fleet: bool = False) -> dict:
    """`resume` of one host among many. With on_update, the run is followed on the same connection
    until it ends, each status handed to on_update (a fleet's live board); `final` is its last.
    `fleet` (a whole fleet run resumed): a host whose run succeeded or is active is left as it is."""
    with connect(host) as remote:
        resumed = runs_call(remote, host, "resume", {"run": run_id, "fleet": fleet})
        if on_update is None:
            return resumed
        return {**resumed, "final": watch_run(remote, host, resumed["run_id"], on_update)}


def watch_run(remote: Remote, host: Host, run_id: str, on_update: Callable[[dict], None]) -> dict:
    """Follow a run on an open connection until it is no longer active, each status handed to
    on_update (a fleet's live board); its last status."""
    while True:
        run = runs_call(remote, host, "status", {"run": run_id, "lines": 1})["runs"][0]
        on_update(run)
        if run["state"] not in ACTIVE_STATES:
            return run
        time.sleep(POLL_S)


def final_verdict(result: dict) -> ExitStatus:
    """A host's result that followed its run to the end ("final"): OK only if the run succeeded."""
    return ExitStatus.OK if "final" not in result or result["final"]["state"] == SUCCEEDED else ExitStatus.FINDINGS
