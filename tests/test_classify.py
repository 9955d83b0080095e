"""The failure classifier against data fixtures: driver logs and the failure each one is."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from run import classify

FIXTURES = Path(__file__).parent / "fixtures" / "classify"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['log']}:{c['exit_status']}" for c in CASES])
def test_case(case):
    failure = classify.classify((FIXTURES / case["log"]).read_text(), case["exit_status"], host="gpu7")
    assert failure["kind"] == case["kind"]
    assert failure["retryable"] is case["retryable"]
    if "callee" in case:
        assert failure["callee"] == case["callee"]
    if "caller" in case:
        assert failure["caller"] == case["caller"]
    # Every failure explains itself and says what to do, with no template field left unfilled.
    assert failure["explain"] and failure["advice"]
    assert "{" not in failure["explain"] + failure["advice"]


def test_drift_advice_names_the_host_and_both_commands():
    failure = classify.classify((FIXTURES / "drift_kv_cache_specs.log").read_text(), 1, host="gpu7")
    assert "inv verify-signatures --host gpu7" in failure["advice"]
    assert "inv apply-patches --host gpu7" in failure["advice"]
    assert failure["evidence"].startswith("TypeError: get_kv_cache_config_from_groups()")


def test_every_rule_is_exercised_by_a_fixture():
    rules, _, _ = classify.load_rules()
    seen = {c["kind"] for c in CASES}
    assert {rule.kind for rule in rules} <= seen


def test_a_rule_with_neither_pattern_nor_signal_is_refused():
    with pytest.raises(ValueError, match="exactly one of"):
        classify.Rule(kind="x", retryable=True, explain="e", advice="a")
    with pytest.raises(ValueError, match="retryable must be"):
        classify.Rule(kind="x", retryable="yes", explain="e", advice="a", log="x")
