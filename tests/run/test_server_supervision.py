"""remote/run/server/workload.py's verdicts on a run's files, as data: which files an attempt keeps
and deletes before it starts, and when an ended client's output is a success, skipped samples (allowed
or not) or invalid outputs. The processes themselves are tested on the lab (test_server_runs_lab.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_server_outputs import hs_file

from base import outputs, rundir
from base.contract import DISK_LOW
from run.server.workload import LAYERS_FILE, ServerExtraction
from run.supervisor_loop import Supervisor
from support.lab import require_lab
from support.paths import FIXTURES

LAYERS, WIDTH = 4, 16


def workload(tmp_path: Path, *, allow_skipped: bool = False) -> ServerExtraction:
    run = rundir.RunDir(str(tmp_path / "run"))
    Path(run.path).mkdir()
    out = tmp_path / "out"
    plan = {"out": str(out), "staging": str(out / ".specrig-staging" / "r"), "layer_ids": [2, 4, 5, 8],
            "layer_convention": "id k = the input of decoder layer k", "num_hidden_layers": 8, "hidden_size": WIDTH,
            "allow_skipped": allow_skipped, "max_samples": None, "world_size": 1, "rank": 0, "clients": 1, "port": 1,
            "storage": "bf16"}
    (Path(run.path) / "run.json").write_text(json.dumps({"server": plan, "options": {}, "driver_args": {"model": "m"},
                                                         "out": str(out)}))
    return Supervisor(run, ServerExtraction).workload


def files(tmp_path: Path, good=(), truncated=(), nonfinite=()) -> Path:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    for index in good:
        hs_file(out / outputs.file_name(index), layers=LAYERS, width=WIDTH)
    for index in truncated:
        path = hs_file(out / outputs.file_name(index), layers=LAYERS, width=WIDTH)
        path.write_bytes(path.read_bytes()[:-7])
    for index in nonfinite:
        values = [float("nan")] + [0.5] * (5 * LAYERS * WIDTH - 1)
        hs_file(out / outputs.file_name(index), layers=LAYERS, width=WIDTH, values=values)
    return out


def test_an_attempt_keeps_the_valid_files_deletes_the_rest_and_empties_staging(tmp_path):
    out = files(tmp_path, good=[0, 1, 3], truncated=[2], nonfinite=[4])
    hs_file(out / outputs.file_name(5), layers=LAYERS + 1, width=WIDTH)  # another run's layers
    staging = out / ".specrig-staging" / "r"
    staging.mkdir(parents=True)
    (staging / "hs_9.safetensors.lock").write_text("")
    checked = workload(tmp_path).clean_outputs()
    assert checked == {"kept": 3, "deleted": [2, 4, 5]}
    assert outputs.existing_indices(str(out)) == [0, 1, 3]
    assert list(staging.iterdir()) == []
    described = json.loads((out / LAYERS_FILE).read_text())
    assert described["layer_ids"] == [2, 4, 5, 8] and described["convention"].startswith("id k = the input")


def test_every_file_ok_is_a_success(tmp_path):
    files(tmp_path, good=range(4))
    found = workload(tmp_path)
    assert found.validate([0, 1, 2, 3], "INFO Saved 4 new data points\n") is None
    assert found.supervisor.status["result"] == {"samples": 4, "ok": 4, "skipped": [], "missing": [], "bad": {}}


SKIPPED_LOG = ("WARNING  Skipping sample 1 due to error: Error code: 400\n"
               "WARNING  Skipping sample 3 due to error: Error code: 400\n"
               "WARNING  Skipped 2 samples due to errors: [1, 3]\n")


def test_skipped_samples_fail_the_run_naming_count_and_indices(tmp_path):
    files(tmp_path, good=[0, 2])
    failure = workload(tmp_path).validate([0, 1, 2, 3], SKIPPED_LOG)
    assert failure["kind"] == "samples-skipped" and not failure["retryable"]
    assert "skipped 2 of 4 samples after their retries: 1, 3" in failure["explain"]
    assert "allow_skipped" in failure["advice"]


def test_skipped_samples_take_the_cause_the_servers_log_names(tmp_path):
    """The client only skips; a full disk under vLLM's connector is in the server's log (issue 17): that
    decides, not retryable, and `inv resume` or allow_skipped are not what the advice says."""
    files(tmp_path, good=[0, 2])
    found = workload(tmp_path)
    disk_full = (FIXTURES / "classify" / "lab_server032_connector_disk_full.log").read_text()
    Path(found.server_log).write_text(disk_full)
    failure = found.validate([0, 1, 2, 3], SKIPPED_LOG)
    assert failure["kind"] == "disk-full" and failure["rule"] == "disk-full-connector", failure
    assert failure["role"] == "server" and not failure["retryable"]
    assert failure["explain"].startswith("generate-offline-data skipped 2 of 4 samples: vLLM's connector")
    assert "allow_skipped" not in failure["advice"]


def test_skipped_samples_allowed_succeed_and_are_listed(tmp_path):
    files(tmp_path, good=[0, 2])
    found = workload(tmp_path, allow_skipped=True)
    assert found.validate([0, 1, 2, 3], SKIPPED_LOG) is None
    assert found.supervisor.status["result"]["skipped"] == [1, 3] and found.supervisor.status["result"]["ok"] == 2


@pytest.mark.parametrize(("allow", "made"), [(False, dict(good=[0, 2])), (True, dict(good=[0, 2], truncated=[3]))])
def test_files_missing_or_bad_without_a_reason_are_invalid_outputs_and_retried(tmp_path, allow, made):
    files(tmp_path, **made)
    failure = workload(tmp_path, allow_skipped=allow).validate([0, 1, 2, 3], "INFO Saved 4 new data points\n")
    assert failure["kind"] == "outputs-invalid" and failure["retryable"]
    if made.get("truncated"):
        assert "1 missing (1); 1 truncated (3)" in failure["explain"]
    else:
        assert "2 missing (1, 3)" in failure["explain"]


@pytest.mark.runnable
def test_an_attempt_whose_share_cannot_fit_fails_before_its_first_file_from_the_real_token_counts(tmp_path):
    """Once prepare-data has counted the tokens, the attempt sizes the share's missing files from them (the
    preflight had only an estimate): more than the output's disk holds is DISK_LOW, not retried, need
    against free named; a share that fits goes on."""
    import subprocess

    from test_server_client import SPECULATORS_09

    require_lab(SPECULATORS_09.exists(), "the lab's speculators 0.9.0 environment (datasets) is not built")
    extraction = workload(tmp_path)
    prepared_dir = tmp_path / "prepared"
    program = ("import sys\nfrom datasets import Dataset\n"
               "Dataset.from_list([{'input_ids': list(range(10 + i))} for i in range(6)]).save_to_disk(sys.argv[1])\n")
    subprocess.run([str(SPECULATORS_09), "-c", program, str(prepared_dir)], capture_output=True, check=True)
    files(tmp_path, good=[0, 1])
    extraction.plan.update(prepared=str(prepared_dir))
    assert extraction.unfit_share() is None  # 4 missing files of 16 values a token: room
    extraction.plan.update(hidden_size=2 ** 50)  # a token's states larger than any disk
    found = extraction.unfit_share()
    assert found["kind"] == DISK_LOW and not found["retryable"], found
    tokens = sum(10 + i for i in (2, 3, 4, 5))
    assert found["explain"].startswith("disk low: ") and (
        f" free at {tmp_path / 'out'}; the 4 missing sample(s) of its 6 ({4 * 2 ** 51} B/token x {tokens} tokens, "
        "the prepared data's own) needs about ") in found["explain"], found
    assert "then `inv resume`; or launch again with an --out that has room" in found["advice"], found
