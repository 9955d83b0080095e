"""`inv check-compat` as people and scripts use it (wheels from the shared cache, no host)."""
from __future__ import annotations

import itertools
import json
import subprocess

import pytest

from support.drift_wheels import KIMI_CONFIG, root
from support.lab import inv as run_inv


def inv(*args: str, columns: int = 200) -> subprocess.CompletedProcess:
    for version in ("0.11.0", "0.16.0", "0.17.0"):
        root("vllm", version)  # downloaded and unpacked once for the whole session
    return run_inv(*args, timeout=300, env={"COLUMNS": str(columns)})


def test_clean_pair_exits_0():
    proc = inv("check-compat", "--speculators", "0.3.0", "--vllm", "0.11.0")
    assert proc.returncode == 0, proc.stderr
    assert "0 drift findings" in proc.stdout


def test_drift_table_with_provider_source():
    proc = inv("check-compat", "--speculators", "0.3.0", "--vllm", "0.16.0", "--show-source")
    assert proc.returncode == 1
    assert "speculators/data_generation/vllm_hidden_states_generator.py" in proc.stdout
    assert "vllm/v1/core/kv_cache_utils.py:1069-1073" in proc.stdout
    assert "def get_kv_cache_config_from_groups(" in proc.stdout


#: The most findings of one run: every kind of callee, the longest names (the Kimi model class).
KIMI_ON_0_17 = ("check-compat", "--speculators", "0.3.0", "--vllm", "0.17.0", "--model-config", str(KIMI_CONFIG))


@pytest.fixture(scope="module")
def kimi_findings() -> list[dict]:
    """The findings of KIMI_ON_0_17, as --json prints them."""
    return json.loads(inv(*KIMI_ON_0_17, "--json").stdout)["findings"]


def _block_text(lines: list[str], header: str) -> str:
    """The indented lines under a finding block's header, joined into one line of words."""
    body = itertools.takewhile(lambda line: line.startswith("    "), lines[lines.index(header) + 1:])
    return " ".join(" ".join(body).split())


def test_narrow_terminal_one_block_per_finding_callee_whole(kimi_findings):
    proc = inv(*KIMI_ON_0_17, "--show-source", columns=80)
    assert proc.returncode == 1
    assert "…" not in proc.stdout and "┃" not in proc.stdout
    lines = proc.stdout.splitlines()
    for finding in kimi_findings:
        consumer = finding["consumer"]
        header = f"{consumer['file']}:{consumer['line']}  {finding['kind']}  {finding['callee']}"
        assert header in lines
        block = _block_text(lines, header)
        assert " ".join(finding["explanation"].split()) in block
        if finding["fix"]:
            assert "fix: " + finding["fix"]["summary"] in block
    assert "vllm/v1/request.py:" in proc.stdout  # --show-source: the provider's lines follow their block


def test_wide_terminal_table_callee_whole(kimi_findings):
    proc = inv(*KIMI_ON_0_17, columns=200)
    assert proc.returncode == 1
    assert "┃ line" in proc.stdout and "…" not in proc.stdout
    lines = proc.stdout.splitlines()
    for finding in kimi_findings:
        assert any(finding["callee"] in line for line in lines), finding["callee"]


def test_json_for_scripts():
    proc = inv(*KIMI_ON_0_17, "--json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert "unexpected-keyword:vllm.v1.request.Request:eos_token_id" in {f["id"] for f in data["findings"]}
    assert data["model"]["architectures"] == ["KimiK25ForConditionalGeneration"]


def test_matrix_counts_drift_per_pair():
    proc = inv("check-compat", "--speculators", "0.3.0", "--vllm", "0.11.0,0.16.0,0.17.0", "--matrix", "--json")
    assert proc.returncode == 1
    cells = json.loads(proc.stdout)["cells"]["0.3.0"]
    assert cells["0.11.0"] == 0
    assert 3 <= cells["0.16.0"] < cells["0.17.0"]


def test_bad_version_is_one_line_exit_2():
    proc = inv("check-compat", "--speculators", "0.3.0", "--vllm", "0.16 beta")
    assert proc.returncode == 2
    assert "'0.16 beta'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_missing_model_config_exit_2(tmp_path):
    proc = inv("check-compat", "--speculators", "0.3.0", "--vllm", "0.16.0", "--model-config",
               str(tmp_path / "nope.json"))
    assert proc.returncode == 2
    assert "nope.json" in proc.stderr
