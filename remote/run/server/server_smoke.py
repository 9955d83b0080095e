"""`inv smoke` in server mode (speculators >= 0.8), stdlib only: run/smoke.py calls run() when the
host's speculators takes server mode.

The same run as `inv extract` (the plan of server/plan.py, the supervisor program with
server/workload.py, the same server command and CLI steps), waited for, with the in-process smoke's
differences: the model's config shrunk through `--hf-overrides`, random weights (`--load-format
dummy`), a few built-in conversations, no restart, and a run directory that is removed afterwards.
"""
import os
import signal
import socket
import subprocess
import sys
import time

from base import atomic, contract, pkgmeta, rundir
from base.failure import RemoteFailure
from run.server import plan

SUPERVISOR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "supervisor.py")
#: What the supervisor may take to end its jobs when the smoke's time is up.
STOP_GRACE_S = 30


def free_port():
    """A port nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(smoke, *, model, config, samples, work, timeout_s, server_python, host=None, settings=None):
    """Extract `samples` rows through the server on the shrunk model, with `settings` of `inv extract`'s
    (storage, enforce_eager; the defaults' otherwise); `smoke` is run/smoke.py (the conversations, the
    shrinking, the naming of failures)."""
    dataset = smoke.write_conversations(work)
    overrides = smoke.shrunk_overrides(config)
    run_dir = rundir.RunDir(os.path.join(work, "run"))
    os.makedirs(run_dir.path)
    driver_args = {"model": model, "dataset": dataset, "output_dir": os.path.join(work, "out"),
                   "max_length": smoke.MAX_LENGTH, "max_samples": samples, "load_format": "dummy",
                   "hf_overrides": overrides, "port": free_port(), "concurrency": 2, **(settings or {})}
    try:
        made = plan.make(run_dir.path, "smoke", driver_args, client_python=sys.executable,
                         server_python=server_python)
    except plan.PlanError as exc:
        raise RemoteFailure("bad-argument", str(exc)) from None
    atomic.write_json(run_dir.file("run.json"), {
        "run_id": "smoke", "created_at": rundir.now_iso(), "host": host, "python": sys.executable,
        "out": driver_args["output_dir"], "driver_args": driver_args, "env": {}, "server": made,
        "server_python": server_python,
        "options": {"max_restarts": 0, "backoff_s": 0.0, "backoff_max_s": 0.0, "stall_timeout_s": timeout_s,
                    "load_timeout_s": timeout_s, "stall_restart": False, "grace_s": 10.0,
                    "telemetry_interval_s": 5.0}})
    started = time.monotonic()
    with open(run_dir.file("supervisor.log"), "ab") as log:
        supervisor = subprocess.Popen([sys.executable, SUPERVISOR, run_dir.path], stdin=subprocess.DEVNULL,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        supervisor.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        supervisor.send_signal(signal.SIGTERM)  # it ends the server and the client, then exits
        try:
            supervisor.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
        raise RemoteFailure("timeout", "the smoke run did not finish within %.0f s" % timeout_s) from None
    elapsed = round(time.monotonic() - started, 1)
    ended = run_dir.exit_record or {}
    shrunk = dict((k, v) for k, v in overrides.items() if not isinstance(v, (dict, list)))
    if ended.get("state") != contract.SUCCEEDED:
        message, failure = _failure(smoke, run_dir, ended)
        raise RemoteFailure("smoke-failed", message, failure=failure, elapsed_s=elapsed, shrunk=shrunk)
    return {"ok": True, "mode": contract.SERVER, "model": model, "architectures": config.get("architectures"),
            "shrunk": shrunk, "samples": (ended.get("result") or {}).get("ok"), "layer_ids": made["layer_ids"],
            "storage": made["storage"], "connector": made["connector"],
            "tokens_per_s": None, "elapsed_s": elapsed,
            "versions": {"speculators": pkgmeta.versions(("speculators",))["speculators"],
                         "vllm": made["vllm_version"]}}


def _failure(smoke, run_dir, ended):
    """(message, failure) of a failed smoke run: the supervisor's classified failure, with the
    exception and the speculators line that raised it read from the failing process's log."""
    found = ended.get("failure") or {}
    log_name = "server.log" if found.get("role") == "server" else "driver.log"
    try:
        with open(run_dir.file(log_name), encoding="utf-8", errors="replace") as handle:
            log_text = handle.read()[-512 * 1024:]
    except OSError:
        log_text = ""
    failure = smoke.name_failure(log_text, found.get("exit_status"))
    failure.update(kind=found.get("kind") or failure["kind"], explain=found.get("explain") or failure["explain"],
                   role=found.get("role"), advice=found.get("advice"))
    return smoke.failure_message(failure), failure
