"""remote/run/server/node_roles.py's roles against real beacons on loopback: how a worker's run ends when the
head's run ends; how the head judges an attempt that failed while a worker was gone, with its real supervisor
(supervisor_loop.py) and a real failing driver (tests/programs/job_tree.py). The whole multi-node job runs on
the lab (tests/fleet/test_multinode_lab.py, and tests/lab/test_lab_slurm_multinode.py in one Slurm allocation)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from base import atomic
from base.contract import RUNNING, SUCCEEDED, SUPERVISOR_DEFAULTS
from base.rundir import RunDir
from run.attempt import AttemptEnds
from run.in_process import InProcessDriver
from run.server.health import SERVER_EXITED, SERVER_RUNNING
from run.server.node_roles import Beacon, Head, Worker
from run.supervisor_loop import Supervisor
from support.paths import PROGRAMS, REPO

JOB = "20261202-000000-abcd"


def free_port_pair() -> int:
    """A port p with p and p + 1 free: the job's watch port, where node 0 and node 1 answer."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with socket.socket() as second:
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


@pytest.fixture
def head_and_worker():
    watch_port = free_port_pair()
    nodes = {"job_id": JOB, "node_rank": 1, "role": "worker", "nnodes": 2, "hosts": ["node-a", "node-b"],
             "addresses": ["127.0.0.1", "127.0.0.1"], "watch_port": watch_port}
    supervisor = SimpleNamespace(record={"nodes": nodes}, status={"state": RUNNING, "attempts": []},
                                 options={"load_timeout_s": 60}, markers=[], stop_requested=lambda: False)
    supervisor.log_marker = supervisor.markers.append
    head = Beacon("127.0.0.1", watch_port, {"job_id": JOB, "node_rank": 0, "role": "head", "state": RUNNING,
                                            "attempt": 1})
    try:
        yield head, Worker(supervisor)
    finally:
        head.close()


def test_a_worker_that_saw_the_head_succeed_ends_succeeded_though_the_head_has_stopped_answering(head_and_worker):
    """Ending the worker's server can outlast the head's linger on a loaded host (it did on CI, in a Slurm
    allocation): the head's final state seen during the attempt decides, not a head gone quiet."""
    head, worker = head_and_worker
    worker.served = 1
    worker.look()  # the head's attempt 1 runs: the worker serves on
    head.update(state=SUCCEEDED)
    worker.last_look = 0.0
    with pytest.raises(AttemptEnds) as ended:
        worker.look()
    assert ended.value.failure is None
    head.close()
    assert worker.next_attempt() == {"state": SUCCEEDED}


def make_head(tmp_path, watch_port):
    """A head's real supervisor (supervisor_loop.Supervisor, role Head) whose workload fails within a second:
    tests/programs/job_tree.py as the in-process driver, raising after its first sample (a traceback in the
    log, as the head's server or client prints when a worker dies under it)."""
    run = RunDir(str(tmp_path / "run"))
    os.makedirs(run.path)
    out = tmp_path / "out"
    nodes = {"job_id": JOB, "node_rank": 0, "role": "head", "nnodes": 2, "hosts": ["node-a", "node-b"],
             "addresses": ["127.0.0.1", "127.0.0.1"], "watch_port": watch_port}
    atomic.write_json(run.file("run.json"), {
        "host": "local", "python": sys.executable, "driver_program": str(PROGRAMS / "job_tree.py"), "out": str(out),
        "driver_args": {"output_dir": str(out)}, "nodes": nodes, "options": dict(SUPERVISOR_DEFAULTS, grace_s=1)})
    atomic.write_json(run.file("driver-args.json"), {"heartbeat": run.file("heartbeat.json"), "children": 0,
                                                     "fail_after": 1, "output_dir": str(out)})
    supervisor = Supervisor(run, InProcessDriver, Head)
    assert supervisor.role.open() is None
    return supervisor


def first_attempt(supervisor):
    """The head's attempt 1, run and judged by the supervisor's loop; its record."""
    try:
        supervisor.save()
        assert supervisor.role.next_attempt() is None
        supervisor.attempt()
        return supervisor.status["attempts"][0]
    finally:
        supervisor.role.node.beacon.close()


WORKER_BEACON = """
import sys, time
sys.path.insert(0, sys.argv[1])
from run.server.node_roles import Beacon
Beacon("127.0.0.1", int(sys.argv[2]), {"job_id": sys.argv[3], "node_rank": 1, "role": "worker", "state": "running",
                                         "serving": 1, "server": sys.argv[4]})
print("answering", flush=True)
time.sleep(600)
"""


def test_a_worker_killed_before_the_heads_watch_missed_it_makes_the_heads_failure_node_lost(tmp_path):
    """The race of a Slurm worker step killed (CI, docs/benchmarks.md): the head's own processes fail
    within a second, a traceback in the log, before its watch has missed MISSES answers. The fresh look
    before judging finds the worker gone: node-lost, restarted, the head's own failure kept as evidence."""
    watch_port = free_port_pair()
    worker = subprocess.Popen([sys.executable, "-c", WORKER_BEACON, str(REPO / "remote"), str(watch_port + 1), JOB,
                               SERVER_RUNNING],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline() == "answering\n"
        supervisor = make_head(tmp_path, watch_port)

        def kill_once_served():  # the step killed once the head saw its worker serve attempt 1
            while not supervisor.role.workers.get(1, {}).get("served"):
                time.sleep(0.01)
            worker.kill()
        killer = threading.Thread(target=kill_once_served, daemon=True)
        killer.start()
        entry = first_attempt(supervisor)
    finally:
        worker.kill()
        worker.wait()
    failure = entry["failure"]
    assert failure["kind"] == "node-lost" and failure["restarted"], failure
    assert failure["explain"] == "node 1 (node-b, 127.0.0.1): its supervisor stopped answering at 127.0.0.1:%d" \
        % (watch_port + 1)
    assert failure["head_failure"]["kind"] == "unknown", failure
    assert "RuntimeError: failed (pid" in failure["evidence"] and "RuntimeError" in failure["head_failure"]["evidence"]
    log = Path(supervisor.run.file("driver.log")).read_text()
    assert "the head's attempt failed with it (unknown)" in log and "attempt 1: node-lost" in log


def test_a_heads_failure_while_every_worker_still_serves_is_its_own(tmp_path):
    watch_port = free_port_pair()
    worker = Beacon("127.0.0.1", watch_port + 1, {"job_id": JOB, "node_rank": 1, "role": "worker", "state": RUNNING,
                                                   "serving": 1, "server": SERVER_RUNNING})
    try:
        entry = first_attempt(make_head(tmp_path, watch_port))
    finally:
        worker.close()
    failure = entry["failure"]
    assert failure["kind"] == "unknown" and failure["restarted"], failure
    assert failure["evidence"].startswith("RuntimeError: failed (pid"), failure


def test_a_worker_whose_server_exits_ends_the_heads_attempt_at_its_next_look(tmp_path):
    watch_port = free_port_pair()
    worker = Beacon("127.0.0.1", watch_port + 1, {"job_id": JOB, "node_rank": 1, "role": "worker", "state": RUNNING,
                                                   "serving": 1, "server": SERVER_RUNNING})
    supervisor = make_head(tmp_path, watch_port)
    head = supervisor.role
    try:
        supervisor.status["attempts"].append({"attempt": 1})
        assert head.next_attempt() is None
        head.look()  # it serves attempt 1
        worker.update(server=SERVER_EXITED, failure={"kind": "killed", "explain": "the vLLM server was killed by SIGKILL"})
        head.last_look = 0.0
        with pytest.raises(AttemptEnds) as ended:
            head.look()
    finally:
        worker.close()
        head.node.beacon.close()
    failure = ended.value.failure
    assert (failure["kind"], failure["retryable"], failure["evidence"]) == ("node-lost", True, "node 1: killed")
    assert failure["explain"] == "node 1 (node-b, 127.0.0.1): the vLLM server was killed by SIGKILL"
