"""benchmarks/gpu/shrunk_kimi.py (issue 29): the shrunk Kimi-K2.5 keeps the published config.json's shape,
and its INT4 experts are what compressed-tensors itself reads and writes.

The build and the packing's round trip run on the lab's ~specrig/venv-cpu-0.32 (compressed-tensors 0.17.0,
the version the device's vLLM 0.26.0 wheel set pins; transformers 5), tests/programs/shrunk_kimi_check.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specrig.drift import compat
from support.lab import require_lab
from support.paths import PROGRAMS, REPO

GPU = REPO / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

import shrunk_kimi

LAB_PYTHON = Path("/home/specrig/venv-cpu-0.32/bin/python")
TOKENS = {"bos": 1, "eos": 2, "pad": 0, "media": 6906}


def test_the_shrunk_config_is_the_published_one_at_the_shrunk_sizes():
    published, shrunk = shrunk_kimi.published(), shrunk_kimi.shrunk_config(TOKENS)
    assert shrunk["architectures"] == ["KimiK25ForConditionalGeneration"] and shrunk["model_type"] == "kimi_k25"
    assert shrunk["quantization_config"] == published["quantization_config"]
    assert shrunk["text_config"]["quantization_config"] == published["quantization_config"]
    text_changed = {k for k in published["text_config"] if shrunk["text_config"].get(k) != published["text_config"][k]}
    assert text_changed == set(shrunk_kimi.TEXT_SHRUNK) | {"auto_map", "bos_token_id", "eos_token_id", "pad_token_id"}
    assert set(shrunk["text_config"]) == set(published["text_config"]) - {"auto_map"}
    # first_k_dense_replace kept: layer 0 dense, the others MoE with the real routing.
    for key in ("first_k_dense_replace", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                "n_group", "topk_group", "topk_method", "scoring_func", "num_experts_per_tok", "vocab_size"):
        assert shrunk["text_config"][key] == published["text_config"][key]
    vision = shrunk["vision_config"]
    assert set(published["vision_config"]) <= set(vision)
    assert {vllm: vision[name] for name, vllm in shrunk_kimi.VISION_VLLM_NAMES.items()} == {
        vllm: shrunk_kimi.VISION_SHRUNK[name] for name, vllm in shrunk_kimi.VISION_VLLM_NAMES.items()}
    assert "auto_map" not in shrunk and shrunk["_specrig_stand_in"] == shrunk_kimi.DIFFERENCES


def test_the_shrunk_sizes_fit_vllms_int4_moe_kernels():
    text = shrunk_kimi.shrunk_config(TOKENS)["text_config"]
    assert text["hidden_size"] % 128 == 0 and text["hidden_size"] % shrunk_kimi.GROUP_SIZE == 0
    assert text["moe_intermediate_size"] % 64 == 0
    assert text["n_routed_experts"] >= text["num_experts_per_tok"]


def test_the_provenance_names_its_sources():
    provenance = json.loads(Path(shrunk_kimi.PROVENANCE).read_text())
    assert set(provenance["source"]) == {"config", "weights", "vllm", "packing"}
    assert provenance["published"]["text_config"]["num_hidden_layers"] == 61


@pytest.mark.runnable
@pytest.mark.slow
def test_the_built_directories_round_trip_through_compressed_tensors_and_load_in_transformers(tmp_path):
    require_lab(LAB_PYTHON.exists(), "the lab's venv-cpu-0.32 is not built (inv lab.up --runnable)")
    # Run as root on the lab user's venv: nothing may be written into it (byte-code, numba's caches), or the
    # lab user's hard-linked copies of it (runnable_env.clean_venv_copy) meet files it may not link.
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    built = subprocess.run([str(LAB_PYTHON), str(GPU / "shrunk_kimi.py"), "build", str(tmp_path / "models"),
                            str(tmp_path / "chat.jsonl"), "16"], capture_output=True, text=True, timeout=600, env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = compat.find_wheel("vllm", "0.26.0")
    extra = [str(compat.unpack(wheel) / "vllm" / "transformers_utils" / "configs" / "kimi_k25.py")] if wheel else []
    checked = subprocess.run([str(LAB_PYTHON), str(PROGRAMS / "shrunk_kimi_check.py"), str(tmp_path / "models"),
                              *extra], capture_output=True, text=True, timeout=600, env=env)
    assert checked.returncode == 0, checked.stderr[-3000:]
    found = json.loads(checked.stdout.strip().splitlines()[-1])
    text = shrunk_kimi.TEXT_SHRUNK
    assert found["experts"] == 3 * text["n_routed_experts"] * (text["num_hidden_layers"] - 1)
    assert found["problems"] == []
    assert found["transformers_class"] == "DeepseekV3ForCausalLM" and found["forward_finite"]
    assert found["hidden_states"] == text["num_hidden_layers"] + 1
    if extra:  # vLLM 0.26 builds the tower from its own names: the shrunk sizes, the projector to the text width
        assert found["vllm_vision"]["hidden_size"] == shrunk_kimi.VISION_SHRUNK["vt_hidden_size"]
        assert found["vllm_vision"]["num_hidden_layers"] == shrunk_kimi.VISION_SHRUNK["vt_num_hidden_layers"]
        assert found["vllm_vision"]["mm_hidden_size"] == text["hidden_size"]
