"""`inv extract --dry-run` (specrig/run/sizing.py; issue 29, point 3): Kimi-K2.5's published config on three
8-GPU host descriptions (tests/fixtures/inventory/kimi-8gpu.yaml) and on the seed's host of the shipped hosts.yaml
(issue 38), the figures checked against the arithmetic written out here from the config's own numbers; a file
that is not a model's config refused in one line."""
from __future__ import annotations

import json
import re
import sys

import pytest

from specrig.errors import UsageError
from specrig.exit_status import ExitStatus
from specrig.run import sizing
from support.lab import inv, inv_json
from support.paths import FIXTURES, REPO

sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))

import shrunk_kimi

INVENTORY = FIXTURES / "inventory" / "kimi-8gpu.yaml"
#: A directory holding Kimi-K2.5's published config.json, for `--model` (tests/fixtures/models/README.md).
KIMI_CONFIG_DIR = FIXTURES / "models" / "kimi-k2.5"
GIB = 1 << 30


@pytest.fixture
def kimi(tmp_path):
    """A directory here holding Kimi-K2.5's published config.json (benchmarks/gpu/kimi_k25_config.json)."""
    (tmp_path / "config.json").write_text(json.dumps(shrunk_kimi.published()))
    return tmp_path


def test_kimi_per_gpu_at_tp_8_is_the_arithmetic_of_its_config():
    config = shrunk_kimi.published()
    weights = sizing.weights_per_gpu(config, 8)
    # 60 MoE layers x 384 experts x 3 projections of 2048 x 7168, half a byte each and a bf16 scale per 32.
    assert weights["routed_experts"] == int(60 * 384 * 3 * 2048 * 7168 * (0.5 + 2 / 32) / 8)
    # q_a (1536 x 7168) and kv_a (576 x 7168) whole, q_b (64*192 x 1536), kv_b (64*256 x 512), o (7168 x 64*128)
    # split 8 ways, 61 layers, bf16, and the norms.
    whole = 1536 * 7168 + 576 * 7168 + 1536 + 512 + 2 * 7168
    split = 64 * 192 * 1536 + 64 * 256 * 512 + 7168 * 64 * 128
    assert weights["attention"] == int((whole + split / 8) * 61 * 2)
    assert weights["embeddings"] == int(2 * 163840 * 7168 * 2 / 8 + 7168 * 2)
    assert 71 * GIB < weights["total"] < 73 * GIB
    # MLA: 512 + 64 latent values a layer, 61 layers, bf16, on every GPU of the group.
    assert sizing.kv_bytes_per_token(config) == (512 + 64) * 61 * 2 == 70272


@pytest.mark.parametrize("memory_mib, kv_tokens", [(143771, 711016), (183359, 1242663), (97887, 94816)])
def test_the_kv_cache_is_what_the_weights_and_the_reserve_leave(memory_mib, kv_tokens):
    found = sizing.plan(shrunk_kimi.published(), gpus=8, gpu_memory_mib=memory_mib)
    # Beside weights and KV: a step's logits, 8192 batched tokens x 163840 vocabulary x fp32 (5.0 GiB, the H200's
    # measured peak for the shrunk class), and 3 GiB for the rest.
    reserve = 8192 * 163840 * 4 + 3 * GIB
    assert found["runtime_reserve_bytes"] == reserve == 8 * GIB
    left = int(memory_mib * (1 << 20) * 0.9) - found["weights_per_gpu"]["total"] - reserve
    assert found["kv_tokens"] == left // 70272 == kv_tokens
    # Four layers of 7168 values in bf16 for each of 2048 tokens; two files a request in staging.
    assert found["staging_bytes_per_request"] == 2048 * 4 * 7168 * 2
    assert found["settings"] == {"max_model_len": 2049, "max_num_batched_tokens": 8192, "concurrency": 32,
                                 "staging_bytes": 32 * 2 * 2048 * 4 * 7168 * 2}


def test_long_prompts_are_bounded_by_the_kv_cache():
    found = sizing.plan(shrunk_kimi.published(), gpus=8, gpu_memory_mib=143771, max_len=8192, concurrency=256)
    assert found["settings"]["concurrency"] == 711016 // 8193 == 86
    assert found["concurrency_bound"] == "kv cache"
    assert found["settings"]["max_num_batched_tokens"] == 8193


def test_longer_prompts_batch_more_tokens_and_their_logits_take_more_memory():
    found = sizing.plan(shrunk_kimi.published(), gpus=8, gpu_memory_mib=143771, max_len=32768)
    assert found["settings"]["max_num_batched_tokens"] == 32769
    assert found["runtime_reserve_bytes"] == 32769 * 163840 * 4 + 3 * GIB
    assert found["kv_tokens"] == (int(143771 * (1 << 20) * 0.9) - found["weights_per_gpu"]["total"]
                                  - found["runtime_reserve_bytes"]) // 70272


def test_too_few_gpus_for_the_weights_is_one_line():
    with pytest.raises(UsageError, match=r"--tp 1: .* GiB of weights per GPU leave 0.0 GiB for the KV cache"):
        sizing.plan(shrunk_kimi.published(), gpus=1, gpu_memory_mib=143771)


@pytest.mark.parametrize("host, kv_tokens", [("blackwell01", 94816), ("b200x8", 1242663), ("h200x8", 711016)])
def test_inv_extract_dry_run_on_an_8_gpu_description(kimi, host, kv_tokens):
    status, found = inv_json("extract", "--host", host, "--model", str(kimi), "--dry-run", inventory=INVENTORY)
    assert status == 0
    assert found["tp"] == 8 and found["kv_tokens"] == kv_tokens
    assert found["settings"]["concurrency"] == 32 and found["settings"]["max_model_len"] == 2049
    shown = inv("extract", "--host", host, "--model", str(kimi), "--dry-run", inventory=INVENTORY,
                env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    assert "--max-model-len 2049, --max-num-batched-tokens 8192, --concurrency 32" in " ".join(shown.stdout.split())


def test_a_dry_run_without_a_local_config_or_a_host_description_is_refused(kimi, tmp_path):
    result = inv("extract", "--host", "h200x8", "--model", str(tmp_path / "none"), "--dry-run", inventory=INVENTORY)
    assert result.returncode == 2 and "--dry-run reads the model's config.json on this machine" in result.stderr


def test_the_model_fixture_is_the_published_config_the_shrunk_kimi_is_built_from():
    assert json.loads((KIMI_CONFIG_DIR / "config.json").read_text()) == shrunk_kimi.published()


def test_the_seed_host_of_hosts_yaml_fits_kimi_narrowly():
    """docs/gpu.md's plan for blackwell01 (8x RTX PRO 6000, 97887 MiB, extract.max_len 4096): the command there."""
    status, found = inv_json("extract", "--host", "blackwell01", "--model", str(KIMI_CONFIG_DIR), "--dry-run",
                             inventory=REPO / "hosts.yaml")
    assert status == 0
    assert round(found["weights_per_gpu"]["total"] / GIB, 2) == 71.83
    assert round(found["kv_budget_bytes"] / GIB, 2) == 6.21 and found["kv_tokens"] == 94816
    assert found["settings"]["max_model_len"] == 4097 and found["settings"]["max_num_batched_tokens"] == 8192
    assert found["settings"]["concurrency"] == 94816 // 4097 == 23 and found["concurrency_bound"] == "kv cache"


def _published_with(part: str | None, name: str, value=None) -> dict:
    """Kimi-K2.5's published config with `name` of `part` (text_config, vision_config; None: the top) set to
    `value`, or left out where `value` is None."""
    config = shrunk_kimi.published()
    holder = config[part] if part else config
    if value is None:
        del holder[name]
    else:
        holder[name] = value
    return config


NOT_A_MODEL_CONFIG = [
    ("generation_config.json", {"bos_token_id": 163584, "eos_token_id": 163585},
     r"not a model's config.json: no hidden_size, num_hidden_layers, num_attention_heads and 9 more"),
    ("a JSON list", [1, 2], r"not a model's config.json: a JSON list, not an object"),
    ("a dense Llama", {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                       "vocab_size": 128256, "intermediate_size": 14336},
     r"sizes MLA mixture-of-experts models .* no q_lora_rank, kv_lora_rank, .*, moe_intermediate_size$"),
    ("a text_config without its hidden size", _published_with("text_config", "hidden_size"),
     r"not a model's config.json: no text_config.hidden_size$"),
    ("a hidden size as text", _published_with("text_config", "hidden_size", "7168"),
     r"text_config.hidden_size is '7168', not a positive integer"),
    ("a layer count of true", _published_with("text_config", "num_hidden_layers", True),
     r"text_config.num_hidden_layers is True, not a positive integer"),
    ("a vision tower under other names", _published_with("vision_config", "vt_hidden_size"),
     r"vision_config has no vt_hidden_size"),
    ("a merge kernel of one size", _published_with("vision_config", "merge_kernel_size", [2]),
     r"vision_config.merge_kernel_size is \[2\], not two sizes such as \[2, 2\]"),
    ("a merge kernel of a size 0", _published_with("vision_config", "merge_kernel_size", [2, 0]),
     r"vision_config.merge_kernel_size\[1\] is 0, not a positive integer"),
    ("a vision_config that is a list", _published_with(None, "vision_config", [1]), r"vision_config is \[1\], not an object"),
]


@pytest.mark.parametrize("content, message", [case[1:] for case in NOT_A_MODEL_CONFIG],
                         ids=[case[0] for case in NOT_A_MODEL_CONFIG])
def test_a_file_that_is_not_a_model_config_is_named_with_what_it_lacks(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(content))
    with pytest.raises(UsageError) as refused:
        sizing.read_config(path)
    assert refused.value.message.startswith(f"{path}: ") and refused.value.hint
    assert refused.value.exit_status == ExitStatus.USAGE
    assert re.search(message, refused.value.message), refused.value.message


def test_a_file_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe not json")
    with pytest.raises(UsageError, match=r"config.json: not JSON"):
        sizing.read_config(path)


def test_the_published_config_passes_the_check():
    path = KIMI_CONFIG_DIR / "config.json"
    assert sizing.read_config(path) == shrunk_kimi.published()


def test_inv_extract_dry_run_of_a_wrong_file_is_one_line_and_exit_2(tmp_path):
    """Issue 38: the wrong JSON as the model's config printed `KeyError: 'hidden_size'`, a traceback."""
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 163584, "eos_token_id": 163585}))
    result = inv("extract", "--host", "blackwell01", "--model", str(tmp_path), "--dry-run", inventory=INVENTORY,
                 env={"COLUMNS": "400"})
    assert result.returncode == ExitStatus.USAGE
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr and not result.stdout
    assert f"{tmp_path / 'config.json'}: not a model's config.json: no hidden_size" in result.stderr


def test_the_dry_run_takes_hosts_yamls_share_of_gpu_memory_as_the_run_does(make_inventory):
    """The lever for a narrow fit: extract.gpu_memory_utilization, which the run passes to vLLM."""
    inventory = make_inventory({"hosts": {"blackwell01": {"gpus": 8, "gpu_memory_mib": 97887, "extract": {
        "model": str(KIMI_CONFIG_DIR), "max_len": 4096, "gpu_memory_utilization": 0.95}}}})
    status, found = inv_json("extract", "--host", "blackwell01", "--dry-run", inventory=inventory)
    assert status == 0 and found["gpu_memory_utilization"] == 0.95
    weights = found["weights_per_gpu"]["total"]
    assert found["kv_tokens"] == (int(97887 * (1 << 20) * 0.95) - weights - 8 * GIB) // 70272 == 167848
    assert found["settings"]["concurrency"] == 32
