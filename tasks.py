"""specrig's tasks for `inv` in a checkout: `inv --list`, `inv --help TASK`.

The tasks live in specrig/cli/tasks.py, so that the installed `specrig` command has the very same
ones; this file only hands their namespace to Invoke.
"""
from specrig.cli.tasks import namespace  # noqa: F401
