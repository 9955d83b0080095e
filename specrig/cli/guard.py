"""What every task shares: its options as people type them, and typed errors as one line on stderr and
an exit code."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable

import invoke

from specrig.errors import SpecrigError, UsageError
from specrig.exit_status import ExitStatus
from specrig.ui import errors
from specrig.ui.terminal import markup, visible


class Task(invoke.Task):
    """Invoke's Task, whose help `TASK --help` and `TASK -h` show, as `--help TASK` does.

    Two of Invoke's defaults stood in the way. It makes a parameter without a default positional, and a
    positional takes the next word before Invoke looks for --help: `inv extract --help` named the host
    '--help'. And it gives each option the first free letter of its name as a short flag: `--host` took
    -h. So every option is given by its name (`--host H`; `guarded` refuses a required one left out), and
    none takes -h, nor a character that is no letter (`--max-num-batched-tokens` got `--`)."""

    def fill_implicit_positionals(self, positional: Iterable[str] | None) -> list[str]:
        return list(positional or ())

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[invoke.Argument]:
        arguments = super().get_arguments(ignore_unknown_help)
        for argument in arguments:
            name, *short = argument.names
            argument.names = (name, *(letter for letter in short if letter.isalpha() and letter != "h"))
        return arguments


def task(*args, **kwargs):
    """Invoke's @task (bare, or with its options), making a `Task`."""
    return invoke.task(*args, klass=Task, **kwargs)


def guarded(function):
    """Wrap a task body: a required option left out → UsageError; SpecrigError → one-line message (+ detail)
    and its ExitStatus; Ctrl-C → 130."""
    signature = inspect.signature(function)
    required = [name for name, parameter in list(signature.parameters.items())[1:]  # after Invoke's context
                if parameter.default is parameter.empty]

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            given = signature.bind_partial(*args, **kwargs).arguments
            missing = [f"--{name.replace('_', '-')}" for name in required if given.get(name) is None]
            if missing:
                raise UsageError(f"{', '.join(missing)}: required", hint="`--help` after the task lists its options")
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
