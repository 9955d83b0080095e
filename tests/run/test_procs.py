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

from base import procs
from support.paths import PROGRAMS

JOB_TREE = PROGRAMS / "job_tree.py"


@pytest.fixture
def job(tmp_path):
    """A parent in its own session with two children, child 0 ignoring SIGTERM, child 1 in a session of
    its own; (parent, children pids)."""
    heartbeat = tmp_path / "heartbeat.json"
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"heartbeat": str(heartbeat), "children": 2, "ignore_term": True,
                                "own_session": True}))
    parent = subprocess.Popen([sys.executable, str(JOB_TREE), str(args)], stdin=subprocess.DEVNULL,
                              start_new_session=True)
    children_file = Path(str(heartbeat) + ".children")
    deadline = time.monotonic() + 30
    while not children_file.exists():
        assert time.monotonic() < deadline, "job_tree.py did not start its children"
        time.sleep(0.05)
    children = json.loads(children_file.read_text())
    yield parent, children
    procs.terminate_job(parent.pid, grace_s=0, reap=parent.poll)
    parent.wait()


def test_members_are_the_parent_and_its_children_even_one_that_left_the_session(job):
    parent, children = job
    found = {m["pid"]: m for m in procs.members(parent.pid)}
    assert set(found) == {parent.pid, *children}
    assert found[children[1]]["sid"] == children[1] != parent.pid


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
    watched = procs.Job(parent.pid)
    assert {m["pid"] for m in watched.members()} == {parent.pid, *children}
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    # Reparented: child 0 is still in the job's session; child 1 left it, but was seen before.
    assert {m["pid"] for m in watched.members()} == set(children)
    assert {m["pid"] for m in procs.members(parent.pid)} == {children[0]}  # a fresh look finds only the first
    result = watched.terminate(grace_s=1)
    assert result["left"] == [] and watched.members() == []
    assert not any(procs.alive(pid) for pid in children)
