"""The free-space margin of a run (remote/run/disk_watch.py), and what the supervisor makes of a low disk
(remote/run/supervisor_loop.py), on real directories. The watch on a real run that fills a small disk:
test_supervisor.py (in-process) and test_server_disk_full_lab.py (server mode)."""
from __future__ import annotations

import json
import re

from base import rundir
from base.contract import DISK_LOW, FAILED, SUPERVISOR_DEFAULTS
from run import disk_watch
from run.attempt import found_failure
from run.in_process import InProcessDriver
from run.supervisor_loop import Supervisor

SAMPLE = re.compile(r"hs_\d+\.safetensors")
PIB = 2**50


def test_the_margin_is_the_files_in_flight_never_less_than_the_floor_and_nothing_once_none_is_left():
    assert disk_watch.margin(None, 64) == disk_watch.FLOOR_BYTES  # no file yet, no guess
    assert disk_watch.margin(2**20, 8) == disk_watch.FLOOR_BYTES
    assert disk_watch.margin(64 * 2**20, 8) == 512 * 2**20
    assert disk_watch.margin(64 * 2**20, 0) == 0


def test_the_largest_file_so_far_replaces_the_guess(tmp_path):
    watch = disk_watch.DiskWatch(directories=[tmp_path, tmp_path], out=tmp_path, sample_file=SAMPLE,
                                 file_bytes=10 * 2**20, in_flight=100, remaining=lambda: None)
    assert watch.directories == [tmp_path]  # the output and the staging directory on one path: looked at once
    assert watch.need() == 1000 * 2**20  # the guess, before any file
    (tmp_path / "hs_0.safetensors").write_bytes(b"x" * 2**20)
    (tmp_path / "hs_1.safetensors").write_bytes(b"x" * 3 * 2**20)
    (tmp_path / "other.bin").write_bytes(b"x" * 9 * 2**20)  # not a sample
    watch.measure()
    assert watch.need() == 300 * 2**20


def test_low_names_the_directory_and_the_figures_in_one_line(tmp_path):
    roomy = disk_watch.DiskWatch(directories=[tmp_path / "not-made-yet", tmp_path], out=tmp_path,
                                 sample_file=SAMPLE, file_bytes=None, in_flight=1, remaining=lambda: None)
    assert roomy.low() is None  # the floor alone: this disk has more
    left = [None]
    full = disk_watch.DiskWatch(directories=[tmp_path], out=tmp_path, sample_file=SAMPLE, file_bytes=PIB,
                                in_flight=3, remaining=lambda: left[0])
    low = full.low()
    assert low["path"] == tmp_path and low["need"] == 3 * PIB and low["free"] == disk_watch.free_bytes(tmp_path)
    assert re.fullmatch(rf"disk low: [\d.]+ \w+ free on {tmp_path}, need about 3\.0 PiB", low["line"]), low
    left[0] = 2  # fewer files left than may be in flight: the margin of those
    assert full.low()["need"] == 2 * PIB
    left[0] = 0  # the last file is written: the run has finished, not run low
    assert full.low() is None


def supervisor(tmp_path) -> Supervisor:
    """The supervisor of an in-process run whose output is `tmp_path / "out"` (nothing started)."""
    run = rundir.RunDir(str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps({
        "run_id": "r1", "out": str(tmp_path / "out"), "options": SUPERVISOR_DEFAULTS, "python": "python",
        "driver_args": {"output_dir": str(tmp_path / "out")}}))
    return Supervisor(run, InProcessDriver)


def test_a_failure_on_a_low_disk_is_the_low_disk_and_not_restarted(tmp_path):
    sup = supervisor(tmp_path)
    entry = {"attempt": 1, "samples_written": 3}
    full = found_failure("disk-full", "the output disk is full: /out: 12 KiB free", "free space", False,
                         evidence="extract_driver: disk full: /out: 12 KiB free")
    assert sup.judge(dict(entry), 1, dict(full))["failure"]["kind"] == "disk-full"  # room enough: as classified
    sup.disk.file_bytes = PIB
    (tmp_path / "out").mkdir()
    outcome = sup.judge(dict(entry), 1, dict(full))
    failure = outcome["failure"]
    assert outcome["state"] == FAILED and failure["kind"] == DISK_LOW and not failure["restarted"], failure
    assert failure["explain"].startswith("disk low: ") and failure["evidence"] == "disk-full: " + full["evidence"]
    crashed = found_failure("crashed", "the driver crashed with SIGSEGV", "see the log", True)
    assert sup.judge(dict(entry), -11, dict(crashed))["failure"]["kind"] == DISK_LOW  # a restart meets the same disk
    # Every sample of the share written: whatever failed after, the room left is no cause.
    (tmp_path / "run" / "heartbeat.json").write_text(json.dumps({"phase": "extracting", "samples_total": 2}))
    for index in range(2):
        (tmp_path / "out" / f"data_{index}.pt").write_bytes(b"sample")
    judged = dict(entry)
    assert sup.judge(judged, -11, dict(crashed)) == {"state": "retry"} and judged["failure"]["kind"] == "crashed"
