"""A task's help as people ask for it: `TASK --help` and `TASK -h`, on `inv` and on `specrig`, show the
task's docstring and options with exit 0 (specrig/cli/guard.py: Task), as `--help TASK` does."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from invoke.main import program as inv_program

from specrig.cli.program import program as specrig_program
from specrig.cli.tasks import namespace
from specrig.exit_status import ExitStatus
from support.lab import inv
from support.paths import REPO

TASKS = sorted(namespace.task_names)
#: Each command as its console script starts it: the argv, and the name its usage line gives.
COMMANDS = {"inv": (inv_program, ["inv", "-r", str(REPO)], "inv[oke]"),
            "specrig": (specrig_program, ["specrig"], "specrig")}


def assert_task_help(text: str, *, command: str, task: str) -> None:
    """`text` is the help of `task`: its usage line, its docstring's first line and every option."""
    assert text.startswith(f"Usage: {COMMANDS[command][2]} [--core-opts] {task} "), text
    assert namespace[task].__doc__.splitlines()[0] in text, text
    for argument in namespace[task].get_arguments():
        name = argument.names[0]
        # A flag on by default is shown with its negation (`--[no-]prepared-cache`).
        shown = "--[no-]" + name if argument.kind is bool and argument.default is True else \
            ("-" if len(name) == 1 else "--") + name
        assert shown in text, (shown, text)


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("task", TASKS)
def test_every_task_shows_its_help_after_its_name(capsys, task, command, flag):
    program, argv, _ = COMMANDS[command]
    with pytest.raises(SystemExit) as ended:
        program.run([*argv, task, flag])
    shown = capsys.readouterr()
    assert ended.value.code == ExitStatus.OK, shown.err
    assert_task_help(shown.out, command=command, task=task)


def test_both_commands_as_typed():
    """The console scripts' own processes: `inv extract --help` and `specrig extract -h`."""
    typed = inv("extract", "--help")
    assert typed.returncode == ExitStatus.OK, typed.stderr
    assert_task_help(typed.stdout, command="inv", task="extract")
    assert "host name from hosts.yaml" in typed.stdout  # the options' help too
    # This checkout's specrig ahead of any installed one (an editable install may point at another checkout).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    typed = subprocess.run([sys.executable, "-m", "specrig", "extract", "-h"], capture_output=True, text=True,
                           env=env, cwd=REPO, timeout=60)
    assert typed.returncode == ExitStatus.OK, typed.stderr
    assert_task_help(typed.stdout, command="specrig", task="extract")


def test_a_required_option_left_out_is_one_line_and_exit_2():
    """Every option is given by its name, so Invoke no longer asks for a positional: specrig names it."""
    result = inv("gather")
    assert result.returncode == ExitStatus.USAGE, result.stderr
    assert result.stderr.strip() == "error: --host, --run: required (`--help` after the task lists its options)"
