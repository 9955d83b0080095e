"""Process-group mechanics of stop, on real processes (tests/programs/job_tree.py): children that
ignore SIGTERM, and children orphaned by a kill -9 of their parent, as vLLM's workers are."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import procs

JOB_TREE = Path(__file__).parent / "programs" / "job_tree.py"


@pytest.fixture
def job(tmp_path):
    """A parent in its own session with two children, child 0 ignoring SIGTERM; (parent, children pids)."""
    heartbeat = tmp_path / "heartbeat.json"
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"heartbeat": str(heartbeat), "children": 2, "ignore_term": True}))
    parent = subprocess.Popen([sys.executable, str(JOB_TREE), str(args)], stdin=subprocess.DEVNULL,
                              start_new_session=True)
    children_file = Path(str(heartbeat) + ".children")
    deadline = time.monotonic() + 30
    while not children_file.exists():
        assert time.monotonic() < deadline, "job_tree.py did not start its children"
        time.sleep(0.05)
    children = json.loads(children_file.read_text())
    yield parent, children
    procs.signal_job(parent.pid, signal.SIGKILL)
    parent.wait()


def test_members_are_the_parent_and_its_children(job):
    parent, children = job
    assert {m["pid"] for m in procs.members(parent.pid)} == {parent.pid, *children}


def test_terminate_job_escalates_to_sigkill_and_leaves_nothing(job):
    parent, children = job
    result = procs.terminate_job(parent.pid, grace_s=1, reap=parent.poll)
    assert set(result["pids"]) == {parent.pid, *children}
    assert result["killed"] == [children[0]]  # it ignored SIGTERM
    assert result["left"] == []
    assert procs.members(parent.pid) == []
    assert not any(procs.alive(pid) for pid in children)


def test_children_of_a_parent_killed_with_sigkill_are_still_found_and_ended(job):
    parent, children = job
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    orphans = {m["pid"] for m in procs.members(parent.pid)}
    assert orphans == set(children)  # reparented, but still in the job's session
    result = procs.terminate_job(parent.pid, grace_s=1)
    assert result["left"] == [] and procs.members(parent.pid) == []
