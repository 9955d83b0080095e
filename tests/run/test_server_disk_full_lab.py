"""A disk that runs low under server mode's connector (issue 17): the run stops before it fills, every
file it keeps whole, and says so in one line that a resume repeats until there is room.

Tried as a new user would, with `--skip-preflight` (the preflight sizes the disk before): the output on a
tmpfs with room for the free-space margin's floor and about a dozen of the tiny model's files; the run
asks for SAMPLES, which the whole tmpfs holds (the attempt's own sizing from the prepared data's real
token counts passes) but not beside the margin the watch keeps.
Before the watch, vLLM's connector failed its writes with ENOSPC ("Hidden-states write failed … No space
left on device (os error 28)"), speculators' client skipped those samples and gave up, and specrig
advised `inv resume` or `allow_skipped: true`, which would repeat the failure or hide it. Now the
supervisor watches the free space of the output and the staging directory (remote/run/disk_watch.py) and
ends the attempt first. Should a write fail anyway, the server's log names it (disk-full-connector, unit
tests in test_server_supervision.py) and the low disk still decides the run's failure. A resume sizes the
files still missing from the prepared data's real token counts and is refused, need against free, until
there is room; the preflight sizes the share before a launch the same way, from an estimate.
"""
from __future__ import annotations

import re
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from base import outputs, prepared
from base.contract import DISK_LOW, FAILED, FINAL_STATES
from base.units import human_bytes
from run import disk_watch
from support.lab import inv, inv_json, phase, wait_for
from support.patchenv import as_lab_user
from support.runnable_env import HOME, runnable_env_or_skip  # noqa: F401 (runnable)
from support.server_lab import run_files
from support.shared_envs import ensure_patched

HOST = "lab-server"
RUNS = HOME / "specrig-work" / "runs"
#: Room beyond the margin's floor: about a dozen of the tiny model's files (100-270 KiB each).
ROOM_MIB = 2
#: Samples asked for: about 10 MiB of files, within the whole tmpfs (the attempt sizes its share from
#: the real token counts and starts), and many more than the room beside the margin holds (the client
#: lands 20 a second here: the watch has seconds to see it).
SAMPLES = 70
#: Asked for by the preflight test: beyond the whole tmpfs (the lab's dataset, 96 samples, is 29 MiB).
TOO_MANY = 160
#: The free-space margin's floor, as the run's messages write it.
FLOOR = human_bytes(disk_watch.FLOOR_BYTES)


@pytest.fixture
def small_output():
    """A tmpfs the lab user owns, in its own work directory (pytest's are root's alone), of the margin's
    floor and ROOM_MIB more."""
    mount = HOME / "specrig-work" / "out" / f"small-{uuid.uuid4().hex[:8]}"
    as_lab_user("mkdir", "-p", str(mount))
    owner = subprocess.run(["id", "-u", "specrig"], capture_output=True, text=True).stdout.strip()
    size = disk_watch.FLOOR_BYTES // 2**20 + ROOM_MIB
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}m,uid={owner},mode=700", "tmpfs",
                              str(mount)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)
    mount.rmdir()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_disk_running_low_stops_the_run_before_it_fills_keeping_whole_files_and_a_resume_is_refused(
        lab, small_output: Path):
    ensure_patched(HOST)
    out = small_output / "out"
    code, launched = inv_json("extract", "--host", HOST, "--out", str(out), "--port", str(_free_port()),
                              "--max-samples", str(SAMPLES), "--concurrency", "4", "--skip-preflight", timeout=300)
    assert code == 0 and launched["launched"], launched
    run_id = launched["run_id"]
    try:
        wait_for("the run's end", lambda: (lambda r: r if r.get("state") in FINAL_STATES
                                           else None)(run_files(RUNS / run_id)), timeout=900, interval=0.5)
    finally:
        inv("stop", "--host", HOST, "--run", run_id, timeout=300)

    with phase("the run stopped on the low disk, once"):
        code, status = inv_json("status", "--host", HOST, "--run", run_id)
        run = status["runs"][0]
        assert run["state"] == FAILED and len(run["attempts"]) == 1, run
        failure = run["attempts"][0]["failure"]
        assert failure["kind"] == DISK_LOW and not failure["retryable"] and not failure["restarted"], failure
        line = failure["explain"]
        assert line.startswith("disk low: ") and f" free on {out}" in line and f", need about {FLOOR}" in line, line
        assert "--out" in failure["advice"] and "inv resume" in failure["advice"], failure
        server_log = (RUNS / run_id / "server.log").read_text(errors="replace")
        assert "No space left on device" not in server_log, server_log[-4000:]
    with phase("every file there is whole, and the run stopped mid-way"):
        present = outputs.existing_indices(str(out))
        assert 0 < len(present) < SAMPLES, present
        report = outputs.check_dataset(str(out), None, indices=present, n_layers=4, hidden_size=128)
        assert report["complete"], report["files"]
        assert disk_watch.free_bytes(str(out)) > 0
    with phase("status says it in plain words"):
        shown = inv("status", "--host", HOST, "--run", run_id, env={"COLUMNS": "200"})
        assert "disk low: " in shown.stdout and f"free on {out}" in shown.stdout, shown.stdout
    with phase("a resume sizes the missing files from the prepared data and is refused, nothing changed"):
        # Someone else's file takes most of what is left: the missing files no longer fit.
        as_lab_user("dd", "if=/dev/zero", f"of={small_output}/other.bin", "bs=1M",
                    f"count={disk_watch.free_bytes(str(small_output)) // 2**20 - 1}", "status=none")
        before = {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}
        status_before = (RUNS / run_id / "status.json").read_bytes()
        counts = prepared.token_counts(RUNS / run_id / "prepared")
        missing = [i for i in range(SAMPLES) if i not in present]
        assert len(counts) >= SAMPLES, len(counts)
        resumed = inv("resume", "--host", HOST, "--run", run_id, "--detach", timeout=300)
        assert resumed.returncode == 1, resumed.stdout + resumed.stderr
        said = " ".join(resumed.stderr.split())
        tokens = sum(counts[i] for i in missing)
        assert f"{HOST}: run {run_id}: " in said and f" free at {out}; the {len(missing)} missing sample(s) of its " \
            f"{SAMPLES} (1024 B/token x {tokens} tokens, the prepared data's own) needs about " in said, said
        assert f"at {out}, then resume again; or start a new run with an --out that has room" in said, said
        assert (RUNS / run_id / "status.json").read_bytes() == status_before  # no attempt, no server
        assert {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()} == before


def test_the_preflight_refuses_an_output_too_small_for_the_share_naming_need_and_free(lab, small_output: Path):
    """The same small output without --skip-preflight: refused before anything starts, need against free
    named with the fix; every file already there intact."""
    out = small_output / "out"
    as_lab_user("mkdir", "-p", str(out))
    as_lab_user("sh", "-c", f"echo 'an earlier run' > {out}/kept.txt")
    before = sorted(p.name for p in RUNS.iterdir())
    code, found = inv_json("extract", "--host", HOST, "--out", str(out), "--port", str(_free_port()),
                           "--max-samples", str(TOO_MANY), timeout=300)
    assert code == 1 and found.get("launched") is not True, found
    disk = next(c for c in found["preflight"] if c["name"] == "disk")
    assert not disk["ok"], found["preflight"]
    # 4 layers x hidden 128 x bf16's 2 bytes a token; the tokens estimated from the dataset
    # (the dataset's samples, up to TOO_MANY: the lab's dataset holds fewer)
    assert re.search(rf" free at {re.escape(str(out))}; the whole dataset \(\d+ samples, 1024 B/token x ",
                     disk["detail"]), disk
    assert disk["advice"].startswith("free ") and f"at {out}, or choose an --out with room for it" in disk["advice"]
    locks = next(c for c in found["preflight"] if c["name"] == "staging-locks")
    assert locks["ok"] and locks["detail"] == (f"{out}/.specrig-staging on tmpfs (tmpfs on {small_output}): flock "
                                               "exclusive, then shared, each at once; enforced"), locks
    assert sorted(p.name for p in RUNS.iterdir()) == before  # nothing launched
    assert sorted(p.name for p in out.iterdir()) == ["kept.txt"] and (out / "kept.txt").read_text() == "an earlier run\n"
