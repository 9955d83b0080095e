"""specrig/cli/runner.py with plain functions: one data function and one view, and `--host` alone
decides between one host's output and a group's per-host summary (no host is reached)."""
from __future__ import annotations

import dataclasses
import json
import time

import pytest

from specrig.cli.runner import run_task
from specrig.errors import Findings
from specrig.exit_status import ExitStatus
from specrig.ui.task import TaskView


@pytest.fixture(autouse=True)
def inventory(make_inventory, monkeypatch):
    path = make_inventory({"hosts": {"a": {}, "b": {}, "c": {}}, "groups": {"ab": ["a", "b"], "solo": ["c"]}})
    monkeypatch.setenv("SPECRIG_HOSTS", str(path))


def work(host):
    if host.name == "b":
        raise Findings("b: found something", payload={"found": 1})
    return {"answer": host.name}


def view(shown: list, *, findings_status: ExitStatus | None = None) -> TaskView:
    def show(result, *, host, as_json):
        shown.append((host.name, result, as_json))

    def show_findings(found, *, host, as_json):
        shown.append((host.name, found.payload, as_json))
        return findings_status

    return TaskView("answer", show=show, figures=lambda result: f"answer {result['answer']}",
                    judge=lambda result: ExitStatus.OK, show_findings=show_findings)


def test_one_host_gets_its_own_output():
    shown = []
    assert run_task("a", work, view(shown), as_json=True) == ExitStatus.OK
    assert shown == [("a", {"answer": "a"}, True)]


def test_one_host_that_found_something_shows_it_then_raises_unless_its_view_ends_the_task():
    shown = []
    with pytest.raises(Findings):
        run_task("b", work, view(shown), as_json=False)
    assert shown == [("b", {"found": 1}, False)]
    assert run_task("b", work, view([], findings_status=ExitStatus.FINDINGS), as_json=True) == ExitStatus.FINDINGS


def test_a_group_gets_one_record_per_host_in_the_order_named_even_a_group_of_one(capsys):
    shown = []
    assert run_task("b,a", work, view(shown), as_json=True) == ExitStatus.FINDINGS
    assert shown == []  # the one-host view is not a group's
    outcomes = json.loads(capsys.readouterr().out)
    assert list(outcomes) == ["b", "a"]
    assert outcomes["a"]["result"] == {"answer": "a"} and outcomes["a"]["exit_status"] == 0
    assert outcomes["b"]["result"] == {"found": 1} and outcomes["b"]["error"] == "b: found something"
    assert run_task("solo", work, view(shown), as_json=True) == ExitStatus.OK
    assert list(json.loads(capsys.readouterr().out)) == ["c"]


def test_a_group_for_people_a_line_per_host_then_the_summary(capsys):
    assert run_task("ab", work, view([]), as_json=False) == ExitStatus.FINDINGS
    out = capsys.readouterr().out
    assert "a: ok in" in out and "answer a" in out and "b: findings (1)" in out
    assert "answer: 2 hosts, 1 ok, 1 not ok" in out


def test_ctrl_c_detaches_a_group_that_follows_and_the_finished_hosts_decide(capsys):
    # Ctrl-C reaches the main thread: here, while it shows host a's line (c's came first).
    def following(host):
        time.sleep(0.3 if host.name == "a" else 0)
        return {"answer": host.name}

    def figures(result):
        if result["answer"] == "a":
            raise KeyboardInterrupt
        return "followed"

    interrupted = dataclasses.replace(view([]), figures=figures)
    status = run_task("c,a", work, interrupted, as_json=False, group_work=lambda hosts: following,
                      detach_note="detached; the runs go on")
    out = capsys.readouterr().out
    assert status == ExitStatus.OK and "c: ok in" in out and "detached; the runs go on" in out
    assert "answer: 2 hosts" not in out  # no summary: not every host is in
    with pytest.raises(KeyboardInterrupt):  # without a note, Ctrl-C interrupts (130)
        run_task("c,a", following, interrupted, as_json=False)
