"""The committed results of the GPU runs (issues 19 and 26, docs/gpu.md): complete and consistent.

benchmarks/gpu/results/h200-*.json is written by benchmarks/gpu/summarize.py from what the device
brought back. These checks read it only (no GPU): every field there, the states within the stated
tolerance and the shifted pairing failing, the kill -9 classified and resumed to a complete set, stop
clean with GPU memory back at idle, the table's numbers consistent with each other, and what was not
run said with a reason. The nvidia-smi captures of the same run parse with specrig's own parser.
"""
import json
import math

import pytest

from base import telemetry
from base.contract import SUCCEEDED
from support.paths import FIXTURES, REPO

#: Issue 36's files (<gpu>-<date>-issue36.json) are another shape: tests/run/test_train_accept_results.py reads them.
RESULTS = sorted(path for path in (REPO / "benchmarks" / "gpu" / "results").glob("h200-*.json")
                 if not path.name.endswith("-issue36.json"))
#: The latest run, by name, that compared the states: what they must hold for; earlier runs stay as they
#: were measured, and a run that measured other things says in its not_run that it skipped the states.
LATEST = next((path for path in reversed(RESULTS) if json.loads(path.read_text())["states"]["ran"]), None)
CAPTURES = FIXTURES / "nvidia-smi" / "h200-vllm"
TOP_LEVEL = ("issue", "date", "commit", "device", "device_minutes_used", "model", "doctor", "preflight",
             "extract", "states", "kill9", "stop", "table", "ratios", "smoke_deepseek_v3", "not_run")


def load(path):
    return json.loads(path.read_text())


def not_run_names(result):
    return " ".join(entry["what"] for entry in result["not_run"])


@pytest.fixture(params=RESULTS, ids=[p.name for p in RESULTS])
def result(request):
    return load(request.param)


def test_there_is_a_results_file():
    assert RESULTS, "benchmarks/gpu/results/h200-*.json is missing"


def test_every_field_is_there(result):
    missing = [key for key in TOP_LEVEL if key not in result]
    assert not missing, missing
    assert result["issue"] in (19, 26)
    assert len(result["commit"]) == 40 and int(result["commit"], 16) >= 0
    assert 0 < result["device_minutes_used"] <= 30
    assert "H200" in result["device"]["gpu"]
    for entry in result["not_run"]:
        assert entry["what"] and entry["why"], entry


def tolerances(states) -> dict:
    """The relative L2 allowed per layer id: a fixed figure (the first run) or one per layer, set from
    transformers' own bf16 error against its fp32 forward (later runs)."""
    tolerance = states["tolerance"]
    if "rel_l2_per_layer" in tolerance:
        return tolerance["rel_l2_per_layer"]
    return {layer: tolerance["rel_l2_per_sample_per_layer"] for layer in states["per_layer"]}


def test_the_states_record_is_consistent_and_the_shifted_pairing_fails(result):
    states = result["states"]
    if not states["ran"]:
        assert "states" in not_run_names(result)
        return
    allowed = tolerances(states)
    assert set(allowed) == set(states["per_layer"])
    assert all(0 < tolerance <= 0.2 for tolerance in allowed.values()), allowed
    if states.get("subset"):
        # issue 26 on: a subset of a measured arm's files, spread over them, at least the calibration's 32
        assert states["files"] == states["subset"]["files"] >= 32 and states["subset"]["of"] >= states["files"]
        assert states["arm"] in {row["arm"] for row in result["table"]}
    else:
        assert states["files"] >= 256
    assert states["tokens"] > 0
    assert states["dtype"] == "torch.bfloat16"
    assert [int(k) for k in states["per_layer"]] == states["layer_ids"] == sorted(states["layer_ids"])
    assert states["layer_ids"][-1] == states["num_hidden_layers"]
    for entry in states["per_layer"].values():
        assert entry["rel_l2"] <= entry["worst_sample_rel_l2"] + 1e-12
        assert entry["max_abs_diff"] <= entry["max_abs_ref"]
    # the verdict is what the numbers say against the tolerance stated beside them
    calibration = states.get("calibration_fp32")
    assert states["within_tolerance"] is all(
        e["worst_sample_rel_l2"] <= allowed[layer] and (not calibration or calibration["vllm"][layer] <= allowed[layer])
        for layer, e in states["per_layer"].items())
    assert states["max_abs_diff"] == max(e["max_abs_diff"] for e in states["per_layer"].values())
    assert states["worst_rel_l2"] == max(e["worst_sample_rel_l2"] for e in states["per_layer"].values())
    assert not states["problems"] and states["files_with_nonfinite"] == 0
    # the stored layer is the documented one: the shifted pairing is far off at every layer
    shifted = states["shifted_control"]
    assert shifted["fails"] is True
    floor = states["tolerance"]["shifted_must_exceed"]
    for layer, entry in shifted["per_layer"].items():
        assert entry["rel_l2"] > max(floor, allowed[layer]), (layer, entry)
        assert entry["rel_l2"] > 3 * states["per_layer"][layer]["rel_l2"], (layer, entry)
    if not states["within_tolerance"]:
        assert "tolerance" in not_run_names(result)  # said, with why, not hidden


def test_the_tolerance_is_what_bf16_costs_transformers_itself(result):
    """Later runs set the tolerance before the run from a rule, not a figure: per layer, BF16_MARGIN times
    transformers' own bf16 error against its fp32 forward on the calibration samples."""
    states = result["states"]
    if not states["ran"] or "rel_l2_per_layer" not in states["tolerance"]:
        return
    tolerance, calibration = states["tolerance"], states["calibration_fp32"]
    assert tolerance["bf16_margin"] == 2.0 and tolerance["calibration_samples"] >= 16
    for layer, allowed in tolerance["rel_l2_per_layer"].items():
        assert math.isclose(allowed, tolerance["bf16_margin"] * calibration["transformers_bf16"][layer])


def test_the_latest_runs_states_are_within_the_tolerance_set_before_it():
    """The first run (2026-12-01-run1) missed its fixed 2 %, which bf16 itself exceeds on 8B-wide random
    weights; it stays as measured and says so in its not_run. The latest run must hold."""
    assert LATEST, "no run compared the states"
    states = load(LATEST)["states"]
    assert states["ran"] and states["within_tolerance"] is True and states["shifted_control"]["fails"] is True


def test_the_kill_was_classified_restarted_and_resumed_complete(result):
    kill = result["kill9"]
    if not kill["ran"]:
        assert "kill" in not_run_names(result)
        return
    assert kill["killed"]["engine_core_pids"]
    first = kill["attempts"][0]
    assert first["failure"] and first["failure"]["kind"] == kill["classified"]
    assert kill["restarted"] is True and len(kill["attempts"]) >= 2
    assert kill["memory_idle_before_restart"] is True
    assert 0 < kill["memory_back_to_idle_s_after_kill"] <= kill["restart_s_after_kill"]
    assert kill["files_before_kill_kept"] == kill["files_before_kill"]
    assert kill["final_state"] == SUCCEEDED
    assert kill["final_files"] == kill["samples_requested"] >= 256
    assert kill["complete"] is True


def test_stop_was_clean_with_the_memory_back_at_idle(result):
    stop = result["stop"]
    if not stop["ran"]:
        assert "stop" in not_run_names(result)
        return
    assert stop["clean"] is True and stop["left"] == []
    assert stop["seconds"] > 0
    assert stop["memory_used_before_mib"] > stop["idle_memory_used_mib"] + 1024
    assert stop["memory_used_right_after_mib"] <= stop["idle_memory_used_mib"] + 1024
    assert not stop["engine_cores_left"]


def test_the_table_is_consistent(result):
    rows = result["table"]
    if not rows:
        assert "measurement" in not_run_names(result)
        return
    for row in rows:
        if row.get("error") or not row.get("tokens"):
            continue
        assert row["samples"] > 0 and row["wall_s"] > 0
        assert math.isclose(row["tokens_per_s"], row["tokens"] / row["wall_s"], rel_tol=0.01)
        assert math.isclose(row["samples_per_s"], row["samples"] / row["wall_s"], rel_tol=0.01)
        if row.get("after_load_s"):
            assert math.isclose(row["after_load_s"], row["wall_s"] - row["server_ready_s"], abs_tol=0.02)
            assert math.isclose(row["tokens_per_s_after_load"], row["tokens"] / row["after_load_s"], rel_tol=0.01)
        if row.get("first_sample_s") is not None:
            assert 0 < row["first_sample_s"] <= row["wall_s"]
        # issue 26 on: the server's health to the first and the last file, and the rate between the health and
        # the last file ("after the load"); the steady part from the first file to the last
        if row.get("health_to_last_file_s") is not None:
            assert math.isclose(row["health_to_last_file_s"], row["last_sample_s"] - row["server_ready_s"], abs_tol=0.02)
            assert math.isclose(row["health_to_first_file_s"], row["first_sample_s"] - row["server_ready_s"],
                                abs_tol=0.02)
            assert 0 < row["health_to_first_file_s"] <= row["health_to_last_file_s"]
            assert row["last_sample_s"] <= row["wall_s"]
            assert math.isclose(row["tokens_per_s_to_last_file"], row["tokens"] / row["health_to_last_file_s"],
                                rel_tol=0.01)
        if row.get("steady_from") == "first to last file":
            assert math.isclose(row["steady_s"], row["last_sample_s"] - row["first_sample_s"], abs_tol=0.02)
            assert math.isclose(row["steady_tokens_per_s"], row["tokens"] / row["steady_s"], rel_tol=0.01)


def test_two_arms_never_share_a_name_and_each_says_what_it_ran(result):
    """Issue 26 on: an arm's record carries its way, concurrency, the settings that differ from specrig's
    defaults and the state of speculators' client it ran, and its name says the same."""
    rows = result["table"]
    assert len({row["arm"] for row in rows}) == len(rows)
    for row in rows:
        if row.get("settings_nondefault") is None:
            continue  # runs 1-4
        assert row["arm"].startswith("%s-c%s" % (row["way_id"], row["concurrency"])), row["arm"]
        for key in row["settings_nondefault"]:
            assert "-%s=" % key in row["arm"], (row["arm"], key)
        if row["way_id"] == "bare":
            assert row["client_patch"] is None
        else:
            assert row["client_patch"] in ("patched", "unpatched", "unknown")
            assert "-%s" % row["client_patch"] in row["arm"]
        if row["way_id"] == "hand" and not row.get("error"):
            assert row["client_patch"] == "unpatched"  # speculators as shipped


def test_the_goals_say_what_their_numbers_say(result):
    """Issue 26's goals: each ratio is the two arms' figures divided, PASS exactly where it reaches its goal;
    the two arms of each goal sent the same prompts, and bare prefill's server ran the extraction server's prefix
    caching, as their logs say."""
    if "goals" not in result:
        return  # runs 1-4
    rows = {row["arm"]: row for row in result["table"]}
    figures = {"specrig_steady_vs_bare": "steady_tokens_per_s", "specrig_steady_vs_hand": "steady_tokens_per_s",
               "specrig_after_load_vs_bare": "tokens_per_s_to_last_file"}
    goals = {"specrig_steady_vs_bare": 0.90, "specrig_steady_vs_hand": 1.25, "specrig_after_load_vs_bare": 0.80}
    assert set(result["goals"]) == set(goals)
    for name, entry in result["goals"].items():
        assert entry["goal"] == goals[name]
        if entry["value"] is None:
            assert entry["verdict"] == "NOT MEASURED"
            continue
        ours, theirs = (rows[arm] for arm in entry["arms"])
        assert ours["way_id"] == "specrig" and ours["client_patch"] == "patched" and not ours["settings_nondefault"]
        assert theirs["way_id"] == ("hand" if name.endswith("hand") else "bare")
        assert math.isclose(entry["value"], ours[figures[name]] / theirs[figures[name]], rel_tol=1e-3)
        assert entry["verdict"] == ("PASS" if entry["value"] >= entry["goal"] else "MISS")
        # Compared like for like: the two arms sent the same prompts (a run may hold other prompt sets too).
        assert ours["prompts"]["sha256"] == theirs["prompts"]["sha256"], entry["arms"]
        assert result["checks"]["prefix_caching_same"] is True, result["checks"]["prefix_caching_logged"]


def test_the_captures_parse_with_specrigs_parser():
    for state in ("idle", "load", "after_stop"):
        text = (CAPTURES / f"query_gpu_{state}.csv").read_text()
        rows = telemetry.parse_csv(text, telemetry.GPU_FIELDS)
        assert len(rows) == 1 and rows[0]["name"] == "NVIDIA H200", rows
        assert rows[0]["memory_total_mib"] > 140000
    idle = telemetry.parse_csv((CAPTURES / "query_gpu_idle.csv").read_text(), telemetry.GPU_FIELDS)[0]
    load = telemetry.parse_csv((CAPTURES / "query_gpu_load.csv").read_text(), telemetry.GPU_FIELDS)[0]
    after = telemetry.parse_csv((CAPTURES / "query_gpu_after_stop.csv").read_text(), telemetry.GPU_FIELDS)[0]
    assert load["memory_used_mib"] > idle["memory_used_mib"] + 10000  # vLLM takes most of the card
    assert after["memory_used_mib"] <= idle["memory_used_mib"] + 1024
    apps = telemetry.parse_csv((CAPTURES / "query_apps_load.csv").read_text(), telemetry.APP_FIELDS)
    assert apps and all(a["memory_used_mib"] > 0 for a in apps)
    # Under a real engine the GPU memory is held by the EngineCore process, not the API server.
    assert any("EngineCor" in a["process_name"] or "python" in a["process_name"] for a in apps), apps
    assert telemetry.parse_csv((CAPTURES / "query_apps_after_stop.csv").read_text(), telemetry.APP_FIELDS) == []
