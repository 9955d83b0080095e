"""A full disk under server mode's connector (issue 17): the cause is read from the server's log, where
it is, and the run fails once instead of restarting into the same failure.

Tried as a new user would, with `--skip-preflight` (the preflight would have refused the space): the
output on a 2 MiB tmpfs. vLLM's connector fails its writes with ENOSPC ("Hidden-states write failed …
No space left on device (os error 28)"); speculators' client sees only missing files, skips samples and
gives up. Before, specrig called that an unknown client failure and restarted it, which on a real host
repeats an 18-minute load to fail again.
"""
from __future__ import annotations

import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from run.server import outputs, prepared
from support.lab import inv, inv_json, wait_for
from support.patchenv import as_lab_user
from support.runnable_env import HOME, runnable_env_or_skip  # noqa: F401 (runnable)
from support.server_lab import run_files

HOST = "lab-server"
RUNS = HOME / "specrig-work" / "runs"


@pytest.fixture
def tiny_output():
    """A 2 MiB tmpfs the lab user owns, in its own work directory (pytest's are root's alone): room for a
    dozen of the tiny model's files, not for 24."""
    mount = HOME / "specrig-work" / "out" / f"tiny-{uuid.uuid4().hex[:8]}"
    as_lab_user("mkdir", "-p", str(mount))
    owner = subprocess.run(["id", "-u", "specrig"], capture_output=True, text=True).stdout.strip()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=2m,uid={owner},mode=700", "tmpfs", str(mount)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)
    mount.rmdir()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_full_disk_under_the_connector_fails_once_named_from_the_servers_log(lab, tiny_output: Path):
    applied = inv("apply-patches", "--host", HOST, timeout=300)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    out = tiny_output / "out"
    code, launched = inv_json("extract", "--host", HOST, "--out", str(out), "--port", str(_free_port()),
                              "--max-samples", "24", "--concurrency", "4", "--skip-preflight", timeout=300)
    assert code == 0 and launched["launched"], launched
    run_id = launched["run_id"]
    try:
        run = wait_for("the run's end", lambda: (lambda r: r if r.get("state") in ("succeeded", "failed", "stopped")
                                                  else None)(run_files(RUNS / run_id)), timeout=900, interval=0.5)
    finally:
        inv("stop", "--host", HOST, "--run", run_id, timeout=300)
    code, status = inv_json("status", "--host", HOST, "--run", run_id)
    run = status["runs"][0]
    assert run["state"] == "failed", run
    assert len(run["attempts"]) == 1, run["attempts"]  # not restarted into the same failure
    failure = run["attempts"][0]["failure"]
    assert failure["kind"] == "disk-full" and failure["rule"] == "disk-full-connector", failure
    assert failure["role"] == "server" and not failure["retryable"] and not failure["restarted"], failure
    assert "No space left on device" in failure["evidence"] and "generate-offline-data" in failure["explain"], failure
    assert "inv resume" in failure["advice"] and "--out" in failure["advice"], failure
    # Every file that is there is whole: what a resume after freeing space keeps.
    present = outputs.existing_indices(str(out))
    assert present, "no file was written before the disk filled"
    report = outputs.check_dataset(str(out), None, indices=present, n_layers=4, hidden_size=128)
    assert report["complete"], report["files"]


def test_the_preflight_refuses_an_output_too_small_for_the_share_naming_need_and_free(lab, tiny_output: Path):
    """The same 2 MiB output without --skip-preflight: refused before anything starts, need against free
    named with the fix; every file already there intact."""
    out = tiny_output / "out"
    as_lab_user("mkdir", "-p", str(out))
    as_lab_user("sh", "-c", f"echo 'an earlier run' > {out}/kept.txt")
    before = sorted(p.name for p in RUNS.iterdir())
    code, found = inv_json("extract", "--host", HOST, "--out", str(out), "--port", str(_free_port()),
                           "--max-samples", "24", timeout=300)
    assert code == 1 and found.get("launched") is not True, found
    disk = next(c for c in found["preflight"] if c["name"] == "disk")
    assert not disk["ok"], found["preflight"]
    # 4 layers x hidden 128 x bf16's 2 bytes a token; the tokens estimated from the dataset
    assert disk["detail"].startswith(f"2.0 MiB free at {out}; the whole dataset (24 samples, 1024 B/token x "), disk
    assert disk["advice"].startswith("free ") and f"at {out}, or choose an --out with room for it" in disk["advice"]
    locks = next(c for c in found["preflight"] if c["name"] == "staging-locks")
    assert locks["ok"] and locks["detail"] == (f"{out}/.specrig-staging on tmpfs (tmpfs on {tiny_output}): flock "
                                               "exclusive, then shared, each at once; enforced"), locks
    assert sorted(p.name for p in RUNS.iterdir()) == before  # nothing launched
    assert sorted(p.name for p in out.iterdir()) == ["kept.txt"] and (out / "kept.txt").read_text() == "an earlier run\n"


def test_a_resume_into_a_disk_too_small_for_the_missing_files_is_refused_with_the_real_figures(lab,
                                                                                                tiny_output: Path):
    """The run the first test makes (2 MiB, 24 samples, --skip-preflight) ended by its full disk: `inv resume`
    sizes the files still missing from the prepared data's real token counts and refuses, need against free
    named with the fix; the run, its files and the output's earlier file stay as they were."""
    applied = inv("apply-patches", "--host", HOST, timeout=300)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    out = tiny_output / "out"
    as_lab_user("mkdir", "-p", str(out))
    as_lab_user("sh", "-c", f"echo 'an earlier run' > {out}/kept.txt")
    code, launched = inv_json("extract", "--host", HOST, "--out", str(out), "--port", str(_free_port()),
                              "--max-samples", "24", "--concurrency", "4", "--skip-preflight", timeout=300)
    assert code == 0 and launched["launched"], launched
    run_id = launched["run_id"]
    try:
        wait_for("the run's end", lambda: run_files(RUNS / run_id).get("state") in ("succeeded", "failed", "stopped"),
                 timeout=900, interval=0.5)
    finally:
        inv("stop", "--host", HOST, "--run", run_id, timeout=300)
    before = {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}
    status_before = (RUNS / run_id / "status.json").read_bytes()
    counts = prepared.token_counts(RUNS / run_id / "prepared")
    missing = [i for i in range(24) if i not in outputs.existing_indices(str(out))]
    assert len(counts) >= 24 and missing, (len(counts), missing)

    resumed = inv("resume", "--host", HOST, "--run", run_id, timeout=300)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    said = " ".join(resumed.stderr.split())
    tokens = sum(counts[i] for i in missing)
    assert f"{HOST}: run {run_id}: " in said and f" free at {out}; the {len(missing)} missing sample(s) of its 24 " \
        f"(1024 B/token x {tokens} tokens, the prepared data's own) needs about " in said, said
    assert f"at {out}, then resume again; or start a new run with an --out that has room" in said, said
    assert (RUNS / run_id / "status.json").read_bytes() == status_before  # no attempt, no server
    assert {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()} == before
    assert before["kept.txt"] == b"an earlier run\n"
