"""What every task shares: typed errors become one line on stderr and an exit code."""
from __future__ import annotations

import functools

import invoke

from specrig.errors import SpecrigError, UsageError
from specrig.exit_status import ExitStatus
from specrig.ui import errors
from specrig.ui.terminal import markup, visible


def guarded(function):
    """Wrap a task body: SpecrigError → one-line message (+ detail) and its ExitStatus; Ctrl-C → 130."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            status = function(*args, **kwargs)
        except SpecrigError as exc:
            # Escaped: `[host]:port` in a message is text, not rich markup; a host's text in it (a message,
            # a traceback) shows its control characters, which the terminal does not obey.
            errors.print(f"[bold red]error:[/] {markup(exc.one_line())}", markup=True, soft_wrap=True)
            if exc.detail:
                errors.print(visible(exc.detail.rstrip()), markup=False, soft_wrap=True)
            raise invoke.Exit(code=int(exc.exit_status)) from None
        except KeyboardInterrupt:
            errors.print("interrupted")
            raise invoke.Exit(code=int(ExitStatus.INTERRUPTED)) from None
        if status:
            raise invoke.Exit(code=int(status))

    return wrapper


def whole_number(value, *, option: str, default: int) -> int:
    """A task option that takes a whole number, from the command line's text (None: `default`).

    Such options default to None rather than to a number: Invoke casts an option whose default is an
    int itself, and a word like 'x' then ends in its traceback instead of a one-line error."""
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{option} {value!r}: give a whole number") from None
