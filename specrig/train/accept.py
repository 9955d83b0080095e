"""`inv accept` on one host: a draft's acceptance measured against an untrained one (issue 36).

Data only: the functions return what the host reports and print nothing (accept_view.py shows it). The host
does the work (remote/run/acceptance/: the launch checks every argument, the supervisor runs vLLM with each
draft); this side checks what it can without the host, launches, and follows the run to its report.
"""
from __future__ import annotations

from collections.abc import Callable

from specrig.contract import ACCEPT_DEFAULTS, ACTIVE_STATES, KIND_ACCEPT, SUCCEEDED
from specrig.errors import UsageError
from specrig.inventory import Host
from specrig.run.runs import RUN_TIMEOUT_S, runs_call, watch_run
from specrig.slurm.submit import slurm_settings
from specrig.transport import connect


def flag(name: str) -> str:
    """The task's flag of an option: Invoke gives a one-letter name its short flag alone (-k)."""
    return f"-{name}" if len(name) == 1 else f"--{name.replace('_', '-')}"


def check_sizes(sizes: dict) -> dict:
    """The whole-number options, at least 1 (first_row at least 0), before any host is reached; the defaults
    filled in."""
    for name, value in sizes.items():
        minimum = 0 if name == "first_row" else 1
        if value is not None and value < minimum:
            raise UsageError(f"{flag(name)} {value!r}: give a whole number, at least {minimum}")
    return {name: ACCEPT_DEFAULTS[name] if value is None and name in ACCEPT_DEFAULTS else value
            for name, value in sizes.items()}


def launch(host: Host, given: dict, *, on_update: Callable[[dict], None] | None = None) -> dict:
    """The measurement launched on the host: the host's launch result ({"run_id", "path", "supervisor_pid",
    "slurm", "kind", "accept": the plan}); with on_update, followed on the same connection to its end, each
    status handed to on_update: its report, the launch result as "launched"."""
    args = {"workdir": host.workdir, "host": host.name, "env": host.env, "server_python": host.server_python,
            "slurm": slurm_settings(host), **given}
    with connect(host) as remote:
        launched = remote.call("accept.launch", args, timeout=RUN_TIMEOUT_S)
        if on_update is None:
            return launched
        final = watch_run(remote, host, launched["run_id"], on_update)
    return {"launched": launched, **report_of(final)}


def report(host: Host, run_id: str, *, on_update: Callable[[dict], None] | None = None) -> dict:
    """The report of an acceptance run: as it is now, or with on_update once it ended (followed meanwhile)."""
    with connect(host) as remote:
        found = runs_call(remote, host, "status", {"run": run_id})
        run = found["runs"][0]
        if run.get("kind") != KIND_ACCEPT:
            raise UsageError(f"--run {run_id!r} is a run of kind {run.get('kind')!r}, not an acceptance measurement",
                             hint="name a run `inv accept` started (`inv status --host H` lists them)")
        if on_update is not None and run["state"] in ACTIVE_STATES:
            run = watch_run(remote, host, run["run_id"], on_update)
    return report_of(run)


def report_of(run: dict) -> dict:
    """What `inv accept` shows of a run's status: its state, each draft's rates, the verdict, the failure."""
    acceptance = run.get("acceptance") or {}
    return {"run_id": run["run_id"], "state": run["state"], "drafts": acceptance.get("drafts") or {},
            "verdict": acceptance.get("verdict"), "failure": run.get("last_failure"),
            "plan": acceptance.get("plan"), "heartbeat": run.get("heartbeat")}


def better(result: dict) -> bool:
    """Exit 0 only for a finished measurement whose verdict says the draft is clearly better."""
    return result.get("state") == SUCCEEDED and bool((result.get("verdict") or {}).get("better"))
