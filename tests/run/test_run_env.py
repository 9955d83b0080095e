"""Where a run's environment comes from without run.json holding it (remote/run/launching.py), on real files: an
older record's values scrubbed, a node's VLLM_HOST_IP given again at resume, an older run made private."""
from __future__ import annotations

import json
import os
import stat

import pytest

from base import rundir
from run import launching


@pytest.fixture
def environ(monkeypatch):
    """os.environ, restored after the test (resume changes the call's environment on purpose)."""
    for name in ("HF_TOKEN", "SPECRIG_TEST_OLD", "VLLM_HOST_IP"):
        monkeypatch.delenv(name, raising=False)
    saved = dict(os.environ)
    yield os.environ
    os.environ.clear()
    os.environ.update(saved)


def old_run(tmp_path, record: dict) -> rundir.RunDir:
    """A run directory as an older specrig left it: 0755, its run.json 0644 with the env values in it."""
    path = tmp_path / "runs" / "20261101-000000-abcd"
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps(record))
    (path / "code").mkdir()
    (path / "code" / "rpc.py").write_text("")
    for entry in (tmp_path / "runs", path, path / "code"):
        entry.chmod(0o755)
    for entry in (path / "run.json", path / "code" / "rpc.py"):
        entry.chmod(0o644)
    return rundir.RunDir(str(path))


def test_an_older_records_values_are_dropped_and_fill_only_what_the_call_lacks(tmp_path, environ):
    run = old_run(tmp_path, {"env": {"HF_TOKEN": "hf_old", "SPECRIG_TEST_OLD": "x"}, "env_keys": ["A"]})
    environ["HF_TOKEN"] = "hf_now"  # hosts.yaml's, sent with the resume call
    stored = launching.scrub_env(run)
    assert stored == {"HF_TOKEN": "hf_old", "SPECRIG_TEST_OLD": "x"}
    text = (tmp_path / "runs" / run.run_id / "run.json").read_text()
    assert "hf_old" not in text and json.loads(text)["env_keys"] == ["A", "HF_TOKEN", "SPECRIG_TEST_OLD"]
    assert stat.S_IMODE(os.stat(run.file("run.json")).st_mode) == 0o600
    launching.resumed_environment(run.record, stored)
    assert environ["HF_TOKEN"] == "hf_now" and environ["SPECRIG_TEST_OLD"] == "x"
    assert launching.scrub_env(run) == {}, "scrubbed once"


def test_a_node_gets_its_address_for_vllm_again_at_resume(environ):
    record = {"nodes": {"node_rank": 1, "addresses": ["10.0.0.1", "10.0.0.2"]}, "env_keys": ["VLLM_HOST_IP"]}
    launching.resumed_environment(record, {})
    assert environ["VLLM_HOST_IP"] == "10.0.0.2"


def test_make_private_closes_what_an_older_specrig_left_open(tmp_path):
    run = old_run(tmp_path, {})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not the run's")
    elsewhere.chmod(0o644)
    os.symlink(elsewhere, run.file("link"))
    rundir.make_private(run.path)
    modes = {os.path.relpath(os.path.join(d, n), run.path): stat.S_IMODE(os.lstat(os.path.join(d, n)).st_mode)
             for d, subdirectories, names in os.walk(run.path) for n in subdirectories + names if n != "link"}
    assert modes == {"run.json": 0o600, "code": 0o700, os.path.join("code", "rpc.py"): 0o600}
    assert stat.S_IMODE(os.stat(run.path).st_mode) == 0o700
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o644, "a link's target is not the run's"


def test_a_launchs_env_goes_into_the_environment_and_only_its_names_are_returned(environ):
    assert launching.job_environment({"HF_TOKEN": "hf_x", "N": 2}) == ["HF_TOKEN", "N"]
    assert environ["HF_TOKEN"] == "hf_x" and environ["N"] == "2"
