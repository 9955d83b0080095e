"""The committed results of issue 29's device call (benchmarks/gpu/kimi_phase.py, docs/gpu.md): the shrunk
Kimi-K2.5, its own class with INT4 experts, through specrig's tasks on the H200, and the analyzer of this tree
agreeing with what vLLM 0.26.0 did there. No GPU: the files are read; the analysis runs on vLLM 0.26.0's wheel."""
import json

import pytest

from specrig.drift import compat
from support.paths import REPO

RESULTS = sorted((REPO / "benchmarks" / "gpu" / "results").glob("kimi-h200-*.json"))
P = "server-contract:"


@pytest.fixture(scope="module", params=RESULTS, ids=[path.name for path in RESULTS])
def run(request):
    return json.loads(request.param.read_text())


def test_the_class_itself_loaded_with_its_int4_experts_and_no_remote_code(run):
    assert run["commit"]
    assert all(check["ok"] for check in run["kimi_model_checks"]["kimi"])
    quantization = next(c for c in run["kimi_model_checks"]["kimi"] if c["name"] == "quantization")
    assert "int4 pack-quantized group 32" in quantization["detail"]
    forward = run["kimi_forward"]
    assert list(forward) == ["kimi"] and forward["kimi"]["exit"] == 0  # the class, not a stand-in's fallback


def test_every_set_of_states_is_within_bf16_tolerance_and_the_shifted_control_fails(run):
    states = run["kimi_states"]
    assert {"vllm forward, extraction off, kimi", "extraction kimi-k25-skip-preflight"} <= set(states)
    for label, found in states.items():
        assert found["within_tolerance"] and found["shifted_fails"] and not found["problems"], label
        assert found["files_with_nonfinite"] == 0, label


def test_the_extraction_ran_past_the_preflight_and_vllm_did_not_refuse_mla(run):
    runs = run["kimi_extract"]["runs"]
    assert runs["kimi-k25"]["failed_checks"] == ["verify-signatures"]  # the analyzer of that commit said C16
    past = runs["kimi-k25-skip-preflight"]
    assert past["state"] == "succeeded" and past["samples"] == 64 and past["mla_refused"] is False
    choice = run["kimi_extract"]["layer_choice"]
    assert choice["published_ids"] == [2, 30, 58, 61] and choice["shrunk_ids"] == past["layer_ids"] == [2, 4, 5, 8]
    assert run["kimi_smoke"]["exit"] == 0 and run["kimi_smoke"]["json"]["ok"]


def test_the_analyzer_now_agrees_with_the_gpu_for_kimi_k25(run, tmp_path):
    """What vLLM 0.26.0 did on the H200 is what this tree's analyzer predicts for Kimi-K2.5's published config
    (the stand-in's shape): its MLA layers all alike are one KV cache group, which the connector takes."""
    drift_ids = {f["id"] for f in run["kimi_drift"]["verify-signatures"]["result"]["findings"]
                 if f["severity"] == "drift"}
    assert drift_ids == {P + "mla-refused:MLA"}  # as recorded: the prediction the run contradicted
    published = json.loads((REPO / "benchmarks" / "gpu" / "kimi_k25_config.json").read_text())["published"]
    assert published["text_config"]["kv_lora_rank"]  # MLA: the point applies, it is not skipped
    config = tmp_path / "config.json"
    config.write_text(json.dumps(published))
    wheel = compat.find_wheel("vllm", "0.26.0") or compat.fetch_wheel("vllm", "0.26.0")
    provider = {"name": "vllm", "version": "0.26.0", "root": str(compat.unpack(wheel)), "package": "vllm"}
    found = compat.analyze_roots(list(compat.consumer_roots("0.9.0")), provider, model_config=str(config))
    assert {c["id"]: c["status"] for c in found["contract"]}["mla-refused"] == "ok"
    assert not [f for f in found["findings"] if f["severity"] == "drift"]
