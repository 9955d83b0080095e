"""The committed results of issue 28's device phase (benchmarks/gpu/train_step.py, docs/gpu.md): each
benchmarks/gpu/results/train-h200-*.json says the output verified and the printed command trained, with finite
losses and a finite checkpoint. No GPU: the files are read (the first: 2026-12-03, 4 steps of the 8B shape)."""
import json
import math

import pytest

from support.paths import REPO

RESULTS = sorted((REPO / "benchmarks" / "gpu" / "results").glob("train-h200-*.json"))


@pytest.mark.parametrize("path", RESULTS or [pytest.param(None, marks=pytest.mark.skip(
    reason="no train-h200-*.json yet: the device phase `train` (docs/gpu.md) has not run"))])
def test_the_output_verified_and_its_command_trained(path):
    train = json.loads(path.read_text())["train"]
    assert train["verify"]["exit"] == 0 and train["verify"]["trainable"] and train["verify"]["bad"] == []
    assert train["training"]["argv"][:2] == ["speculators", "train"]
    assert train["training"]["argv"][:len(train["verify"]["command"])] == train["verify"]["command"]
    assert train["training"]["exit"] == 0 and train["training"]["losses"]
    assert all(math.isfinite(loss) for loss in train["training"]["losses"])
    assert train["checkpoint"]["written"] and train["checkpoint"]["finite"] and train["passed"]
