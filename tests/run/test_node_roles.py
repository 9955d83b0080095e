"""remote/run/server/node_roles.py's worker against a real head beacon on loopback: how a worker's run
ends when the head's run ends. The whole multi-node job runs on the lab (tests/fleet/test_multinode_lab.py, and
tests/lab/test_lab_slurm_multinode.py in one Slurm allocation)."""
from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from contract import RUNNING, SUCCEEDED
from run.attempt import AttemptEnds
from run.server.node_roles import Beacon, Worker

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
