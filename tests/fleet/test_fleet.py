"""Every task on a group of hosts: `--host` as a group, `all` or a comma list; each host's outcome its own.

The runner is tested with plain functions (sleeping, raising); the tasks against the real lab
host: the shipped group lab-shells (three users of one sshd), and inventories adding a host that
is down and one whose key is unknown or changed.
"""
from __future__ import annotations

import io
import socket
import subprocess
import threading
import time

import pytest
import yaml
from rich.console import Console

from base.contract import FAILED, RUNNING, SUCCEEDED
from specrig import group
from specrig.errors import ConnectionFailed, Findings, InventoryError, UsageError
from specrig.exit_status import SEVERITY, ExitStatus, most_serious
from specrig.inventory import Host, load_inventory
from specrig.run.live import RunsBoard
from specrig.ui import group as group_view
from support.lab import inv, inv_json, lab_entry, launch_failing_run
from support.paths import REPO

# ---- the runner, with plain functions --------------------------------------------------------------

def hosts(*names: str) -> list[Host]:
    return [Host(name=name) for name in names]


def test_at_most_parallel_hosts_run_at_once():
    running, most = 0, 0
    lock = threading.Lock()

    def work(host):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.1)
        with lock:
            running -= 1
        return host.name

    outcomes = list(group.run_each(hosts(*"abcdefg"), work, parallel=3))
    assert most == 3
    assert sorted(outcome.result for outcome in outcomes) == list("abcdefg")


def test_outcomes_come_as_hosts_finish_and_a_slow_host_holds_nobody_back():
    started = time.monotonic()
    delays = {"slow": 1.0, "quick": 0.0, "middle": 0.3}
    arrived = []
    for outcome in group.run_each(hosts("slow", "quick", "middle"), lambda host: time.sleep(delays[host.name]),
                                  parallel=3):
        arrived.append((outcome.host, time.monotonic() - started))
    assert [name for name, _ in arrived] == ["quick", "middle", "slow"]
    assert arrived[0][1] < 0.5, "the quick host waited for the slow one"


def test_each_failure_stays_with_its_host():
    def work(host):
        if host.name == "down":
            raise ConnectionFailed("down: cannot connect")
        if host.name == "drifted":
            raise Findings("drifted: 2 drift findings", payload={"findings": [1, 2]})
        if host.name == "buggy":
            raise KeyError("oops")
        return {"fine": True}

    outcomes = {o.host: o for o in group.run_each(hosts("ok", "down", "drifted", "buggy"), work, parallel=2)}
    assert outcomes["ok"].exit_status == ExitStatus.OK and outcomes["ok"].result == {"fine": True}
    assert outcomes["down"].exit_status == ExitStatus.CONNECTION and "cannot connect" in outcomes["down"].error.message
    assert outcomes["drifted"].exit_status == ExitStatus.FINDINGS
    assert outcomes["drifted"].as_json()["result"] == {"findings": [1, 2]}
    assert outcomes["buggy"].exit_status == ExitStatus.REMOTE_ERROR
    assert "KeyError" in outcomes["buggy"].error.message and "Traceback" in outcomes["buggy"].as_json()["detail"]


def test_a_judged_result_is_not_an_error():
    outcomes = list(group.run_each(hosts("a"), lambda host: {"drift": 3}, parallel=1,
                                   judge=lambda result: ExitStatus.FINDINGS if result["drift"] else ExitStatus.OK))
    assert outcomes[0].exit_status == ExitStatus.FINDINGS and outcomes[0].error is None


def test_severity_orders_every_status_once():
    assert sorted(SEVERITY) == sorted(ExitStatus)
    assert most_serious([ExitStatus.FINDINGS, ExitStatus.CONNECTION, ExitStatus.HOST_KEY]) == ExitStatus.HOST_KEY
    assert most_serious([ExitStatus.FINDINGS, ExitStatus.USAGE]) == ExitStatus.USAGE
    assert most_serious([ExitStatus.OK, ExitStatus.OK]) == ExitStatus.OK
    assert most_serious([]) == ExitStatus.OK


def test_parallelism_setting(monkeypatch):
    monkeypatch.delenv(group.PARALLEL_VARIABLE, raising=False)
    assert group.parallelism() == group.DEFAULT_PARALLEL
    monkeypatch.setenv(group.PARALLEL_VARIABLE, "4")
    assert group.parallelism() == 4
    monkeypatch.setenv(group.PARALLEL_VARIABLE, "0")
    with pytest.raises(UsageError, match="SPECRIG_PARALLEL='0'"):
        group.parallelism()


def test_streamed_lines_are_whole_and_prefixed_by_host(monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(group_view, "console", Console(file=buffer, width=200))
    lines = group_view.PrefixedLines(["a", "host-b"])

    def stream(name):
        with lines.writer(name) as write:
            for number in range(200):
                # Pieces that split lines anywhere: only whole lines may come out.
                write(f"{name} line {number} ")
                write("end\n" if number % 2 else "")
            write("unfinished")

    threads = [threading.Thread(target=stream, args=(name,)) for name in ("a", "host-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out = buffer.getvalue().splitlines()
    for name, prefix in (("a", "a      | "), ("host-b", "host-b | ")):
        mine = [line[len(prefix):] for line in out if line.startswith(prefix)]
        assert mine[:2] == [f"{name} line 0 {name} line 1 end", f"{name} line 2 {name} line 3 end"]
        assert len(mine) == 101 and mine[-1] == "unfinished"
    assert len(out) == 202


def test_the_runs_board_shows_each_host_as_it_stands(monkeypatch):
    board = RunsBoard(["a", "b", "c"])
    board.update("a", {"run_id": "run-a", "state": RUNNING,
                       "heartbeat": {"phase": "extracting", "samples_done": 3, "samples_total": 10, "eta_s": 70}})
    board.finished(group.HostOutcome("b", ExitStatus.CONNECTION, 0.1, error=ConnectionFailed("b: cannot connect")))
    buffer = io.StringIO()
    Console(file=buffer, width=80).print(board)
    rows = {line.split()[1]: line for line in buffer.getvalue().splitlines() if line.startswith("│ ")}
    assert all(word in rows["a"] for word in ("run-a", RUNNING, "extracting", "3/10", "1m10s"))
    assert "unreachable (3)" in rows["b"] and "waiting" in rows["c"]


# ---- naming hosts ------------------------------------------------------------------------------

@pytest.fixture
def inventory(make_inventory):
    return load_inventory(make_inventory({"hosts": {"a": {}, "b": {}, "c": {}}, "groups": {"ab": ["a", "b"]}}))


def names(found) -> list[str] | None:
    return None if found is None else [host.name for host in found]


def test_one_host_keeps_the_single_host_path(inventory):
    assert group.group_hosts(inventory, "a") is None
    assert group.group_hosts(inventory, "local") is None


def test_groups_all_and_lists_in_order_each_host_once(inventory):
    assert names(group.group_hosts(inventory, "ab")) == ["a", "b"]
    assert names(group.group_hosts(inventory, "all")) == ["a", "b", "c"]
    assert names(group.group_hosts(inventory, "c, ab,a,local")) == ["c", "a", "b", "local"]


def test_every_unknown_name_is_named_before_anything_runs(inventory):
    with pytest.raises(InventoryError) as caught:
        group.group_hosts(inventory, "a,nope,ab,zz")
    assert "'nope', 'zz'" in caught.value.message and "groups: ab" in caught.value.hint
    with pytest.raises(UsageError, match="empty name"):
        group.group_hosts(inventory, "a,,b")


# ---- tasks on the lab ----------------------------------------------------------------------------

def test_doctor_on_a_group_every_shell(lab):
    code, outcomes = inv_json("doctor", "--host", "lab-shells")
    assert code == 0, outcomes
    assert list(outcomes) == ["lab", "lab-bash", "lab-dash"]
    shells = {name: outcome["result"]["login_shell"].rsplit("/", 1)[1] for name, outcome in outcomes.items()}
    assert shells == {"lab": "zsh", "lab-bash": "bash", "lab-dash": "dash"}
    assert all(outcome["exit_status"] == 0 for outcome in outcomes.values())


def test_verify_on_a_group_most_serious_status_wins(lab):
    # lab's venv holds speculators and vLLM; lab-bash and lab-dash run the system Python, without them.
    code, outcomes = inv_json("verify-signatures", "--host", "lab-shells")
    assert outcomes["lab"]["exit_status"] in (0, 1) and "findings" in outcomes["lab"]["result"]
    for name in ("lab-bash", "lab-dash"):
        assert outcomes[name]["exit_status"] == ExitStatus.USAGE
        assert "speculators is not installed" in outcomes[name]["error"]
    assert code == ExitStatus.USAGE


def test_patch_status_on_a_comma_list(lab):
    result = inv("patch-status", "--host", "lab,lab-dash", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "patch-status: 2 hosts, 2 ok, 0 not ok" in result.stdout
    assert "patchset speculators-0.3-vllm-0.16-0.17" in result.stdout  # lab's figures
    assert "no patchset applies" in result.stdout  # lab-dash: nothing installed
    assert max(map(len, result.stdout.splitlines())) <= 80


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mixed_inventory(lab, make_inventory, trusted_known_hosts):
    """lab; `down`, a closed port; `stranger`, the lab's sshd under a name no known_hosts holds."""
    path = make_inventory({"hosts": {
        "lab": lab_entry(),
        "down": lab_entry(port=free_port()),
        "stranger": lab_entry(hostname="localhost", host_key_policy="reject"),
    }})
    trusted_known_hosts(path)
    return path


def test_a_host_down_and_an_unknown_key_stay_with_their_hosts(mixed_inventory):
    code, outcomes = inv_json("doctor", "--host", "all", inventory=mixed_inventory)
    assert sorted(outcomes) == ["down", "lab", "stranger"]  # every host of the inventory
    assert outcomes["lab"]["exit_status"] == 0 and outcomes["lab"]["result"]["packages"]["speculators"]
    assert outcomes["down"]["exit_status"] == ExitStatus.CONNECTION and "refused" in outcomes["down"]["error"]
    assert outcomes["stranger"]["exit_status"] == ExitStatus.HOST_KEY
    assert "is not known" in outcomes["stranger"]["error"]
    assert code == ExitStatus.HOST_KEY


def test_the_summary_names_each_failure_with_its_reason(mixed_inventory):
    key = mixed_inventory.parent / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    known_hosts = mixed_inventory.parent / ".specrig" / "known_hosts"
    known_hosts.write_text(known_hosts.read_text() + "[localhost]:2222 " + key.with_suffix(".pub").read_text())
    result = inv("verify-signatures", "--host", "lab,down,stranger", inventory=mixed_inventory,
                 env={"COLUMNS": "80"})
    assert result.returncode == ExitStatus.HOST_KEY, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    assert "verify-signatures: 3 hosts, 0 ok, 3 not ok" in text
    assert "unreachable (3)" in text and "Connection refused" in text
    assert "host key (5)" in text and "CHANGED" in text
    assert "findings (1)" in text or "lab: ok" in text
    assert max(map(len, result.stdout.splitlines())) <= 80


def test_a_bad_name_in_a_list_runs_nothing(lab):
    result = inv("doctor", "--host", "lab,no-such-host,lab-bash")
    assert result.returncode == ExitStatus.USAGE
    assert "no host or group 'no-such-host'" in result.stderr
    assert result.stdout == ""


def test_extract_on_several_hosts_checks_every_setting_before_reaching_a_host(lab):
    # A sharded extraction (tests/fleet/test_fleet_extract.py runs them): a bad value is one line, nothing runs.
    result = inv("extract", "--host", "lab-shells", "--batch-size", "0", "--detach")
    assert result.returncode == ExitStatus.USAGE, result.stdout + result.stderr
    assert "--batch-size '0'" in result.stderr and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1


def test_logs_of_several_hosts_prefixed_and_a_host_without_the_run(lab, make_inventory, trusted_known_hosts,
                                                                  monkeypatch):
    # The shipped lab, lab-cpu and lab-bash, lab and lab-cpu in a workdir of their own: the suite's other process
    # (.ci/tests) lists the runs of theirs, ~/specrig-work, before and after a call that must launch nothing.
    shipped = yaml.safe_load((REPO / "hosts.yaml").read_text())
    key = lab_entry()["identity_file"]
    inventory = make_inventory({"defaults": shipped["defaults"], "hosts": {
        name: dict(shipped["hosts"][name], identity_file=key,
                   **({} if name == "lab-bash" else {"workdir": "~/specrig-fleet/shells"}))
        for name in ("lab", "lab-cpu", "lab-bash")}})
    trusted_known_hosts(inventory)
    monkeypatch.setenv("SPECRIG_HOSTS", str(inventory))  # every `inv` below, launch_failing_run's too
    run_id = launch_failing_run()  # lab-cpu shares lab's workdir: it finds the run too
    deadline = time.monotonic() + 120
    while inv_json("status", "--host", "lab", "--run", run_id)[1]["runs"][0]["state"] not in (FAILED, SUCCEEDED):
        assert time.monotonic() < deadline, "the run did not end"
        time.sleep(1)
    result = inv("logs", "--host", "lab,lab-cpu,lab-bash", "--run", run_id, "-f", "-n", "5", env={"COLUMNS": "200"})
    assert result.returncode == ExitStatus.USAGE, result.stdout + result.stderr  # lab-bash has no such run
    lines = result.stdout.splitlines()
    assert sum(line.startswith("lab      | ") for line in lines) == 5
    assert sum(line.startswith("lab-cpu  | ") for line in lines) == 5
    assert "not restarting" in result.stdout
    assert f"run {run_id} failed" in result.stdout and f"no run '{run_id}'" in result.stdout
