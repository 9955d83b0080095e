"""Everything in remote/ runs on the host's own Python, 3.9 and newer: check it with a real 3.9."""
import dataclasses
import subprocess

import pytest

from specrig.inventory import load_inventory
from specrig.transport import connect
from support.lab import find_python
from support.paths import REPO

PYTHON39 = find_python("3.9")
needs39 = pytest.mark.skipif(PYTHON39 is None, reason="no Python 3.9 on this machine (set SPECRIG_TEST_PYTHON_39)")


@needs39
def test_every_remote_file_compiles_under_python39(tmp_path):
    sources = sorted(str(p) for p in (REPO / "remote").rglob("*.py"))
    # Byte-code goes to a scratch prefix: no __pycache__ litter in the tree.
    result = subprocess.run([str(PYTHON39), "-m", "py_compile", *sources], capture_output=True, text=True,
                            env={"PYTHONPYCACHEPREFIX": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr


@needs39
def test_doctor_runs_under_python39():
    host = dataclasses.replace(load_inventory().host("local"), python=str(PYTHON39))
    with connect(host) as remote:
        facts = remote.call("doctor", {})
    assert facts["python"]["version"].startswith("3.9.")
