"""CI's cells of the fault matrix (issue 35): the runs of tests/faults/cells.py marked `ci`, one cell of each
fault kind injected one after another into one server-mode run (its launch and model loads shared), each
cell's outcome no worse than docs/faults.md records for it. The whole matrix is benchmarks/faults.py."""
from __future__ import annotations

import os

import pytest

from faults.cells import ci_runs
from support.faults_doc import recorded
from support.faults_run import rank, run_cells
from support.lab import require_lab
from support.runnable_env import runnable_env_or_skip  # noqa: F401 (marks the module runnable)
from support.shared_envs import ensure_patched


@pytest.mark.parametrize("spec", ci_runs(), ids=lambda spec: spec.name)
def test_each_cell_ends_no_worse_than_docs_faults_md_records(lab, spec):
    require_lab(os.geteuid() == 0, "the fault cells mount tmpfs outputs and start a fleet host: run as root")
    ensure_patched({"server": "lab-server", "in-process": "lab-cpu"}[spec.path])
    outcome = run_cells(spec)
    record = recorded()
    worse = [f"{found['cell']}: {found['outcome']} (recorded {record[found['cell']]['outcome']}): "
             f"{found['symptom']}" for found in outcome["cells"]
             if rank(found["outcome"]) > rank(record[found["cell"]]["outcome"])]
    assert not worse, "\n".join(worse)
