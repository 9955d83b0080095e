"""`inv extract`, `status`, `logs`, `stop`, `resume` on one host: supervised extraction runs.

Data only: each function returns what the host reports and prints nothing (run/view.py and
run/live.py show it). The host does the work (remote/run/launching.py, remote/run/supervisor.py); this
side turns arguments and hosts.yaml's `extract:` defaults into the driver's arguments
(settings.py), runs the preflight (preflight.py) and launches.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from specrig.contract import ACTIVE_STATES
from specrig.doctor import check_extraction_mode
from specrig.errors import Findings, UsageError
from specrig.inventory import Host
from specrig.run.preflight import preflight
from specrig.run.settings import Request, build_request
from specrig.slurm.submit import refuse_impossible, refuse_nodes, slurm_settings
from specrig.transport import Remote, connect

RUN_TIMEOUT_S = 120
#: Seconds between two looks at a run that is followed.
POLL_S = 1.0


def runs_call(remote: Remote, host: Host, action: str, args: dict, *, timeout: float = RUN_TIMEOUT_S) -> dict:
    """One of the host's `runs.*` commands (launch, status, logs, stop, resume, verify-output)."""
    return remote.call(f"runs.{action}", {"workdir": host.workdir, **args}, timeout=timeout)


def extract(host: Host, given: dict, *, skip_preflight: bool) -> dict:
    """Preflight, then launch: {launched: True, preflight: checks, run_id, ...the host's launch result}.
    A failed check is Findings (its payload: the checks) and nothing is launched. On a Slurm login node
    the launch submits the run as one job, once Slurm's own checks pass (specrig/slurm/submit.py: a job
    that could never run is refused, --skip-preflight or not)."""
    request = build_request(host, given)
    slurm = slurm_settings(host)
    if slurm:
        refuse_nodes(host)
    with connect(host) as remote:
        mode = check_extraction_mode(remote, host, "extract")["mode"]  # speculators 0.5-0.7: exit 2
        request = request.for_mode(mode, host)
        if slurm:
            refuse_impossible(remote, host, paths=[f"{host.workdir}/runs", request.driver_args["output_dir"]])
        checks = [] if skip_preflight else preflight(remote, host, request)
        failed = [c for c in checks if not c["ok"]]
        if failed:
            raise Findings(f"{host.name}: preflight failed: {', '.join(c['name'] for c in failed)}; "
                           f"nothing was launched", payload=checks,
                           hint="fix what it says, or pass --skip-preflight to launch anyway")
        return {"launched": True, "preflight": checks, "layers_source": request.sources.get("layers"),
                **runs_call(remote, host, "launch", launch_args(host, request))}


def launch_args(host: Host, request: Request, **more) -> dict:
    """The host's `runs launch` arguments for `request` (server mode reads `server_python`; a Slurm login
    node's `slurm:` settings make the run a job)."""
    return {"host": host.name, "driver_args": request.driver_args, "env": request.env, "options": request.options,
            "server_python": host.server_python, "slurm": slurm_settings(host), **more}


def status(host: Host, run_id: str | None, *, lines: int | None = None) -> dict:
    """The host's runs, or one run with its log's last `lines` lines (the host's default: 10)."""
    with connect(host) as remote:
        return runs_call(remote, host, "status", {"run": run_id, **({"lines": lines} if lines else {})})


def log_lines(lines: int) -> int:
    """`inv logs -n`: a positive number of lines (checked before any host is reached)."""
    if lines < 1:
        raise UsageError(f"-n {lines!r}: give a positive number of lines")
    return lines


def logs(host: Host, run_id: str | None, *, follow: bool, lines: int, log: str = "driver") -> Iterator[dict]:
    """A run's log as it comes, each piece {run_id, text, offset, state}: its last `lines` lines first
    (without their final line end); with `follow`, the new text each second until the run is no longer
    active (at least once), the last piece's state saying how it ended. Lazy: the connection opens at the first piece."""
    with connect(host) as remote:
        piece = runs_call(remote, host, "logs", {"run": run_id, "lines": lines, "log": log})
        yield piece
        while follow:
            time.sleep(1)
            piece = runs_call(remote, host, "logs", {"run": piece["run_id"], "offset": piece["offset"], "log": log})
            yield piece
            if piece["state"] not in ACTIVE_STATES:
                return


def stop(host: Host, run_id: str | None) -> dict:
    """Stop a run (the newest active one by default) and report what is left of it."""
    with connect(host) as remote:
        return runs_call(remote, host, "stop", {"run": run_id}, timeout=300)


def resume(host: Host, run_id: str | None, *, whole_run: bool = False,
           on_update: Callable[[dict], None] | None = None) -> dict:
    """Resume a run: {run_id, resumed_from, ...}. With on_update, the run is followed on the same
    connection until it ends, each status handed to on_update (a group's live board); `final` is its
    last. `whole_run` (a sharded run or a multi-node job resumed on every host): a host whose run
    succeeded or is active is left as it is."""
    slurm = slurm_settings(host)
    with connect(host) as remote:
        if slurm:
            # The job takes hosts.yaml's `slurm:` now (a longer slurm.time): checked as a launch's.
            refuse_impossible(remote, host, paths=[])
        resumed = runs_call(remote, host, "resume", {"run": run_id, "whole_sharded_run": whole_run, "slurm": slurm})
        if on_update is None:
            return resumed
        return {**resumed, "final": watch_run(remote, host, resumed["run_id"], on_update)}


def watch_run(remote: Remote, host: Host, run_id: str, on_update: Callable[[dict], None], *,
              lines: int = 1) -> dict:
    """Follow a run on an open connection until it is no longer active, each status (with the log's
    last `lines` lines as `log_tail`) handed to on_update; its last status."""
    while True:
        found = runs_call(remote, host, "status", {"run": run_id, "lines": lines})
        run = found["runs"][0]
        on_update({**run, "log_tail": found.get("log_tail") or ""})
        if run["state"] not in ACTIVE_STATES:
            return run
        time.sleep(POLL_S)


def follow_run(host: Host, run_id: str, on_update: Callable[[dict], None], *, lines: int = 1) -> dict:
    """watch_run on a connection of its own: following a run launched or resumed by another call."""
    with connect(host) as remote:
        return watch_run(remote, host, run_id, on_update, lines=lines)
