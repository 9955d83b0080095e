"""The collective probe (remote/gpus/collective.py, issue 38 points 3 and 5): a real torch.distributed all-reduce
over gloo between two processes of the lab's speculators 0.9 venv (its torch), healthy and with one rank stopped
(SIGSTOP). No timing is asserted: a hang is whatever outlives the probe's timeout."""
from __future__ import annotations

import os
import sys

import pytest

from base.contract import COLLECTIVE_HANG
from gpus import collective
from run import gpu_preflight
from support.lab import require_lab
from support.runnable_env import HOME

TORCH_PYTHON = HOME / "venv-spec-0.9" / "bin" / "python"


@pytest.fixture
def torch_python(lab) -> str:
    require_lab(TORCH_PYTHON.exists(), f"{TORCH_PYTHON} not built: run `inv lab.up --runnable` as root")
    return str(TORCH_PYTHON)


def gone(found: dict) -> None:
    """No rank outlives the probe."""
    for line in os.popen("ps -eo args").read().splitlines():
        assert collective.RANK_PROGRAM not in line


def test_a_healthy_all_reduce_passes(torch_python):
    found = collective.probe(torch_python, 2, "gloo", timeout_s=20)
    assert found["outcome"] == "ok", found
    assert all(rank["stages"][-1] == "done" for rank in found["ranks"]) and found["torch"]
    gone(found)


def test_a_stopped_rank_is_a_collective_hang_within_the_timeout(torch_python):
    found = collective.probe(torch_python, 2, "gloo", timeout_s=5, stop_rank=1)
    assert found["outcome"] == COLLECTIVE_HANG == "collective-hang", found
    assert "rank 1: joined, then stopped (state T" in found["detail"]
    assert "rank 0: joined, waiting in the all-reduce" in found["detail"]
    gone(found)


def test_the_preflight_check_on_the_cpu(torch_python):
    assert gpu_preflight.collective_check(2, False, torch_python, False)["ok"]
    one = gpu_preflight.collective_check(1, False, torch_python, False)
    assert one["ok"] and "no collective to probe" in one["detail"]


def test_a_python_without_torch_is_not_started():
    # This very interpreter (the suite's) has no torch where the probe would need it.
    if any(os.path.isdir(os.path.join(path, "torch")) for path in sys.path if path):
        pytest.skip("this Python has torch")
    found = collective.probe(sys.executable, 2, "gloo", timeout_s=5, start_timeout_s=30)
    assert found["outcome"] == collective.NOT_STARTED and "torch" in found["detail"], found
    check = gpu_preflight.collective_check(2, False, sys.executable, False)
    assert not check["ok"] and check["kind"] == collective.NOT_STARTED
