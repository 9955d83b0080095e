"""The GPU harness's own logic (benchmarks/gpu/: arms.py, the phases' modules and harness.py, summarize.py), without
a GPU.

Issue 26 (point 5): every arm stands alone and names what it varies. Two specrig arms with different client
code must never share a name; a by-hand arm runs speculators as shipped; the bare arm prepares its prompts
itself where no arm did, and runs the extraction server's prefix caching; the goals are the figures divided,
PASS or MISS; one device call within its budget skips what it cannot finish.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import struct
import sys

import pytest

from support.gpu_harness import harness_modules
from support.paths import REPO

GPU = REPO / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

import arms
import fault_phase
import summarize

#: The call of speculators 0.8/0.9's generate_hidden_states_async as shipped, and the patch
#: client-token-ids-in-extra-body's replacement (patchset speculators-0.8-0.9-client, count 2).
SHIPPED_CALL = '''prompt=token_ids,
            max_tokens=1,
            extra_body={"return_token_ids": True},'''
PATCHED_CALL = '''prompt=[],  # specrig: the ids go in extra_body, the same JSON without openai's per-token transform
            max_tokens=1,
            extra_body={"prompt": token_ids, "return_token_ids": True},'''
CLIENT = '''import openai


async def generate_hidden_states_async(client, model, client_item, *, timeout=120):
    token_ids = client_item["input_ids"]
    messages = client_item.get("messages")
    if messages is None:
        coro = client.completions.create(
            model=model,
            %s
            timeout=timeout,
        )
    else:
        coro = client.chat.completions.create(model=model, messages=messages, max_tokens=1,
                                              extra_body={"return_token_ids": True})
    return await coro


def generate_hidden_states(client, model, client_item, *, timeout=120):
    token_ids = client_item["input_ids"]
    return client.completions.create(
            model=model,
            %s
            timeout=timeout,
        )
'''
REAL_CLIENT = "/root/.cache/specrig/wheels/unpacked/speculators-0.9.0/speculators/data_generation/vllm_client.py"


def client_source(patched):
    call = PATCHED_CALL if patched else SHIPPED_CALL
    return CLIENT % (call, call)


# -- arms.py ------------------------------------------------------------------------------------------

def test_an_arm_spec_gives_its_way_concurrency_settings_and_options():
    assert arms.parse_spec("arm:specrig:default:patch=1,profile=1") == {
        "way": "specrig", "concurrency": None, "settings": {}, "profile": True, "patch": "1"}
    assert arms.parse_spec("arm:specrig:64:writer_threads=16,patch=0") == {
        "way": "specrig", "concurrency": 64, "settings": {"writer_threads": "16"}, "profile": False, "patch": "0"}
    assert arms.parse_spec("arm:bare:128")["concurrency"] == 128
    assert arms.parse_spec("arm:hand")["concurrency"] is None
    for bad in ("arm:nope:32", "arm:specrig:x", "arm:specrig:32:patch=2", "arm:hand:32:patch=1",
                "arm:bare:32:writer_threads=16", "arm:specrig:32:novalue"):
        with pytest.raises(arms.SpecError):
            arms.parse_spec(bad)


def test_two_specrig_arms_with_different_client_code_get_different_names():
    patched = arms.label("specrig", 32, {}, "patched")
    unpatched = arms.label("specrig", 32, {}, "unpatched")
    assert patched == "specrig-c32-patched" and unpatched == "specrig-c32-unpatched"
    assert arms.label("bare", 128) == "bare-c128"
    assert arms.label("hand", 32, None, "unpatched", "llama1b", profiled=True) == "hand-c32-unpatched-llama1b-profiled"
    # settings sorted, and a path is a file name too
    assert arms.label("specrig", 32, {"writer_threads": "16", "staging": "/dev/shm/x"}, "patched") == \
        "specrig-c32-staging=_dev_shm_x-writer_threads=16-patched"
    taken = {"bare-c128": {}, "bare-c128-r2": {}}
    assert arms.unique("bare-c128", taken) == "bare-c128-r3" and arms.unique("hand-c32", taken) == "hand-c32"


def test_a_name_carries_only_the_settings_that_differ_from_specrigs_defaults():
    sys.path.append(str(REPO / "remote"))
    defaults = importlib.import_module("base.contract").SERVER_DEFAULTS
    given = {"concurrency": str(defaults["concurrency"]), "storage": defaults["storage"], "writer_threads": "16",
             "max_num_batched_tokens": "16384", "out": "ram"}
    assert arms.nondefault(given, defaults) == {"writer_threads": "16", "max_num_batched_tokens": "16384", "out": "ram"}


def test_the_client_state_is_read_from_the_code():
    assert arms.client_patch_state(client_source(False))["state"] == "unpatched"
    assert arms.client_patch_state(client_source(True))["state"] == "patched"
    assert arms.client_patch_state("def f(:")["state"] == "unknown"
    assert arms.client_patch_state("def other():\n    pass\n")["state"] == "unknown"
    # prompt=[] without the ids in extra_body would send no prompt: neither shipped nor patched
    half = client_source(False).replace("prompt=token_ids,", "prompt=[],")
    assert arms.client_patch_state(half)["state"] == "unknown"


def test_the_client_state_of_speculators_0_9_as_shipped_and_as_patched():
    try:
        shipped = open(REAL_CLIENT).read()
    except OSError:
        pytest.skip("speculators 0.9.0's client is not unpacked on this machine")
    assert shipped.count(SHIPPED_CALL) == 2
    assert arms.client_patch_state(shipped)["state"] == "unpatched"
    assert arms.client_patch_state(shipped.replace(SHIPPED_CALL, PATCHED_CALL))["state"] == "patched"


def safetensors_file(path, ids, dtype="I64"):
    code = arms.SAFETENSORS_INTS[dtype]
    data = struct.pack("<%d%s" % (len(ids), code), *ids)
    header = json.dumps({"token_ids": {"dtype": dtype, "shape": [len(ids)], "data_offsets": [0, len(data)]},
                         "hidden_states": {"dtype": "BF16", "shape": [len(ids), 1, 2],
                                           "data_offsets": [len(data), len(data) + 4 * len(ids)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data + b"\0" * 4 * len(ids))


def test_the_prompts_digest_is_what_was_sent_whatever_the_order(tmp_path):
    prompts = [[1, 2, 3], [7, 8], [9] * 5]
    for i, ids in enumerate(prompts):
        safetensors_file(tmp_path / ("hs_%d.safetensors" % i), ids, "I64" if i else "I32")
    stored = [arms.token_ids(tmp_path / ("hs_%d.safetensors" % i)) for i in range(3)]
    assert stored == prompts
    digest = arms.prompts_digest(prompts)
    assert digest["samples"] == 3 and digest["tokens"] == 10
    assert arms.prompts_digest(reversed(prompts)) == digest
    assert arms.prompts_digest([[1, 2, 3], [7, 8], [9] * 4])["sha256"] != digest["sha256"]


def test_a_states_subset_spreads_over_the_files():
    files = list(range(512))
    chosen = arms.spread(files, 64)
    assert len(chosen) == 64 == len(set(chosen)) and chosen[0] == 0 and chosen[-1] == 511
    assert {i % 2 for i in chosen} == {0, 1}  # with and without the shared system prompt
    assert arms.spread(files[:10], 64) == files[:10]


def test_the_prefix_caching_setting_of_a_command_and_of_a_log():
    assert arms.prefix_caching_flag(["python", "-m", "vllm", "serve", "m"]) is None
    assert arms.prefix_caching_flag(["--no-enable-prefix-caching"]) == "--no-enable-prefix-caching"
    assert arms.prefix_caching_flag(["--no-enable-prefix-caching", "--enable_prefix_caching"]) == \
        "--enable-prefix-caching"
    line = "INFO [core.py:117] Initializing a V1 LLM engine (v0.26.0) with config: seed=0, enable_prefix_caching=True, x"
    assert arms.prefix_caching_in_log(line) is True
    assert arms.prefix_caching_in_log(line.replace("True", "False")) is False
    assert arms.prefix_caching_in_log("nothing") is None


def test_the_issue26_preset_is_one_call_whose_environment_the_caller_overrides():
    phases, env = arms.expand(["issue26"], {})
    assert phases[0] == "prep" and env == {"N_MEASURE": "512"}
    assert [p.split(":")[1] for p in phases if p.startswith("arm:")] == ["specrig", "bare", "hand"]
    specrig = phases.index("arm:specrig:default:patch=1,profile=1")  # its defaults, after apply-patches, profiled
    assert phases[specrig + 1] == "states:specrig"  # its files checked while on the disk
    assert arms.expand(["issue26"], {"N_MEASURE": "768"})[1] == {}
    assert arms.expand(["prep", "arm:bare:32"], {}) == (["prep", "arm:bare:32"], {})
    assert arms.phase_min_s("arm:specrig:default:patch=1") == arms.PHASE_MIN_S["arm:specrig"]
    assert arms.phase_min_s("states:specrig") == arms.PHASE_MIN_S["states"] and arms.phase_min_s("clean") == 0
    # what the runs so far took at best fits in one 600 s call, with the first start's cold compile
    assert sum(arms.phase_min_s(p) for p in phases) < 600


# -- the harness's modules: harness.py's tools, the phases ----------------------------------------------

@pytest.fixture
def gpu_harness(tmp_path, monkeypatch):
    """The harness's modules imported on a scratch SG (support/gpu_harness.py), nothing on a GPU or a port; its
    results start empty. Each module is an attribute: gpu_harness.harness, .arm_phase, ..."""
    with harness_modules(tmp_path, monkeypatch) as modules:
        yield modules


def prepared_dir(path, rows=b"x"):
    path.mkdir(parents=True)
    (path / "data-00000-of-00001.arrow").write_bytes(rows)
    (path / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    return path


def test_the_prepared_prompts_are_cached_once_by_what_they_depend_on(gpu_harness, tmp_path, monkeypatch):
    model, data = tmp_path / "model", tmp_path / "chat.jsonl"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights are not part of the key")
    data.write_text('{"conversations": []}\n')
    monkeypatch.setattr(gpu_harness.harness, "MODEL", str(model))
    monkeypatch.setattr(gpu_harness.harness, "DATA", str(data))
    cache = gpu_harness.arm_inputs.prepared_cache()
    assert cache["hit"] is False and set(cache["inputs"]["tokenizer_sha256"]) == {"tokenizer.json", "config.json"}
    assert gpu_harness.arm_inputs.cache_prepared(str(tmp_path / "missing"), cache) is False  # nothing whole to cache
    assert gpu_harness.arm_inputs.cache_prepared(str(prepared_dir(tmp_path / "hand" / "prepared")), cache) is True
    again = gpu_harness.arm_inputs.prepared_cache()
    assert again["hit"] is True and again["key"] == cache["key"]
    assert gpu_harness.arm_inputs.cache_prepared(str(prepared_dir(tmp_path / "other", b"y")), again) is False  # once
    (model / "tokenizer.json").write_text('{"changed": 1}')
    assert gpu_harness.arm_inputs.prepared_cache()["key"] != cache["key"]
    monkeypatch.setattr(gpu_harness.harness, "N_MEASURE", 1024)
    assert gpu_harness.arm_inputs.prepared_cache()["key"] != cache["key"]


def test_specrigs_prepared_data_fills_the_cache_only_when_rendered_the_same_way(gpu_harness):
    sys.path.append(str(REPO / "remote"))
    client = importlib.import_module("run.server.client")
    same = client.prepare_argv("py", model=gpu_harness.harness.MODEL, dataset=gpu_harness.harness.DATA, output="/x", port=8000,
                               seq_length=2048, max_samples=gpu_harness.harness.N_MEASURE)
    assert gpu_harness.arm_inputs.same_prepare(same)
    assert gpu_harness.arm_inputs.same_prepare(same + ["--seed", "0"])
    assert not gpu_harness.arm_inputs.same_prepare(same + ["--seed", "3"])
    assert not gpu_harness.arm_inputs.same_prepare(client.prepare_argv("py", model=gpu_harness.harness.MODEL, dataset=gpu_harness.harness.DATA,
                                                           output="/x", port=8000, seq_length=4096,
                                                           max_samples=gpu_harness.harness.N_MEASURE))
    assert not gpu_harness.arm_inputs.same_prepare(None)


def test_the_client_state_is_read_where_the_arms_import_speculators(gpu_harness, tmp_path, monkeypatch):
    package = tmp_path / "site" / "speculators"
    (package / "data_generation").mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('not imported to be read')\n")
    (package / "data_generation" / "vllm_client.py").write_text(client_source(True))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    found = gpu_harness.harness.client_state()
    assert found["state"] == "patched" and found["path"].endswith("data_generation/vllm_client.py") and found["sha256"]


def test_the_bare_arm_takes_the_prefix_caching_of_specrigs_plan(gpu_harness, tmp_path):
    run = tmp_path / "home" / "specrig" / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"server": {"server_argv": [
        "python", "-m", "vllm.entrypoints.openai.api_server", "--model", gpu_harness.harness.MODEL,
        "--no-enable-prefix-caching"]}}))
    decided = gpu_harness.arm_inputs.prefix_caching_decision()
    assert decided["flag"] == "--no-enable-prefix-caching" and decided["setting"] == "off" and "r1" in decided["from"]
    (run / "run.json").write_text(json.dumps({"server": {"server_argv": ["python", "--model", "/another/model"]}}))
    decided = gpu_harness.arm_inputs.prefix_caching_decision()  # no plan for this model: specrig's launch settings, else vLLM's
    assert decided["setting"] in ("vLLM's default", "on", "off") and decided["from"]


def test_a_file_watch_sees_the_first_and_the_last_file(gpu_harness, tmp_path):
    watch = gpu_harness.arm_runs.FileWatch(str(tmp_path))
    watch.poll()
    assert watch.first is None
    (tmp_path / "hs_0.safetensors").write_bytes(b"")
    watch.poll()
    first = watch.first
    (tmp_path / "hs_1.safetensors").write_bytes(b"")
    (tmp_path / "other.tmp").write_bytes(b"")
    watch.finish()
    assert watch.count == 2 and watch.first == first <= watch.last


def test_the_figures_of_an_arm():
    arm = arms.figures({"tokens": 1000, "samples": 10, "wall_s": 100.0, "server_ready_s": 60.0,
                        "first_sample_s": 65.0, "last_sample_s": 80.0, "generate_s": 25.0})
    assert arm["after_load_s"] == 40.0 and arm["tokens_per_s_after_load"] == 25.0
    assert arm["health_to_first_file_s"] == 5.0 and arm["health_to_last_file_s"] == 20.0
    assert arm["tokens_per_s_to_last_file"] == 50.0 and arm["tokens_per_s_generate"] == 40.0


def test_a_by_hand_arm_never_runs_a_patched_client(gpu_harness, monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_harness.harness, "patch_client", lambda action: calls.append(action) or {"exit": 0})
    monkeypatch.setattr(gpu_harness.harness, "client_state", lambda: {"state": "patched", "detail": "", "path": "p",
                                                            "sha256": "s"})
    monkeypatch.setattr(gpu_harness.arm_runs, "arm_by_hand", lambda *a, **k: pytest.fail("the arm ran"))
    gpu_harness.arm_phase.phase_arm("arm:hand:32")
    assert calls == ["revert"]
    arm = gpu_harness.harness.results["arms"]["hand-c32-patched"]
    assert "as shipped" in arm["error"] and arm["client_patch"]["patching"] == {"exit": 0}


def test_a_specrig_arm_is_named_by_the_client_it_ran_and_by_its_plans_concurrency(gpu_harness, monkeypatch):
    states = iter(["patched", "unpatched"])
    monkeypatch.setattr(gpu_harness.harness, "patch_client", lambda action: {"action": action})
    monkeypatch.setattr(gpu_harness.harness, "client_state", lambda: {"state": next(states)})
    monkeypatch.setattr(gpu_harness.arm_inputs, "server_defaults", lambda: {"concurrency": 32, "writer_threads": None})
    ran = []

    def fake_specrig(name, concurrency, settings, keep_for_states=0, window=None):
        ran.append((name, concurrency, settings, keep_for_states))
        return {"concurrency": 48 if concurrency is None else concurrency, "tokens": 100, "wall_s": 10.0}

    monkeypatch.setattr(gpu_harness.arm_runs, "arm_specrig", fake_specrig)
    gpu_harness.arm_phase.phase_arm("arm:specrig:default:patch=1", keep_for_states=64)
    gpu_harness.arm_phase.phase_arm("arm:specrig:32:patch=0,writer_threads=16")
    assert ran[0] == ("specrig-c32-patched", None, {}, 64)  # specrig's default: none passed
    assert ran[1] == ("specrig-c32-writer_threads=16-unpatched", 32, {"writer_threads": "16"}, 0)
    found = gpu_harness.harness.results["arms"]
    assert set(found) == {"specrig-c48-patched", "specrig-c32-writer_threads=16-unpatched"}
    assert found["specrig-c48-patched"]["files_label"] == "specrig-c32-patched"
    assert found["specrig-c48-patched"]["client_patch"]["patching"] == {"action": "apply"}
    assert found["specrig-c32-writer_threads=16-unpatched"]["settings_nondefault"] == {"writer_threads": "16"}


def test_a_phase_the_budget_cannot_hold_is_skipped_and_said(gpu_harness, monkeypatch):
    monkeypatch.setattr(gpu_harness.harness, "BUDGET_S", 100.0)
    monkeypatch.setattr(gpu_harness.arm_runs, "arm_by_hand", lambda *a, **k: pytest.fail("an arm began"))
    gpu_harness.device_run.main(["arm:bare:128", "states:specrig"])
    skipped = gpu_harness.harness.results["skipped"]
    assert [entry["phase"] for entry in skipped] == ["arm:bare:128"]
    assert gpu_harness.harness.results["states"]["error"].startswith("no arm or fault cell named specrig*")
    saved = json.loads(open(gpu_harness.harness.RESULTS).read())
    assert saved["skipped"] == skipped and saved["phases_started"][0][0] == "arm:bare:128"


# -- summarize.py ---------------------------------------------------------------------------------------

def arm_record(way, label_client, *, ready, first, last, wall, tokens=666127, digest="d", logged=True, **extra):
    record = {"way_id": way, "way": arms.WAY_WORDS[way], "concurrency": extra.pop("concurrency", 32),
              "settings": {}, "settings_nondefault": extra.pop("nondefault", {}),
              "client_patch": {"state": label_client, "used": way != "bare"}, "shape": "llama8b",
              "samples": 512, "tokens": tokens, "prompts": {"samples": 512, "tokens": tokens, "sha256": digest},
              "prefix_caching": {"setting": "vLLM's default", "from": "x", "server_log": logged},
              "server_ready_s": ready, "first_sample_s": first, "last_sample_s": last, "wall_s": wall}
    record.update(extra)
    return arms.figures(record)


def issue26_raw(specrig_steady_s=12.0, digest="d", bare_logged=True):
    return {
        "commit": "0" * 40, "device": {"gpu": "NVIDIA H200, 143771 MiB, 580"},
        "phases_started": [[p, "10:00:00"] for p in arms.expand(["issue26"], {})[0]],
        "arms": {
            "hand-c32-unpatched": arm_record("hand", "unpatched", ready=90.0, first=135.0, last=151.0, wall=153.0),
            "bare-c128": arm_record("bare", "unpatched", ready=100.0, first=100.5, last=111.5, wall=112.5,
                                    concurrency=128, logged=bare_logged),
            "specrig-c32-patched-profiled": arm_record("specrig", "patched", ready=95.0, first=100.0,
                                                       last=100.0 + specrig_steady_s, wall=115.0 + specrig_steady_s,
                                                       digest=digest),
        },
        "skipped": [{"phase": "states:specrig", "left_s": 20.0, "needs_s": 35}],
    }


def test_the_goals_are_the_figures_divided_with_their_verdicts():
    summary = summarize.build(issue26_raw(), device_minutes=12, date="2026-12-03")
    rows = {row["arm"]: row for row in summary["table"]}
    assert rows["bare-c128"]["steady_s"] == 11.0 and rows["bare-c128"]["steady_from"] == "first to last file"
    goals = summary["goals"]
    bare_steady, hand_steady, ours = 666127 / 11.0, 666127 / 16.0, 666127 / 12.0
    assert goals["specrig_steady_vs_bare"]["value"] == pytest.approx(ours / bare_steady, rel=1e-3)
    assert goals["specrig_steady_vs_hand"]["value"] == pytest.approx(ours / hand_steady, rel=1e-3)
    assert goals["specrig_steady_vs_bare"]["verdict"] == "PASS"  # 0.917
    assert goals["specrig_steady_vs_hand"]["verdict"] == "PASS"  # 1.33
    assert goals["specrig_after_load_vs_bare"]["value"] == pytest.approx(11.5 / 17.0, rel=1e-3)
    assert goals["specrig_after_load_vs_bare"]["verdict"] == "MISS"
    assert goals["specrig_steady_vs_bare"]["arms"] == ["specrig-c32-patched-profiled", "bare-c128"]
    assert summary["checks"]["same_prompts"] is True and summary["checks"]["prefix_caching_same"] is True
    text = summarize.markdown(summary)
    assert "**MISS**" in text and "**PASS**" in text and "health to first file s" in text
    assert "skipped for the call's budget: states:specrig" in text
    # said in not_run, with why: the states skipped for the budget, kill -9 and stop not among the phases
    whats = " ".join(entry["what"] for entry in summary["not_run"])
    assert "states:specrig" in whats and "kill" in whats and "stop" in whats
    slower = summarize.build(issue26_raw(specrig_steady_s=14.0), device_minutes=12, date="2026-12-03")
    assert slower["goals"]["specrig_steady_vs_bare"]["verdict"] == "MISS"


def test_only_specrig_with_its_defaults_and_the_patch_counts_for_the_goals():
    raw = issue26_raw()
    raw["arms"]["specrig-c32-patched-profiled"]["client_patch"]["state"] = "unpatched"
    goals = summarize.build(raw, device_minutes=12, date="d")["goals"]
    assert {entry["verdict"] for entry in goals.values()} == {"NOT MEASURED"}
    raw = issue26_raw()
    raw["arms"]["specrig-c32-patched-profiled"]["settings_nondefault"] = {"writer_threads": "16"}
    assert summarize.build(raw, device_minutes=12, date="d")["goals"]["specrig_steady_vs_bare"]["value"] is None


def test_arms_that_sent_other_prompts_or_ran_another_prefix_caching_are_said_so():
    checks = summarize.build(issue26_raw(digest="other", bare_logged=False), device_minutes=1, date="d")["checks"]
    assert checks["same_prompts"] is False and checks["prefix_caching_same"] is False


def test_a_summary_of_issue26_passes_the_committed_results_checks(tmp_path):
    """What summarize writes for issue 26's call passes every check tests/run/test_gpu_results.py makes of
    the committed results (the states as a subset of the specrig arm's files)."""
    checks = importlib.import_module("test_gpu_results")
    raw = issue26_raw()
    documented = {str(k): {"max_abs_diff": 0.3, "max_abs_ref": 20.0, "rel_l2": 0.01, "worst_sample_rel_l2": 0.015}
                  for k in (2, 16, 29, 32)}
    raw["states"] = {
        "files": 64, "tokens": 80000, "dtype": "torch.bfloat16", "layer_ids": [2, 16, 29, 32],
        "num_hidden_layers": 32, "reference": "transformers", "gpu": "NVIDIA H200",
        "tolerance": {"bf16_margin": 2.0, "calibration_samples": 32, "shifted_must_exceed": 0.1,
                      "rel_l2_per_layer": {k: 0.03 for k in documented}},
        "calibration_fp32": {"transformers_bf16": {k: 0.015 for k in documented}, "vllm": {k: 0.014 for k in documented}},
        "documented": documented, "shifted": {k: {"max_abs_diff": 9.0, "rel_l2": 0.2} for k in documented},
        "within_tolerance": True, "shifted_fails": True, "problems": [], "files_with_nonfinite": 0,
        "load_s": 20.0, "check_s": 15.0, "arm": "specrig-c32-patched-profiled",
        "subset": {"files": 64, "of": 512, "how": "spread"}, "client_patch": "patched"}
    raw["skipped"] = []
    result = json.loads(json.dumps(summarize.build(raw, device_minutes=14, date="2026-12-03"), default=str))
    for name in ("test_every_field_is_there", "test_the_states_record_is_consistent_and_the_shifted_pairing_fails",
                 "test_the_tolerance_is_what_bf16_costs_transformers_itself",
                 "test_the_kill_was_classified_restarted_and_resumed_complete",
                 "test_stop_was_clean_with_the_memory_back_at_idle", "test_the_table_is_consistent",
                 "test_two_arms_never_share_a_name_and_each_says_what_it_ran",
                 "test_the_goals_say_what_their_numbers_say"):
        getattr(checks, name)(result)


FAKE_SERVER = '''
import http.server, sys
port = int(sys.argv[1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("enable_prefix_caching=%s" % ("--no-enable-prefix-caching" not in sys.argv), flush=True)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def test_warm_starts_each_server_to_its_health_and_ends_it(gpu_harness, monkeypatch):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(gpu_harness.harness, "PORT", port)
    monkeypatch.setattr(gpu_harness.arm_inputs, "docs_server_argv", lambda staging: [
        sys.executable, "-c", FAKE_SERVER, str(port), "--speculative_config", "{}", "--kv_transfer_config", "{}"])
    monkeypatch.setattr(gpu_harness.arm_inputs, "prefix_caching_decision", lambda: {
        "flag": "--no-enable-prefix-caching", "setting": "off", "from": "test"})
    gpu_harness.warm_phase.phase_warm("warm:bare")
    warmed = gpu_harness.harness.results["warm"]
    assert set(warmed) == {"extraction", "bare"}
    assert all(entry["healthy"] and entry["exit"] is None for entry in warmed.values()), warmed
    logs = {kind: open("%s/warm-%s-server.log" % (gpu_harness.harness.EXTRAS, kind)).read() for kind in warmed}
    assert arms.prefix_caching_in_log(logs["extraction"]) is True
    assert arms.prefix_caching_in_log(logs["bare"]) is False  # the bare server took the flag


def test_a_profile_window_gives_up_once_its_arm_has_ended(tmp_path):
    import time

    import profiling

    window = profiling.Window(str(tmp_path / "profile"), trigger=lambda: False, timeout=400)
    window.start()
    started = time.time()
    window.cancelled = True
    window.join(timeout=10)
    assert not window.is_alive() and time.time() - started < 5
    assert window.result["error"] == "never reached its steady part" and (tmp_path / "profile" / "off").exists()


# -- issue 29: the shrunk Kimi-K2.5's phases (kimi_phase.py) -------------------------------------------

def test_the_issue29_preset_runs_the_kimi_steps_in_order_each_with_its_least_time():
    phases, env = arms.expand(["issue29"], {})
    assert phases == ["kimi:build", "kimi:drift", "kimi:forward", "kimi:states", "kimi:extract", "kimi:states",
                      "kimi:smoke"] and env == {}
    assert all(arms.phase_min_s(phase) > 0 for phase in phases)
    import kimi_phase
    assert set(kimi_phase.STEPS) == {phase.split(":")[1] for phase in phases}


def test_a_kimi_step_of_another_name_is_refused_by_name(tmp_path):
    import kimi_phase

    class Harness:
        EXTRAS = str(tmp_path / "extras")

    with pytest.raises(ValueError, match="phase 'kimi:nope': one of kimi:build, kimi:drift"):
        kimi_phase.run(Harness, "kimi:nope")


def test_the_kimi_layers_are_speculators_choice_at_each_depth():
    import kimi_phase
    assert kimi_phase.default_layer_ids(61) == [2, 30, 58, 61]
    assert kimi_phase.default_layer_ids(8) == [2, 4, 5, 8]


# -- issue 35: inv's flags, the fault cells (fault_phase.py) ---------------------------------------------

def test_a_flag_that_is_off_by_default_is_spelled_as_inv_takes_it(gpu_harness):
    flags = arms.task_flags((REPO / "specrig" / "cli" / "tasks.py").read_text(), "extract")
    assert flags["enforce_eager"] is False and flags["render_server"] is True and flags["prepared_cache"] is True
    assert "writer_threads" not in flags and "concurrency" not in flags  # they take a value
    args = gpu_harness.harness.extract_args("/out", 8, settings={"enforce_eager": "1", "render_server": "1",
                                                         "prepared_cache": "0", "writer_threads": "16"})
    tail = args[args.index("--json") + 1:]
    # never --enforce-eager 1; a flag on by default is still named where the arm asks for it
    assert tail == ["--enforce-eager", "--render-server", "--no-prepared-cache", "--writer-threads", "16"]
    assert arms.inv_options({"render_server": "0"}, flags) == ["--no-render-server"]
    assert arms.inv_options({"enforce_eager": "0"}, flags) == []  # off by default: inv has no --no-enforce-eager
    assert arms.inv_options({"prepared_cache": "1", "allow_skipped": "true"}, flags) == ["--prepared-cache",
                                                                                        "--allow-skipped"]
    with pytest.raises(arms.SpecError, match="render_server is a flag of inv extract"):
        arms.inv_options({"render_server": "maybe"}, flags)


def test_a_fault_spec_gives_its_injections_options_and_name():
    import fault_phase

    spec = "fault:stop-engine-core@64+kill-api-server@160:enforce_eager=1,patch=1"
    assert fault_phase.parse(spec) == ([{"signal": "stop", "process": "engine-core", "at": 64},
                                        {"signal": "kill", "process": "api-server", "at": 160}],
                                       {"enforce_eager": "1"}, "1")
    assert fault_phase.label(spec) == "fault-stop-engine-core@64+kill-api-server@160-enforce_eager=1-patch=1"
    for bad in ("fault", "fault:", "fault:hup-engine-core@3", "fault:kill-client@3", "fault:kill-api-server",
                "fault:kill-api-server@9+stop-engine-core@9", "fault:kill-api-server@9:patch=2",
                "fault:kill-api-server@9:novalue"):
        with pytest.raises(arms.SpecError):
            fault_phase.parse(bad)
    phases, env = arms.expand(["issue35"], {})
    assert env["N_FAULT"] == "256" and phases.index("states:fault") == phases.index(next(
        p for p in phases if p.startswith("fault:"))) + 1
    assert arms.phase_min_s(phases[2]) == arms.PHASE_MIN_S["fault"]
    assert sum(arms.phase_min_s(p) for p in phases) < 570  # one call's budget, at best


ENGINE_TREE = '''
import subprocess, sys, time
core = subprocess.Popen([sys.executable, "-c", "open('/proc/self/comm', 'w').write('VLLM::EngineCore')\\n"
                         "import time\\ntime.sleep(60)"])
time.sleep(60)
'''


@pytest.fixture
def engine_tree(gpu_harness):
    """A server job whose child titles itself as vLLM's EngineCore (/proc/self/comm), as the API server's does."""
    import subprocess
    import time

    job = subprocess.Popen([sys.executable, "-c", ENGINE_TREE])
    deadline = time.time() + 20
    while time.time() < deadline and not fault_phase.find(gpu_harness.harness.proc_table(), job.pid,
                                                                     "engine-core"):
        time.sleep(0.05)
    yield job
    for pid in fault_phase.descendants(gpu_harness.harness.proc_table(), job.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    job.kill()
    job.wait()


def state_of(pid):
    """The process's state letter (/proc/PID/stat: T stopped, Z dead, not reaped), None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(") ", 1)[1][0]
    except OSError:
        return None


def settled(pid, states, timeout=10):
    """The process's state once it is one of `states` (a signal is delivered a moment after it is sent)."""
    import time

    deadline = time.time() + timeout
    while state_of(pid) not in states and time.time() < deadline:
        time.sleep(0.02)
    return state_of(pid)


def fake_run(path, attempts, state="running", phase="generating", samples=8):
    """A run's heartbeat and status, each replaced whole as the supervisor does (remote/run/rundir.py): written
    in place, a watch polling beside it could read a file half written and see a state of None."""
    path.mkdir(parents=True, exist_ok=True)
    for name, content in (("heartbeat.json", {"phase": phase, "samples_done": samples}),
                          ("status.json", {"state": state, "attempts": attempts,
                                           "jobs": {"server": {"pid": attempts[-1].get("pid")}}})):
        (path / (name + ".tmp")).write_text(json.dumps(content))
        os.replace(path / (name + ".tmp"), path / name)


def test_the_engine_core_is_the_titled_child_of_the_api_server(gpu_harness, engine_tree):
    found = fault_phase.find(gpu_harness.harness.proc_table(), engine_tree.pid, "engine-core")
    assert len(found) == 1 and gpu_harness.harness.proc_table()[found[0]][0] == engine_tree.pid
    assert fault_phase.find(gpu_harness.harness.proc_table(), engine_tree.pid, "api-server") == [engine_tree.pid]
    assert fault_phase.find(gpu_harness.harness.proc_table(), 0, "engine-core") == []  # no such job


def test_a_stopped_engine_core_is_timed_to_the_supervisors_reaction(gpu_harness, engine_tree, tmp_path):
    import threading
    import time

    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    (out / "hs_0.safetensors").write_bytes(b"kept")
    fake_run(run, [{"attempt": 1, "ended_at": None, "pid": engine_tree.pid}])
    (run / "driver.log").write_text("before the fault\n")
    record, kept = fault_phase.inject(gpu_harness.harness, str(run), str(out),
                                      {"signal": "stop", "process": "engine-core", "at": 8}, timeout=5)
    core = record["pids"][0]
    assert record["at_epoch"] and settled(core, ("T",)) == "T"  # stopped
    assert list(kept) == ["hs_0.safetensors"] and record["files_before"] == 1

    def supervisor():
        time.sleep(0.3)
        with open(run / "driver.log", "a") as log:
            log.write("\n[specrig-supervisor 2026-12-06T00:00:00+00:00] no progress for 1 s (generate): stalled\n")
        fake_run(run, [{"attempt": 1, "ended_at": None, "pid": engine_tree.pid}], state="stalled")
        time.sleep(0.3)
        fake_run(run, [{"attempt": 1, "ended_at": "t", "pid": engine_tree.pid, "failure": {"kind": "stalled"}}],
                 state="restarting")
        time.sleep(0.3)
        fake_run(run, [{"attempt": 1, "ended_at": "t"}, {"attempt": 2, "ended_at": None, "pid": engine_tree.pid}])

    threading.Thread(target=supervisor, daemon=True).start()
    reaction = fault_phase.watch(gpu_harness.harness, str(run), record, watch_s=10)
    assert reaction["first_marker_s"] <= reaction["stalled_s"] < reaction["attempt_ended_s"] <= reaction["went_on_s"]
    assert reaction["detected_s"] == reaction["stalled_s"] and reaction["failure"]["kind"] == "stalled"
    assert reaction["markers"][0][1].endswith("stalled") and reaction.get("released_s") is None
    assert [state for _, state in reaction["states"]] == ["running", "stalled", "restarting", "running"]
    assert fault_phase.release() == [core]  # still stopped: let go at the phase's end
    assert settled(core, (None, "Z")) in (None, "Z")  # dead (its parent, a sleeper, reaps nothing)
    assert fault_phase.unchanged(str(out), kept) == 1


def test_a_hang_nobody_calls_is_let_go_by_the_harness_and_said_so(gpu_harness, engine_tree, tmp_path):
    run = tmp_path / "run"
    fake_run(run, [{"attempt": 1, "ended_at": None, "pid": engine_tree.pid}])
    record, _ = fault_phase.inject(gpu_harness.harness, str(run), str(tmp_path),
                                   {"signal": "stop", "process": "engine-core", "at": 8}, timeout=5)
    reaction = fault_phase.watch(gpu_harness.harness, str(run), record, watch_s=0.5)
    assert reaction["released_s"] >= 0.5 and reaction["released_pids"] == record["pids"]
    assert reaction["detected_s"] is None and reaction.get("went_on_s") is None
    assert fault_phase.STOPPED == {} and fault_phase.release() == []


def test_the_render_servers_first_run_is_judged_against_bare_prefill():
    import fault_phase

    rows = [{"arm": "specrig-c32-prepared_cache=0-render_server=1-patched", "way_id": "specrig", "shape": "llama8b",
             "settings_nondefault": {"render_server": "1", "prepared_cache": "0"}, "prompts": {"sha256": "d"},
             "tokens_per_s_to_last_file": 45000.0, "health_to_last_file_s": 14.8, "prepare_after_health_s": 0.4},
            {"arm": "specrig-c32-patched", "way_id": "specrig", "shape": "llama8b", "settings_nondefault": {},
             "prompts": {"sha256": "d"}, "tokens_per_s_to_last_file": 30000.0},
            {"arm": "bare-c128", "way_id": "bare", "shape": "llama8b", "prompts": {"sha256": "d"},
             "tokens_per_s_to_last_file": 60000.0, "health_to_last_file_s": 11.1}]
    found = fault_phase.summary({}, rows)["render_server_first_run"]
    assert len(found) == 1 and found[0]["value"] == 0.75 and found[0]["verdict"] == "MISS"
    assert found[0]["bare"] == "bare-c128" and found[0]["prepare_after_health_s"] == 0.4
