"""A task on a group of hosts: `--host` names a host, a group, `all`, or a comma list of those.

Data only, nothing printed (specrig/ui/group.py shows it; specrig/cli/runner.py picks one host's
output or a group's). pyinfra-style: a task hands `run_each` a per-host function (Host → result).
Each host runs on a thread of its own with its own connection, at most `parallelism()` at once,
and comes back as a HostOutcome (data: exit status, result or error, seconds) the moment it
finishes, so a slow host holds nobody back. A host's failure (unreachable, bad key, drift, a
script error, a timeout) stays in its outcome: it never stops or hides another host's. All of
them together are a GroupResult (Fabric's Group.run → GroupResult), whose exit status is the most
serious among the hosts (specrig/exit_status.py: SEVERITY).
"""
from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from specrig.errors import Findings, InventoryError, SpecrigError, UsageError
from specrig.exit_status import ExitStatus, most_serious
from specrig.inventory import LOCAL, Host, Inventory

#: `--host all`: every host of hosts.yaml (not `local`). A host or group of that name comes first.
ALL = "all"
PARALLEL_VARIABLE = "SPECRIG_PARALLEL"
#: Hosts worked on at once. Each holds one SSH connection and mostly waits on the network, so a
#: few dozen cost the laptop little; more than that is a burst of logins a bastion may refuse.
DEFAULT_PARALLEL = 32


def group_hosts(inventory: Inventory, spec: str) -> list[Host] | None:
    """The hosts of a `--host` that names several (a group, `all`, a comma list); None when it names
    one host, whose task keeps its single-host output. A group of one is still a group: a script
    gets the same per-host JSON whatever the group's size."""
    spec = spec.strip()
    if spec in inventory.hosts or not ("," in spec or spec in inventory.groups or spec == ALL):
        return None
    return select_hosts(inventory, spec)


def select_hosts(inventory: Inventory, spec: str) -> list[Host]:
    """The hosts `spec` names, in its order, each once. Every unknown name is an InventoryError
    (exit 2) raised before anything runs, naming them all."""
    names = [name.strip() for name in spec.split(",")]
    if not all(names):
        raise UsageError(f"--host {spec!r}: an empty name in the list",
                         hint="separate host or group names with single commas")
    unknown = [name for name in names if not _known(inventory, name)]
    if unknown:
        raise InventoryError(f"{inventory.path}: no host or group {', '.join(map(repr, unknown))}",
                             hint=f"known hosts: {', '.join(sorted(inventory.hosts)) or 'none'}, local; "
                                  f"groups: {', '.join(sorted(inventory.groups)) or 'none'}; or all")
    selected: dict[str, Host] = {}
    for name in names:
        members = list(inventory) if name == ALL and not _named(inventory, name) else inventory.select(name)
        for host in members:
            selected.setdefault(host.name, host)
    return list(selected.values())


def _named(inventory: Inventory, name: str) -> bool:
    return name in inventory.hosts or name in inventory.groups


def _known(inventory: Inventory, name: str) -> bool:
    return _named(inventory, name) or name in (LOCAL, ALL)


def parallelism() -> int:
    """How many hosts run at once: $SPECRIG_PARALLEL, else DEFAULT_PARALLEL."""
    value = os.environ.get(PARALLEL_VARIABLE, "").strip()
    if not value:
        return DEFAULT_PARALLEL
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{PARALLEL_VARIABLE}={value!r}: give a whole number of hosts, 1 or more")
    return int(value)


@dataclasses.dataclass(frozen=True)
class HostOutcome:
    """What one host's part of a task came to."""

    host: str
    exit_status: ExitStatus
    elapsed_s: float
    #: What the per-host function returned, or, for Findings, what was found (its payload).
    result: Any = None
    error: SpecrigError | None = None

    def as_json(self, result_json: Callable[[Any], Any] = lambda result: result) -> dict:
        """{exit_status, elapsed_s, result and/or error (+ detail)}; `result_json` turns a result
        that is not plain data (a drift Report) into what --json prints of it."""
        record: dict[str, Any] = {"exit_status": int(self.exit_status), "elapsed_s": round(self.elapsed_s, 3)}
        if self.result is not None:
            record["result"] = result_json(self.result)
        if self.error is not None:
            record["error"] = self.error.one_line()
            if self.error.detail:
                record["detail"] = self.error.detail
        return record


def run_each(hosts: Sequence[Host], work: Callable[[Host], Any], *, parallel: int,
             judge: Callable[[Any], ExitStatus] | None = None) -> Iterator[HostOutcome]:
    """`work(host)` for every host, at most `parallel` at once; yields each outcome as it finishes.

    `judge(result)` is the exit status of a result that came back (default OK): a drift report
    is FINDINGS without being an error. Workers are daemon threads: on Ctrl-C the process exits
    without waiting for a host's call to reach its deadline, and its connections end with it.
    """
    waiting: queue.Queue[Host] = queue.Queue()
    for host in hosts:
        waiting.put(host)
    finished: queue.Queue[HostOutcome] = queue.Queue()

    def worker() -> None:
        while True:
            try:
                host = waiting.get_nowait()
            except queue.Empty:
                return
            finished.put(_outcome(host, work, judge))

    for number in range(min(parallel, len(hosts))):
        threading.Thread(target=worker, name=f"specrig-host-{number}", daemon=True).start()
    for _ in hosts:
        yield finished.get()


def _outcome(host: Host, work: Callable[[Host], Any], judge: Callable[[Any], ExitStatus] | None) -> HostOutcome:
    started = time.monotonic()
    try:
        result = work(host)
    except Findings as found:
        return HostOutcome(host.name, found.exit_status, time.monotonic() - started, result=found.payload,
                           error=found)
    except SpecrigError as error:
        return HostOutcome(host.name, error.exit_status, time.monotonic() - started, error=error)
    except Exception as exc:  # a bug met on one host must not hide the other hosts' results
        error = SpecrigError(f"{host.name}: specrig failed: {type(exc).__name__}: {exc}",
                             detail=traceback.format_exc())
        return HostOutcome(host.name, error.exit_status, time.monotonic() - started, error=error)
    status = judge(result) if judge else ExitStatus.OK
    return HostOutcome(host.name, status, time.monotonic() - started, result=result)


@dataclasses.dataclass(frozen=True)
class GroupResult:
    """What a task on a group of hosts came to: each host's outcome, in the order `--host` named them."""

    #: Detached (Ctrl-C): only the hosts that had finished.
    outcomes: tuple[HostOutcome, ...]

    @property
    def exit_status(self) -> ExitStatus:
        """The most serious of the hosts' (only the finished hosts', when detached)."""
        return most_serious(outcome.exit_status for outcome in self.outcomes)

    @property
    def failed(self) -> list[HostOutcome]:
        return [outcome for outcome in self.outcomes if outcome.exit_status != ExitStatus.OK]


class Detached(KeyboardInterrupt):
    """Ctrl-C while a group's hosts ran: what the finished hosts came to (a KeyboardInterrupt still,
    for a caller that does not detach)."""

    def __init__(self, result: GroupResult):
        super().__init__()
        self.result = result


def run_group(hosts: Sequence[Host], work: Callable[[Host], Any], *, parallel: int | None = None,
              judge: Callable[[Any], ExitStatus] | None = None,
              on_outcome: Callable[[HostOutcome], None] | None = None) -> GroupResult:
    """`work(host)` on every host (run_each), each outcome handed to `on_outcome` as it finishes.

    Ctrl-C (KeyboardInterrupt) escapes with the hosts finished so far as `Detached.result`."""
    finished: dict[str, HostOutcome] = {}
    try:
        for outcome in run_each(hosts, work, parallel=parallel or parallelism(), judge=judge):
            finished[outcome.host] = outcome
            if on_outcome is not None:
                on_outcome(outcome)
    except KeyboardInterrupt:
        raise Detached(GroupResult(tuple(finished[h.name] for h in hosts if h.name in finished))) from None
    return GroupResult(tuple(finished[host.name] for host in hosts))
