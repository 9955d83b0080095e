"""remote/run/model_support.py (issue 29): a model directory whose config needs custom code it lacks, or whose
quantization this vLLM cannot serve on these GPUs, is told in one line before any load. Model directories
built here (Kimi-K2.5's published config.json and Moonshot's auto_map, benchmarks/gpu/kimi_k25_config.json),
vLLM 0.26.0's own source (its released wheel, unpacked as check-compat does), the GPUs' capabilities from
the captured nvidia-smi fixtures."""
from __future__ import annotations

import json
import sys

import pytest

from base import telemetry
from run import model_support
from specrig.drift import compat
from support.paths import REPO

GPU = REPO / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

import shrunk_kimi

CAPS = REPO / "tests" / "fixtures" / "nvidia-smi" / "compute-cap"
H200X2_TP = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200x2-tp"
#: Moonshot's tokenizer_config.json names its tiktoken tokenizer's class (remote code, with tiktoken.model).
KIMI_TOKENIZER_CONFIG = {"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
                         "tokenizer_class": "TikTokenTokenizer"}


def caps(path):
    return telemetry.parse_csv(path.read_text(), telemetry.CAP_FIELDS)


@pytest.fixture(scope="module")
def vllm_026():
    """vLLM 0.26.0's package directory, from its wheel in specrig's wheel cache (check-compat's)."""
    wheel = compat.find_wheel("vllm", "0.26.0")
    if wheel is None:
        pytest.skip("no vllm 0.26.0 wheel in ~/.cache/specrig/wheels (inv check-compat fetches it)")
    return compat.unpack(wheel) / "vllm"


def model_dir(tmp_path, config, tokenizer_config=None, files=()):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    if tokenizer_config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    for name in files:
        (tmp_path / name).write_text("# Moonshot's code\n")
    return tmp_path


def test_the_published_kimi_directory_without_its_code_names_the_tokenizer_vllm_needs(tmp_path, vllm_026):
    directory = model_dir(tmp_path, shrunk_kimi.published(), KIMI_TOKENIZER_CONFIG)
    result = model_support.remote_code_check(str(directory), str(vllm_026))
    assert not result["ok"]
    # vLLM 0.26 has its own KimiK25Config and KimiK25ForConditionalGeneration: config.json's auto_map is
    # not needed; the tokenizer's is.
    assert result["detail"] == ("custom code missing from %s: tokenization_kimi.py (tokenizer_config.json "
                                "AutoTokenizer)" % directory)
    assert "hf download" in result["advice"]


def test_without_vllms_source_every_auto_map_entry_counts(tmp_path):
    directory = model_dir(tmp_path, shrunk_kimi.published(), KIMI_TOKENIZER_CONFIG)
    result = model_support.remote_code_check(str(directory))
    assert not result["ok"]
    for module in ("configuration_kimi_k25.py", "modeling_kimi_k25.py", "tokenization_kimi.py"):
        assert module in result["detail"]


def test_the_code_present_still_needs_trust_remote_code_which_the_launch_does_not_pass(tmp_path, vllm_026):
    directory = model_dir(tmp_path, shrunk_kimi.published(), KIMI_TOKENIZER_CONFIG, files=["tokenization_kimi.py"])
    result = model_support.remote_code_check(str(directory), str(vllm_026))
    assert not result["ok"]
    assert result["detail"].startswith("needs custom code run with --trust-remote-code: tokenization_kimi.py")


def test_the_stand_in_needs_no_custom_code(tmp_path, vllm_026):
    config = shrunk_kimi.shrunk_config({"bos": 1, "eos": 2, "pad": 0, "media": 6906})
    directory = model_dir(tmp_path, config, {"tokenizer_class": "PreTrainedTokenizerFast"})
    assert model_support.remote_code_check(str(directory), str(vllm_026))["ok"]


def test_vllms_own_classes_are_read_from_its_source(vllm_026):
    names = model_support.vllm_registries(str(vllm_026))
    assert "KimiK25ForConditionalGeneration" in names["architectures"]
    assert {"kimi_k25", "kimi_k2"} <= names["config_types"]


def test_compressed_tensors_int4_experts_on_h200_and_b200():
    config = shrunk_kimi.published()
    h200 = model_support.quantization_check(config, caps(H200X2_TP / "query_compute_cap.csv"))
    assert h200 == {"name": "quantization", "ok": True, "advice": None,
                    "detail": "compressed-tensors int4 pack-quantized group 32 on sm_90"}
    b200 = model_support.quantization_check(config, caps(CAPS / "b200x8_compute_cap.csv"), tp=8)
    assert b200["ok"] and b200["detail"].endswith("on sm_100")


def test_a_gpu_below_vllms_floor_is_refused_in_one_line():
    config = shrunk_kimi.published()
    pascal = [{"index": 0, "uuid": "GPU-0", "name": "Tesla P100", "compute_cap": "6.0"}]
    result = model_support.quantization_check(config, pascal)
    assert not result["ok"]
    assert result["detail"] == ("compressed-tensors int4 pack-quantized group 32 needs compute capability 7.0+ "
                                "in vLLM; the GPUs are sm_60")


def test_below_marlins_floor_the_experts_run_on_triton():
    volta = [{"index": 0, "uuid": "GPU-0", "name": "Tesla V100", "compute_cap": "7.0"}]
    result = model_support.quantization_check(shrunk_kimi.published(), volta)
    assert result["ok"] and "no Marlin kernel below sm_75" in result["detail"]


def test_an_unquantized_model_and_unknown_gpus_pass():
    assert model_support.quantization_check({"hidden_size": 8, "torch_dtype": "bfloat16"}, [])["ok"]
    assert model_support.quantization_check(shrunk_kimi.published(), [])["detail"].endswith("not checked")


def test_doctor_checks_hosts_yaml_extract_model_on_the_host(tmp_path):
    """The hook: specrig/doctor.py passes extract.model, remote/doctor/report.py answers with both checks."""
    from doctor import report as remote_doctor
    from specrig.doctor import doctor_args
    from specrig.inventory import Host

    directory = model_dir(tmp_path / "kimi", shrunk_kimi.published(), KIMI_TOKENIZER_CONFIG)
    args = doctor_args(Host(name="h", extract={"model": str(directory)}))
    assert args["model"] == str(directory)
    assert "model" not in doctor_args(Host(name="h"))
    facts = remote_doctor.run(dict(args, workdir=str(tmp_path)))
    assert [check["name"] for check in facts["model_support"]] == ["remote-code", "quantization"]
    assert not facts["model_support"][0]["ok"]  # Moonshot's code named, missing
