"""The exit codes of every specrig task, documented in the README."""
from __future__ import annotations

import enum
from collections.abc import Iterable


class ExitStatus(enum.IntEnum):
    OK = 0
    #: The check ran and found something: drift, a conflicting patch, a failed run.
    FINDINGS = 1
    #: Bad input: an argument, hosts.yaml, a patchset. Nothing on any host was changed.
    USAGE = 2
    #: The host could not be reached: refused, timed out, name unknown, not SSH.
    CONNECTION = 3
    #: SSH authentication failed.
    AUTH = 4
    #: The host key is unknown (run `inv trust-host`) or changed (possible attack).
    HOST_KEY = 5
    #: The host's Python is missing, not executable or older than 3.9.
    REMOTE_PYTHON = 6
    #: A remote script failed; its traceback is shown.
    REMOTE_ERROR = 7
    #: The remote call exceeded its deadline; the remote process was ended.
    TIMEOUT = 8
    #: Another client holds the lock (applying patches, writing the same output).
    LOCKED = 9
    #: Interrupted by the user (Ctrl-C).
    INTERRUPTED = 130


#: Most serious first: a task on many hosts exits with the first of these that any host came to
#: (README, "Exit codes"). An interruption leaves every host's answer in doubt. Then what a person
#: must act on before anything else: a host key that may mean an attack, then hosts specrig could
#: not use at all (authentication, reach, their Python), then a failure of the work itself (a
#: script error, a deadline), a check that could not run on the host, another client holding the
#: lock (trying again later is enough), and last a check that ran and found something.
SEVERITY: tuple[ExitStatus, ...] = (
    ExitStatus.INTERRUPTED, ExitStatus.HOST_KEY, ExitStatus.AUTH, ExitStatus.CONNECTION, ExitStatus.REMOTE_PYTHON,
    ExitStatus.REMOTE_ERROR, ExitStatus.TIMEOUT, ExitStatus.USAGE, ExitStatus.LOCKED, ExitStatus.FINDINGS,
    ExitStatus.OK,
)


def most_serious(statuses: Iterable[ExitStatus]) -> ExitStatus:
    """The status a task on many hosts exits with: OK only when every host's is OK (or there were none)."""
    return min(statuses, key=SEVERITY.index, default=ExitStatus.OK)
