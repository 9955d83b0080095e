"""The failure classifier against data fixtures: driver logs and the failure each one is."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from run import classify, smoke
from support import paths

FIXTURES = paths.FIXTURES / "classify"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]


def log(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize("case", CASES, ids=[f"{c['log']}:{c['exit_status']}" for c in CASES])
def test_case(case):
    failure = classify.classify(log(case["log"]), case["exit_status"], host="gpu7")
    assert (failure["kind"], failure["rule"]) == (case["kind"], case["rule"])
    assert failure["retryable"] is case["retryable"]
    for key in ("callee", "caller", "evidence"):
        if key in case:
            assert failure[key] == case[key]
    # Every failure explains itself and says what to do, with no template field left unfilled.
    assert failure["explain"] and failure["advice"]
    assert "{" not in failure["explain"] + failure["advice"]


def test_every_rule_decides_at_least_one_case():
    """Each rule has a fixture that it, and no rule before it, classifies (test_case checks the pick)."""
    rules, _, _ = classify.load_rules()
    assert {rule.id for rule in rules} - {case["rule"] for case in CASES} == set()


def test_drift_advice_names_the_host_and_both_commands():
    failure = classify.classify(log("drift_kv_cache_specs.log"), 1, host="gpu7")
    assert "inv verify-signatures --host gpu7" in failure["advice"]
    assert "inv apply-patches --host gpu7" in failure["advice"]
    assert failure["evidence"].startswith("TypeError: get_kv_cache_config_from_groups()")


def test_a_worker_failure_is_told_by_the_workers_traceback_not_the_noise_after_the_drivers():
    """tp 2 on a one-NUMA-node CPU host: the workers' tracebacks (vLLM log prefixes on every line),
    then the driver's exception pointing at them, then resource_tracker warnings."""
    text = log("lab_cpu_tp2_numa_binding.log")
    assert text.rstrip().endswith("warnings.warn('resource_tracker: There appear to be %d '")
    failure = classify.classify(text, 1, host="lab-cpu")
    assert failure["kind"] == "bad-config" and failure["retryable"] is False
    assert "VLLM_CPU_OMP_THREADS_BIND" in failure["advice"] and "lab-cpu" in failure["advice"]
    # Even a table that does not know this failure takes the worker's exception as its evidence.
    rules, fallback, caller_from = classify.load_rules()
    without = [rule for rule in rules if rule.id != "cpu-numa-binding"]
    unknown = classify.classify(text, 1, rules=(without, fallback, caller_from))
    assert (unknown["kind"], unknown["retryable"]) == ("unknown", True)
    assert unknown["evidence"].startswith("AssertionError: Not enough allowed NUMA nodes")


def test_the_caller_of_a_worker_failure_is_the_consumer_frame_in_the_workers_traceback():
    failure = classify.classify(log("lab_cpu_worker_embed_input_ids.log"), 1)
    assert failure["rule"] == "api-drift-object-attribute"
    assert failure["caller"] == "/tmp/variant4/speculators/data_generation/custom_worker.py:30 in _patched_forward"


def test_a_chained_exception_is_classified_by_its_cause():
    root, chain = classify.root_cause(log("lab_cpu032_pydantic_torch.log"))
    assert classify.exception_line(root["text"]) == "NameError: name 'torch' is not defined"
    assert "PydanticUndefinedAnnotation" in chain["text"] and chain["start"] == root["start"]


def test_smoke_names_the_root_causes_exception_and_the_speculators_line():
    failure = smoke.name_failure(log("lab_cpu_worker_embed_input_ids.log"), 1)
    assert failure["exception"] == "AttributeError: 'LlamaModel' object has no attribute 'get_input_embeddings'"
    assert failure["where"].endswith("speculators/data_generation/custom_worker.py:30 in _patched_forward: "
                                     "else self.get_input_embeddings(input_ids)")
    assert failure["traceback"].startswith(classify.TRACEBACK) and "(Worker pid=" not in failure["traceback"]
    chained = smoke.name_failure(log("lab_cpu032_pydantic_torch.log"), 1)
    assert chained["exception"] == "pydantic.errors.PydanticUndefinedAnnotation: name 'torch' is not defined"
    assert chained["where"].endswith("speculators/utils/pydantic_utils.py:35 in reload_schema: "
                                     "cls.model_rebuild(force=True)")


def test_two_attempts_failing_the_same_way_have_one_signature():
    """Attempts 1 and 2 of the real NUMA run: other pids, times and log lines, the same failure."""
    first = classify.classify(log("lab_cpu_tp2_numa_binding.log"), 1)
    second = classify.classify(log("lab_cpu_tp2_numa_binding_attempt2.log"), 1)
    assert log("lab_cpu_tp2_numa_binding.log") != log("lab_cpu_tp2_numa_binding_attempt2.log")
    assert first["signature"] == second["signature"]
    assert first["signature"].startswith("bad-config | cpu-numa-binding | - | AssertionError: ")
    other = classify.classify(log("lab_cpu_worker_embed_input_ids.log"), 1)
    assert other["signature"] != first["signature"]


def test_rules_are_refused_without_an_id_pattern_or_signal():
    with pytest.raises(ValueError, match="exactly one of"):
        classify.Rule(id="x", kind="x", retryable=True, explain="e", advice="a")
    with pytest.raises(ValueError, match="retryable must be"):
        classify.Rule(id="x", kind="x", retryable="yes", explain="e", advice="a", log="x")
    with pytest.raises(ValueError, match="kebab-case"):
        classify.Rule(id="Disk_Full", kind="x", retryable=True, explain="e", advice="a", log="x")


def test_rule_ids_are_unique(tmp_path):
    table = json.loads(Path(classify.RULES_FILE).read_text())
    table["rules"].append(dict(table["rules"][0]))
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match="unique: reorder-hazard"):
        classify.load_rules(str(path))


def test_a_port_race_names_its_port_and_two_races_on_two_ports_are_two_failures():
    """The repeat rule (supervisor_loop.judge) stops a run that fails twice with one signature and no new
    sample: a port taken is a race when the next start's port differs, held for good when it is the same."""
    text = log("lab_cpu_tcpstore_port_taken.log")
    first = classify.classify(text, 1, host="lab-cpu")
    assert first["port"] == 51047 and "port 51047" in first["explain"] and "sport = :51047" in first["advice"]
    again = classify.classify(text.replace("05:30:43", "05:31:59"), 1, host="lab-cpu")
    elsewhere = classify.classify(text.replace("51047", "40947"), 1, host="lab-cpu")
    assert again["signature"] == first["signature"] != elsewhere["signature"]
    assert classify.classify(log("lab_server032_api_port_taken.log"), 1)["port"] is None  # vLLM's bind names none
