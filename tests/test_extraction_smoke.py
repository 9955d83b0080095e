"""`inv smoke` on the runnable lab host: it names the drift before apply-patches and passes after.

Runs the real CLI against lab-cpu over SSH (real sshd, real vLLM on the CPU). Leaves the runnable
environment patched, the state the other extraction tests expect.
"""
from __future__ import annotations

import json

import pytest

from conftest import inv
from runnable_env import patch, runnable_env_or_skip


@pytest.fixture(scope="module")
def runnable(lab):
    return runnable_env_or_skip(lab)


def test_smoke_names_the_drift_then_passes_once_patched(runnable):
    patch(runnable, "revert")
    try:
        before = inv("smoke", "--host", "lab-cpu", timeout=900)
        assert before.returncode == 1, before.stdout + before.stderr
        first_line = before.stderr.strip().splitlines()[0]
        # The first drift the generator meets, named by exception and by the speculators line that raised it.
        assert "lab-cpu: smoke failed:" in first_line
        assert "SchedulerConfig is_encoder_decoder Field required" in first_line
        assert "vllm_hidden_states_generator.py:194 in _create_vllm_config" in first_line
    finally:
        applied = inv("apply-patches", "--host", "lab-cpu", timeout=900)
    assert applied.returncode == 0, applied.stdout + applied.stderr

    after = inv("smoke", "--host", "lab-cpu", "--json", timeout=900)
    assert after.returncode == 0, after.stdout + after.stderr
    result = json.loads(after.stdout)
    assert result["ok"] and result["samples"] == 6 and result["layer_ids"] == [2, 4, 5, 7]
    assert result["architectures"] == ["LlamaForCausalLM"]
    assert result["shrunk"]["num_hidden_layers"] == 8 and result["shrunk"]["hidden_size"] == 128
    assert result["versions"]["vllm"] == "0.16.0" and result["versions"]["speculators"] == "0.3.0"


def test_smoke_rejects_too_few_samples_without_touching_the_host(runnable):
    result = inv("smoke", "--host", "lab-cpu", "--samples", "2")
    assert result.returncode == 2
    assert "--samples 2" in result.stderr


def test_smoke_without_a_model_says_how_to_give_one(runnable):
    result = inv("smoke", "--host", "lab", "--model", "/nonexistent/model")
    assert result.returncode == 2
    assert "'/nonexistent/model' has no config.json on this host" in result.stderr
