"""One server-mode extraction over two lab fleet hosts (issue 11): speculators' own split
(`generate-offline-data --world-size 2 --rank k`), one shard per host, every row once in the union,
each shard's states equal to transformers' own.

lab-1 and lab-2 (own sshd, own host key, own workdir) take lab-server's environments here, through an
inventory of this test's own: speculators 0.9.0 as `python`, the patched venv-server-0.32 as
`server_python`, and a port each (the lab's hosts are one machine: two servers on one 127.0.0.1).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from conftest import REPO, inv, inv_json
from runnable_env import HOME, runnable_env_or_skip  # noqa: F401 (marks the module runnable)
from run.server import client, outputs
from specrig import lab as lab_module

HOSTS = ["lab-1", "lab-2"]
ROWS = 24
CALL_TIMEOUT_S = 300
CLIENT = HOME / "venv-spec-0.9"
MODEL = HOME / "models" / "tiny-llama"
LAYERS = [2, 4, 5, 8]
TOLERANCE = 2 ** -6


@pytest.fixture
def pair(lab, tmp_path):
    """hosts.yaml with lab-1 and lab-2 in server mode, group `pair`, {host} output directories."""
    if not (CLIENT / "bin" / "python").exists() or lab_module.fleet_size() < len(HOSTS):
        pytest.skip("needs `inv lab.up --runnable --hosts 2` (server mode's environments and two fleet hosts)")
    patched = inv("apply-patches", "--host", "lab-server", timeout=300)  # venv-server-0.32, shared by the pair
    assert patched.returncode == 0, patched.stdout + patched.stderr
    fleet = yaml.safe_load((REPO / ".lab" / "fleet.yaml").read_text())["hosts"]
    name = f"fleet-server-{uuid.uuid4().hex[:8]}"
    hosts = {}
    for number, host in enumerate(HOSTS):
        entry = dict(fleet[host], identity_file=str(REPO / ".lab" / "client_key"),
                     python="~/venv-spec-0.9/bin/python", server_python="~/venv-server-0.32/bin/python")
        entry["extract"] = dict(entry["extract"], port=18300 + number, out=f"~/specrig-fleet/{{host}}/out/{name}")
        hosts[host] = entry
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": hosts, "groups": {"pair": HOSTS}}))
    (tmp_path / ".specrig").mkdir()
    shutil.copy(REPO / ".specrig" / "known_hosts", tmp_path / ".specrig" / "known_hosts")
    outs = [HOME / "specrig-fleet" / host / "out" / name for host in HOSTS]
    yield inventory, outs
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)


def wait_final(inventory: Path, fleet_run_id: str, timeout: float = 900) -> dict:
    """Each host's state once no shard is active any more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, found = inv_json("status", "--host", "pair", "--run", fleet_run_id, inventory=inventory,
                               timeout=CALL_TIMEOUT_S)
        assert code == 0, found
        states = {host: record["result"]["runs"][0]["state"] for host, record in found.items()}
        if not set(states.values()) & {"starting", "running", "restarting", "stalled"}:
            return states
        time.sleep(5)
    raise AssertionError(f"fleet run {fleet_run_id} still active after {timeout} s: {states}")


def test_a_server_mode_fleet_run_splits_the_rows_as_speculators_does(pair):
    inventory, outs = pair
    code, launched = inv_json("extract", "--host", "pair", "--max-samples", str(ROWS), "--concurrency", "2",
                              inventory=inventory, timeout=CALL_TIMEOUT_S)
    assert code == 0, launched
    fleet_run_id = launched["lab-1"]["result"]["fleet_run_id"]
    try:
        states = wait_final(inventory, fleet_run_id)
        assert states == {"lab-1": "succeeded", "lab-2": "succeeded"}, states
        code, gathered = inv_json("gather", "--host", "pair", "--run", fleet_run_id, inventory=inventory,
                                  timeout=CALL_TIMEOUT_S)
    finally:
        inv("stop", "--host", "pair", "--run", fleet_run_id, inventory=inventory, timeout=CALL_TIMEOUT_S)
    assert code == 0 and gathered["complete"], gathered
    assert gathered["dataset_samples"] == ROWS and gathered["samples"] == ROWS, gathered
    for rank, out in enumerate(outs):
        share = client.shard_indices(ROWS, None, len(HOSTS), rank)
        assert outputs.existing_indices(str(out)) == share  # contiguous chunks: 0-11 and 12-23
        reference = subprocess.run([str(CLIENT / "bin" / "python"),
                                    str(REPO / "tests" / "programs" / "server_hidden_states_reference.py"),
                                    str(out), str(MODEL), ",".join(map(str, LAYERS))],
                                   capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        assert reference.returncode == 0, reference.stderr[-3000:]
        measured = json.loads(reference.stdout.strip().splitlines()[-1])
        assert measured["files"] == len(share) and not measured["problems"], measured
        for k in LAYERS:
            assert measured["max_abs_diff"]["input"][str(k)] <= TOLERANCE * measured["max_abs_value"], measured
