"""`inv --list`, `specrig --list` and a task's --help answer without paramiko or the lab: every module
that reaches a host or builds the lab is imported by the task that needs it (specrig/cli/tasks.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.paths import REPO

#: Loaded only by a task that reaches a host (paramiko, fabric) or builds the lab.
HEAVY = ("paramiko", "fabric", "specrig.lab", "specrig.transport")


def modules_loaded(*argv: str) -> list[str]:
    # This checkout's specrig ahead of any installed one (an editable install may point at another checkout).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    result = subprocess.run([sys.executable, str(REPO / "tests" / "programs" / "modules_loaded.py"), *argv],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("argv", [("inv", "--list"), ("specrig", "--list"), ("inv", "--help", "extract")])
def test_listing_the_tasks_imports_neither_paramiko_nor_the_lab(argv):
    loaded = modules_loaded(*argv)
    assert "specrig.cli.tasks" in loaded  # the namespace was loaded: the check means something
    heavy = [name for name in loaded if name.split(".")[0] in HEAVY or name.startswith(HEAVY)]
    assert heavy == [], f"`{' '.join(argv)}` imported {heavy}"
