"""speculators 0.3.0 against real vLLM releases: the known drifts are found, and nothing on 0.11.0."""
from __future__ import annotations

from pathlib import Path

import pytest

from support.drift_wheels import KIMI_CONFIG, compat_report, ids, report, root

SIGNATURE_DRIFT_0_16 = {
    "missing-argument:vllm.config.scheduler.SchedulerConfig:is_encoder_decoder",
    "unexpected-keyword:vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups:kv_cache_specs",
    "missing-argument:vllm.v1.core.sched.scheduler.Scheduler:block_size",
}
REQUEST_0_17 = "unexpected-keyword:vllm.v1.request.Request:eos_token_id"
KIMI_0_16 = {
    "model-interface:vllm.model_executor.models.kimi_k25.KimiK25ForConditionalGeneration:SupportsEagle3",
    "trust-remote-code:transformers.AutoTokenizer.from_pretrained:"
    "speculators.data_generation.vllm_hidden_states_generator",
}


def test_vllm_0_16_signature_drift():
    found = ids(report("0.16.0"))
    assert SIGNATURE_DRIFT_0_16 <= found
    assert REQUEST_0_17 not in found


def test_vllm_0_17_adds_request_eos_token_id():
    assert SIGNATURE_DRIFT_0_16 | {REQUEST_0_17} <= ids(report("0.17.0"))


def test_vllm_0_11_the_pinned_release_has_no_findings_at_all():
    data = report("0.11.0")
    assert data["findings"] == []
    assert data["counts"] == {"drift": 0, "note": 0, "speed": 0}


def test_vllm_0_11_with_kimi_only_reports_the_model_and_tokenizer():
    # The Kimi class does not exist in 0.11.0: the architecture is reported unchecked, not guessed at.
    data = report("0.11.0", model_config=str(KIMI_CONFIG))
    assert ids(data) == {f for f in KIMI_0_16 if f.startswith("trust-remote-code")}
    assert any(u["callee"] == "KimiK25ForConditionalGeneration" for u in data["unchecked"])


def test_kimi_model_dir_on_vllm_0_16():
    data = report("0.16.0", model_config=str(KIMI_CONFIG))
    assert KIMI_0_16 | SIGNATURE_DRIFT_0_16 <= ids(data)
    interface = next(f for f in data["findings"] if f["kind"] == "model-interface")
    assert "set_aux_hidden_state_layers" in interface["explanation"]
    assert data["model"] == {"path": str(KIMI_CONFIG), "repo_id": None, "resolved": str(KIMI_CONFIG),
                             "architectures": ["KimiK25ForConditionalGeneration"], "custom_code": True}


@pytest.mark.parametrize("vllm", ["0.16.0", "0.17.0"])
def test_locations_are_exact_source_lines(vllm):
    data = report(vllm, model_config=str(KIMI_CONFIG))
    consumer_root = Path(root("speculators", "0.3.0")["root"])
    provider_root = Path(root("vllm", vllm)["root"])
    for finding in data["findings"]:
        consumer = finding["consumer"]
        lines = (consumer_root / consumer["file"]).read_text().splitlines()
        assert lines[consumer["line"] - 1] == consumer["text"], finding["id"]
        provider = finding["provider"]
        if provider:
            lines = (provider_root / provider["file"]).read_text().splitlines()
            assert "\n".join(lines[provider["start"] - 1:provider["end"]]) == provider["text"], finding["id"]


def test_signature_text_is_the_whole_def_header():
    finding = next(f for f in report("0.16.0")["findings"] if f["id"].startswith("unexpected-keyword"))
    assert finding["provider"]["text"].startswith("def get_kv_cache_config_from_groups(")
    assert finding["provider"]["text"].endswith(") -> KVCacheConfig:")
    assert finding["consumer"]["text"].strip() == "kv_cache_specs=kv_cache_spec,"


def test_lazy_only_reachable_modules_are_parsed():
    assert report("0.16.0")["modules_parsed"] < 100  # vLLM 0.16.0 has ~2,000 modules


def test_behaviour_rules_fire_on_0_16_with_their_fix():
    behaviour = [f for f in report("0.16.0")["findings"] if f["kind"] == "behaviour"]
    assert {f["id"] for f in behaviour} >= {"behaviour:execute-model-needs-sample-tokens",
                                            "behaviour:collective-rpc-single-reply"}
    assert all(f["fix"]["patch"].startswith("--- a/") for f in behaviour)


PYTHON39 = Path("/root/.pyenv/versions/3.9.18/bin/python")


@pytest.mark.skipif(not PYTHON39.exists(), reason="no Python 3.9 on this machine")
def test_a_python39_host_finds_the_same(tmp_path):
    """Hosts run the analyzer with their own Python, 3.9 at the oldest: same answer as 3.11."""
    import json
    import subprocess

    from support.paths import REPO

    call = tmp_path / "call.json"
    call.write_text(json.dumps({"command": "verify", "args": {
        "consumer_roots": [root("speculators", "0.3.0")], "provider_root": root("vllm", "0.17.0"),
        "model_config": str(KIMI_CONFIG)}}))
    proc = subprocess.run([str(PYTHON39), str(REPO / "remote" / "entry.py"), str(call)], capture_output=True,
                          text=True, env={"PYTHONPYCACHEPREFIX": str(tmp_path), "PATH": "/usr/bin:/bin"})
    result = json.loads(proc.stdout.split("@@SPECRIG-RESULT@@ ", 1)[1])["result"]
    assert ids(result) == ids(report("0.17.0", model_config=str(KIMI_CONFIG)))


def test_speculators_0_4_0_fits_the_vllm_it_was_written_for():
    """A second precision anchor: speculators 0.4.0 (vLLM >=0.12,<=0.16) was adapted to these very drifts."""
    data = compat_report("0.4.0", "0.16.0")
    assert data["findings"] == [] and data["calls_checked"] > 20


def test_speculators_0_4_0_on_vllm_0_11_0_shows_the_mirror_image():
    assert {"unexpected-keyword:vllm.config.scheduler.SchedulerConfig:is_encoder_decoder",
            "unexpected-keyword:vllm.v1.core.sched.scheduler.Scheduler:block_size",
            "missing-argument:vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups:kv_cache_specs",
            "missing-attribute:vllm.v1.executor.multiproc_executor.MultiprocExecutor:sample_tokens",
            } <= ids(compat_report("0.4.0", "0.11.0"))
