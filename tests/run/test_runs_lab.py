"""Supervised runs on the lab host, through the real CLI over real SSH, with the real driver.

lab-cpu runs speculators' extraction through vLLM on the CPU (skipped when `inv lab.up --runnable`
has not built it); lab is the analysis-only venv, where the driver fails for real (no torch).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from base.contract import ACTIVE_STATES, FAILED, OUTPUT_UNWRITABLE, RUNNING, STOPPED, SUCCEEDED
from support.lab import inv, launch_failing_run, phase, wait_for
from support.patchenv import as_lab_user, lab_home
from support.paths import REPO
from support.runnable_env import patch, private_clean_copy, remove_copy, runnable_env_or_skip
from support.server_lab import CLIENT

RUN_TIMEOUT_S = 600
#: Copies of the tiny chat dataset: enough samples that a run is still going when the tests act on it.
DATA_COPIES = 2


@pytest.fixture(scope="module")
def runnable(lab):
    env = runnable_env_or_skip(lab)
    patch(env, "apply")
    return env


@pytest.fixture(scope="module")
def dataset(runnable):
    """A bigger dataset on the host (the tiny one, repeated), written by the lab user."""
    path = lab_home() / "specrig-work" / "test-data" / f"chat-x{DATA_COPIES}.jsonl"
    as_lab_user("mkdir", "-p", str(path.parent))
    as_lab_user("tee", str(path), input=runnable.data.read_text() * DATA_COPIES)
    return str(path)


@pytest.fixture
def out():
    """A fresh output directory on the host for one test, removed after it."""
    path = str(lab_home() / "specrig-work" / "test-out" / uuid.uuid4().hex[:12])
    yield path
    for run in status()["runs"]:
        if run["out"] == path and run["state"] in ACTIVE_STATES:
            inv("stop", "--host", "lab-cpu", "--run", run["run_id"], timeout=300)  # a test that failed midway
    as_lab_user("rm", "-rf", path)


def extract_args(dataset, out, *extra):
    return ("extract", "--host", "lab-cpu", "--data", dataset, "--out", out, "--batch-size", "1", "--max-len", "512",
            *extra)


def status(host="lab-cpu", run=None, inventory=None) -> dict:
    result = inv("status", "--host", host, "--json", *(("--run", run) if run else ()), inventory=inventory)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def run_writing(out, host="lab-cpu", inventory=None):
    runs = [r for r in status(host, inventory=inventory)["runs"] if r["out"] == out]
    return runs[-1] if runs else None


def extracting(out):
    """The run writing `out` once its status shows it extracting (None before)."""
    run = run_writing(out)
    return run if ((run or {}).get("heartbeat") or {}).get("phase") == "extracting" else None


@contextlib.contextmanager
def held_mid_extraction(out, at_least):
    """Hold the driver of the run writing `out` (SIGSTOP to its process group) once `at_least` samples
    are in `out`, and let it go on (SIGCONT) on leaving; yields the run's directory.

    The tiny model extracts the whole dataset in seconds, and faster on a faster machine, while one
    `inv status` takes about a second: unheld, the run can finish before a test acts on it. The lab
    host is this machine, so the files are watched directly, twenty times a second.
    """
    deadline = time.monotonic() + RUN_TIMEOUT_S
    runs_dir = lab_home() / "specrig-work" / "runs"
    while len(list(Path(out).glob("data_*.pt"))) < at_least:
        assert time.monotonic() < deadline, f"timed out after {RUN_TIMEOUT_S} s waiting for {at_least} samples in {out}"
        time.sleep(0.05)
    run_dir = max((record.parent for record in runs_dir.glob("*/run.json")
                   if json.loads(record.read_text())["out"] == out), key=lambda d: d.name)
    group = os.getpgid(json.loads((run_dir / "heartbeat.json").read_text())["pid"])
    os.killpg(group, signal.SIGSTOP)
    try:
        yield run_dir
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT)


def finished(run_id, host="lab-cpu", inventory=None):
    run = status(host, run_id, inventory)["runs"][0]
    return run if run["state"] not in ACTIVE_STATES else None


def session_members(session):
    """Processes of a session or process group, read from /proc (the lab host is this machine)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and session in (int(fields[2]), int(fields[3])):
                found.append(int(name))
    return found


def assert_every_sample_once(runnable, out, total):
    names = sorted(os.listdir(out))
    samples = sorted(n for n in names if n.startswith("data_") and n.endswith(".pt"))
    assert samples == sorted(f"data_{i}.pt" for i in range(total))
    assert not [n for n in names if ".tmp." in n], names
    report = runnable.run_program("hidden_states_reference.py", out, str(runnable.model))
    assert report["samples"] == total and report["bad_shapes"] == [], report


def ssh_kill_9(pid):
    """kill -9 on the host, as its user, over SSH."""
    from specrig.inventory import load_inventory
    from specrig.transport import open_ssh
    from specrig.transport.quoting import command_line

    connection = open_ssh(load_inventory(REPO / "hosts.yaml").host("lab-cpu"))
    try:
        connection.run(command_line("kill", "-9", str(pid)), hide=True, in_stream=False)
    finally:
        connection.close()


# -- must hold ------------------------------------------------------------------------------------

def _tcp_sockets() -> list[tuple[int, int, str]]:
    """(local port, remote port, inode) of every IPv4 TCP socket on this machine."""
    rows = []
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        rows.append((int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16), fields[9]))
    return rows


def _pids_holding(inodes: set[str]) -> set[int]:
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if {f"socket:[{inode}]" for inode in inodes} & links:
            pids.add(int(pid))
    return pids


def sshd_serving(client_pid: int, port: int = 2222) -> set[int]:
    """The sshd processes at the far end of `client_pid`'s SSH connection to the lab."""
    sockets = _tcp_sockets()
    links = {os.readlink(f"/proc/{client_pid}/fd/{fd}") for fd in os.listdir(f"/proc/{client_pid}/fd")}
    client_ports = {local for local, remote, inode in sockets if remote == port and f"socket:[{inode}]" in links}
    assert client_ports, "the client holds no connection to the lab sshd"
    server_inodes = {inode for local, remote, inode in sockets if local == port and remote in client_ports}
    return _pids_holding(server_inodes) - {client_pid}


def interruptible() -> None:
    """Ctrl-C reaches the client as it reaches a user's: a suite started in the background by a
    non-interactive shell ignores SIGINT, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_client(client: subprocess.Popen) -> None:
    client.kill()


def kill_serving_sshd(client: subprocess.Popen) -> None:
    for pid in sshd_serving(client.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the privileged sshd and its session child: killing one may end the other first


@pytest.mark.parametrize("drop", [kill_client, kill_serving_sshd], ids=["client killed", "serving sshd killed"])
def test_dropping_the_ssh_connection_mid_run_does_not_stop_the_job(runnable, dataset, out, drop):
    """The attached `inv extract`'s SSH connection drops (its client or the sshd serving it is killed);
    the run goes on."""
    client = subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(REPO), *extract_args(dataset, out)],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with held_mid_extraction(out, 2):
            run = wait_for("the run to extract", lambda: extracting(out))
            drop(client)
        if drop is kill_serving_sshd:
            # The attached view loses its connection and says so; it does not stop the run.
            assert client.wait(timeout=60) != 0
            assert b"goes on" in client.stderr.read()
    finally:
        client.kill()
        client.wait()
    done_at_drop = run["heartbeat"]["samples_done"]
    # A new connection sees it progressing, then finishing.
    wait_for("progress after the drop",
             lambda: (status(run=run["run_id"])["runs"][0]["heartbeat"] or {}).get("samples_done", 0) > done_at_drop)
    final = wait_for("the run to finish", lambda: finished(run["run_id"]))
    assert final["state"] == SUCCEEDED, final
    assert len(final["attempts"]) == 1
    assert_every_sample_once(runnable, out, final["heartbeat"]["samples_total"])


def test_ctrl_c_detaches_stop_leaves_no_process_resume_completes_it_and_a_kill_9_of_the_driver_is_resumed(
        runnable, dataset, out):
    """One run through every phase (each attempt loads the model: one run, not two): Ctrl-C detaches the
    attached `inv extract`, `inv stop` leaves no process of it, `inv resume` carries it on; kill -9 of the
    resumed driver is recorded and the run restarted, to success with every sample exactly once."""
    client = subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(REPO), *extract_args(dataset, out)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=interruptible)
    try:
        with phase("Ctrl-C"), ThreadPoolExecutor(1) as pool, held_mid_extraction(out, 2) as run_dir:
            run = wait_for("the run to extract", lambda: extracting(out))
            client.send_signal(signal.SIGINT)
            shown, errors = client.communicate(timeout=60)
            assert status(run=run["run_id"])["runs"][0]["state"] == RUNNING
            assert len(session_members(run["driver_pgid"])) >= 2, "vLLM's worker should run beside the driver"
            # Let the driver go on only once the stop is under way, so that the run cannot finish first.
            stopping = pool.submit(inv, "stop", "--host", "lab-cpu", "--run", run["run_id"], "--json", timeout=300)
            wait_for("the stop to begin", lambda: (run_dir / "stop.request").exists(), interval=0.05)
    finally:
        client.kill()
    with phase("Ctrl-C"):
        assert client.returncode == 0, errors
        assert f"detached from run {run['run_id']}; it goes on" in shown

    with phase("stop"):
        stopped = stopping.result()
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        report = json.loads(stopped.stdout)
        assert report["clean"] and report["left"] == [] and report["state"] == STOPPED
        assert set(report["pids"]) >= {run["driver_pid"]}
        assert session_members(run["driver_pgid"]) == []
        assert status(run=run["run_id"])["runs"][0]["state"] == STOPPED
        kept = len(list(Path(out).glob("data_*.pt")))

    with phase("resume, then kill -9 of the resumed driver"):
        resumed = inv("resume", "--host", "lab-cpu", "--run", run["run_id"], "--detach")
        assert resumed.returncode == 0, resumed.stderr
        with held_mid_extraction(out, kept + 3):
            again = wait_for("the resumed run to extract", lambda: extracting(out))
            assert again["run_id"] == run["run_id"] and again["driver_pid"] != run["driver_pid"], again
            ssh_kill_9(again["driver_pid"])

    final = wait_for("the resumed run to finish", lambda: finished(run["run_id"]))
    with phase("the end"):
        assert final["state"] == SUCCEEDED, final
        stopped_attempt, killed, last = final["attempts"][0], final["attempts"][1], final["attempts"][-1]
        assert stopped_attempt["stopped"], stopped_attempt
        assert killed["exit_status"] == -9
        assert killed["failure"]["kind"] == "killed" and killed["failure"]["signal"] == "SIGKILL"
        assert killed["failure"]["retryable"] is True
        assert last["exit_status"] == 0 and len(final["attempts"]) == 3
        assert not session_members(killed["pid"]), "a process of the killed attempt is still alive"
        assert_every_sample_once(runnable, out, final["heartbeat"]["samples_total"])
        # The user sees the cause.
        shown = inv("status", "--host", "lab-cpu", "--run", run["run_id"])
        assert "killed" in shown.stdout and "SIGKILL" in shown.stdout


#: A run directory of the supervisor as it was before its rebuild (tests/fixtures/old_run/README.md).
OLD_RUN = REPO / "tests" / "fixtures" / "old_run" / "20261201-140105-emi6"


def test_a_run_directory_of_the_previous_supervisor_resumes_to_success(runnable):
    """Runs made by an older specrig resume on the current code: its run.json, status.json (attempts,
    history, job_seen) and exit.json are read as they were written."""
    record = json.loads((OLD_RUN / "run.json").read_text())
    run_dir, out = Path(record["workdir"].replace("~", str(lab_home()), 1)) / "runs" / OLD_RUN.name, record["out"]
    as_lab_user("rm", "-rf", str(run_dir), out)
    as_lab_user("mkdir", "-p", str(run_dir.parent))
    as_lab_user("cp", "-r", str(OLD_RUN), str(run_dir))
    try:
        assert status(run=OLD_RUN.name)["runs"][0]["state"] == STOPPED
        resumed = inv("resume", "--host", "lab-cpu", "--run", OLD_RUN.name, "--detach")
        assert resumed.returncode == 0, resumed.stderr
        final = wait_for("the old run to finish", lambda: finished(OLD_RUN.name))
        assert final["state"] == SUCCEEDED, final
        old, new = final["attempts"]
        assert old["stopped"] and old["samples_written"] == 8 and new["exit_status"] == 0
        assert [h["state"] for h in final["history"]] == [STOPPED, SUCCEEDED]
        assert_every_sample_once(runnable, out, final["heartbeat"]["samples_total"])
    finally:
        as_lab_user("rm", "-rf", str(run_dir), out)


@pytest.fixture
def clean_env(runnable, tmp_path):
    """An inventory whose lab-cpu runs a private unpatched copy of the runnable venv."""
    copy = private_clean_copy(runnable, tmp_path)
    yield copy.inventory
    remove_copy(copy)


def test_api_drift_is_shown_with_its_callee_and_advice_and_not_restarted(clean_env, dataset, out):
    refused = inv(*extract_args(dataset, out), inventory=clean_env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "verify-signatures" in refused.stdout and "nothing was launched" in refused.stderr
    assert run_writing(out, inventory=clean_env) is None

    launched = inv(*extract_args(dataset, out, "--skip-preflight", "--detach"), inventory=clean_env)
    assert launched.returncode == 0, launched.stderr
    run = wait_for("the run to start", lambda: run_writing(out, inventory=clean_env), interval=0.5)
    final = wait_for("the run to fail", lambda: finished(run["run_id"], inventory=clean_env))
    assert final["state"] == FAILED
    assert len(final["attempts"]) == 1, "drift repeats: the run must not be restarted"
    failure = final["last_failure"]
    assert failure["kind"] == "api-drift" and failure["retryable"] is False
    assert failure["callee"] and failure["callee"] in failure["explain"]
    assert "/speculators/" in failure["caller"]
    assert "inv apply-patches --host lab-cpu" in failure["advice"]
    shown = inv("status", "--host", "lab-cpu", "--run", run["run_id"], inventory=clean_env)
    assert "api-drift" in shown.stdout and "callee: " + failure["callee"] in shown.stdout
    assert "not restarted: it would repeat" in shown.stdout


def test_tp_2_on_a_cpu_host_with_one_numa_node_is_told_by_the_workers_traceback_and_not_restarted(
        runnable, dataset, out):
    """Every vLLM CPU worker fails at start-up (it binds to a NUMA node of its own, and the lab has
    one); the driver's exception only points at them and its log ends with resource_tracker warnings."""
    launched = inv(*extract_args(dataset, out, "--tp", "2", "--max-samples", "4", "--skip-preflight", "--detach"))
    assert launched.returncode == 0, launched.stderr
    run = wait_for("the run to start", lambda: run_writing(out), interval=0.5)
    final = wait_for("the run to fail", lambda: finished(run["run_id"]))
    assert final["state"] == FAILED and len(final["attempts"]) == 1, "the model must not be loaded again"
    failure = final["last_failure"]
    assert (failure["kind"], failure["rule"], failure["retryable"]) == ("bad-config", "cpu-numa-binding", False)
    assert failure["evidence"].startswith("AssertionError: Not enough allowed NUMA nodes to bind threads of 2")
    assert "VLLM_CPU_OMP_THREADS_BIND" in failure["advice"] and "lab-cpu" in failure["advice"]
    assert final["attempts"][0]["samples_written"] == 0


# -- the analysis-only lab venv: a real failure, no runnable environment needed -------------------

def test_a_failure_that_would_repeat_is_classified_and_not_restarted(lab):
    run_id = launch_failing_run()
    final = wait_for("the run to fail", lambda: finished(run_id, "lab"), timeout=120, interval=0.5)
    assert final["state"] == FAILED and len(final["attempts"]) == 1
    assert final["last_failure"]["kind"] == "missing-package" and final["last_failure"]["retryable"] is False
    logs = inv("logs", "--host", "lab", "--run", run_id, "-n", "5")
    assert logs.returncode == 0 and "not restarting" in logs.stdout


def test_preflight_lists_every_failed_check_and_launches_nothing(lab):
    result = inv("extract", "--host", "lab", "--model", "~/venv", "--data", "~/no-such.jsonl",
                 "--out", "~/specrig-work/test-out/never", "--json")
    assert result.returncode == 1
    checks = {c["name"]: c for c in json.loads(result.stdout)["preflight"]}
    assert not checks["packages"]["ok"] and "torch missing" in checks["packages"]["detail"]
    assert not checks["model"]["ok"] and not checks["dataset"]["ok"]
    assert not checks["reorder-hazard"]["ok"] and "--batch-size 4" in checks["reorder-hazard"]["advice"]
    assert all(c["advice"] for c in checks.values() if not c["ok"])
    assert json.loads(result.stdout)["launched"] is False


@pytest.mark.parametrize("argv, message", [
    (("extract", "--host", "lab", "--layers", "2,x"), "--layers '2,x'"),
    (("extract", "--host", "lab", "--model", "~/m", "--data", "d.jsonl", "--out", "o", "--batch-size", "0"),
     "--batch-size '0'"),
    (("extract", "--host", "lab"), "no --model given"),
    (("status", "--host", "lab", "--run", "no-such-run"), "no run 'no-such-run'"),
    (("logs", "--host", "lab", "-n", "0"), "-n 0"),
])
def test_bad_input_is_one_line_naming_the_value(lab, argv, message):
    result = inv(*argv)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("host, settings", [
    ("lab", ("--model", "~/venv", "--data", "sharegpt", "--batch-size", "4")),  # in-process
    ("lab-server", ("--max-samples", "4")),  # server mode: refused before its server starts
])
def test_an_unwritable_out_past_skip_preflight_fails_the_run_in_one_line_that_its_record_keeps(lab, host, settings):
    if host == "lab-server" and not (CLIENT / "bin" / "python").exists():
        pytest.skip("lab-server's environments are not built (inv lab.up --runnable)")
    out = "/root/specrig-unwritable/out"  # root's home: the lab user can make nothing there
    result = inv("extract", "--host", host, "--out", out, *settings, "--skip-preflight", "--detach", timeout=300)
    said = result.stderr.strip()
    assert result.returncode == 2 and len(said.splitlines()) == 1, result.stdout + result.stderr
    assert f"cannot write {out!r}: " in said and "Permission denied" in said and "--out" in said, said
    run_id = said.split(": run ", 1)[1].split(":", 1)[0]
    # The run is over, with the reason: no "starting" left for status to show.
    run = status(host, run_id)["runs"][0]
    assert run["state"] == FAILED and run["attempts"] == [], run
    assert run["last_failure"]["kind"] == OUTPUT_UNWRITABLE and out in run["last_failure"]["explain"], run
