"""What every task shares: typed errors become one line on stderr and an exit code."""
from __future__ import annotations

import functools

import invoke
from rich.markup import escape

from specrig.errors import SpecrigError
from specrig.exit_status import ExitStatus
from specrig.ui import errors


def guarded(function):
    """Wrap a task body: SpecrigError → one-line message (+ detail) and its ExitStatus; Ctrl-C → 130."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            status = function(*args, **kwargs)
        except SpecrigError as exc:
            # Escaped: `[host]:port` in a message is text, not rich markup.
            errors.print(f"[bold red]error:[/] {escape(exc.one_line())}", markup=True, soft_wrap=True)
            if exc.detail:
                errors.print(exc.detail.rstrip(), markup=False, soft_wrap=True)
            raise invoke.Exit(code=int(exc.exit_status)) from None
        except KeyboardInterrupt:
            errors.print("interrupted")
            raise invoke.Exit(code=int(ExitStatus.INTERRUPTED)) from None
        if status:
            raise invoke.Exit(code=int(status))

    return wrapper
