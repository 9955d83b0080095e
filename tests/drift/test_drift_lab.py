"""`inv verify-signatures` against the real lab host (speculators 0.3.0 + vLLM 0.16.0 over SSH)."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from specrig.drift.verify import verify_host
from specrig.transport import connect
from support.drift_wheels import KIMI_CONFIG
from support.lab import inv

KNOWN_0_16 = {
    "missing-argument:vllm.config.scheduler.SchedulerConfig:is_encoder_decoder",
    "unexpected-keyword:vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups:kv_cache_specs",
    "missing-argument:vllm.v1.core.sched.scheduler.Scheduler:block_size",
}


def test_verify_host_over_one_connection(lab):
    with connect(lab.host("lab")) as remote:
        verify_host(remote)  # uploads the bundle if this checkout's remote/ changed
    with connect(lab.host("lab")) as remote:
        report = verify_host(remote)
        exec_channels = remote.exec_count
    assert report.data["provider"]["version"] == "0.16.0"
    assert report.data["provider"]["root"].startswith("/home/specrig/")
    # Other tests may have patched the lab (apply-patches): whatever is left is known drift, nothing else.
    behaviour = {f["id"] for f in report.findings if f["kind"] == "behaviour"}
    assert report.ids - behaviour <= KNOWN_0_16
    assert exec_channels == 1, "the analysis is one remote call; only its JSON comes back"


def test_task_json_and_exit_codes(lab):
    proc = inv("verify-signatures", "--host", "lab", "--json")
    data = json.loads(proc.stdout)
    assert proc.returncode == (1 if data["counts"]["drift"] else 0)
    assert all(set(f) >= {"id", "kind", "consumer", "callee", "provider", "explanation"} for f in data["findings"])


def test_task_rejects_a_model_dir_without_config(lab):
    proc = inv("verify-signatures", "--host", "lab", "--model", "/nonexistent/model")
    assert proc.returncode == 2
    assert "'/nonexistent/model'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_kimi_model_directory_on_the_lab(lab):
    # The lab host is this machine: a world-readable directory is a model directory on the host.
    model = Path(tempfile.mkdtemp(prefix="specrig-kimi-", dir="/tmp"))
    try:
        shutil.copy(KIMI_CONFIG, model / "config.json")
        (model / "tokenizer_config.json").write_text(json.dumps(
            {"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}))
        for path in (model, model / "config.json", model / "tokenizer_config.json"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        with connect(lab.host("lab")) as remote:
            report = verify_host(remote, model=str(model))
    finally:
        shutil.rmtree(model)
    assert {"model-interface:vllm.model_executor.models.kimi_k25.KimiK25ForConditionalGeneration:SupportsEagle3",
            "trust-remote-code:transformers.AutoTokenizer.from_pretrained:"
            "speculators.data_generation.vllm_hidden_states_generator"} <= report.ids
    trust = next(f for f in report.findings if f["kind"] == "trust-remote-code")
    assert "config.json and tokenizer_config.json" in trust["explanation"]
