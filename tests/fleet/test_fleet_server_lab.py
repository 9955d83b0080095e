"""One server-mode extraction over two lab fleet hosts (issue 11): speculators' own split
(`generate-offline-data --world-size 2 --rank k`), one shard per host, every row once in the union,
each shard's states equal to transformers' own.

lab-1 and lab-2 (own sshd, own host key, own workdir) take lab-server's environments here, through an
inventory of this test's own: speculators 0.9.0 as `python`, the patched venv-server-0.32 as
`server_python`, and a port each (the lab's hosts are one machine: two servers on one 127.0.0.1).
"""
from __future__ import annotations

import re
import shutil
import time
import uuid
from pathlib import Path

import pytest

from base import outputs, prepared
from base.contract import ACTIVE_STATES, SUCCEEDED
from support.lab import inv, inv_json
from support.runnable_env import HOME, runnable_env_or_skip  # noqa: F401 (marks the module runnable)
from support.server_lab import require_server_fleet, server_fleet_inventory, states_against_transformers

HOSTS = ["lab-1", "lab-2"]
ROWS = 24
CALL_TIMEOUT_S = 300


@pytest.fixture
def pair(lab, tmp_path):
    """hosts.yaml with lab-1 and lab-2 in server mode, group `pair`, {host} output directories."""
    fleet = require_server_fleet(HOSTS)
    name = f"fleet-server-{uuid.uuid4().hex[:8]}"
    inventory = server_fleet_inventory(tmp_path, fleet, HOSTS, extract=lambda number: {
        "port": 18300 + number, "out": f"~/specrig-fleet/{{host}}/out/{name}"})
    outs = [HOME / "specrig-fleet" / host / "out" / name for host in HOSTS]
    yield inventory, outs
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)


def wait_final(inventory: Path, sharded_run_id: str, timeout: float = 900) -> dict:
    """Each host's state once no shard is active any more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, found = inv_json("status", "--host", "pair", "--run", sharded_run_id, inventory=inventory,
                               timeout=CALL_TIMEOUT_S)
        assert code == 0, found
        states = {host: record["result"]["runs"][0]["state"] for host, record in found.items()}
        if not set(states.values()) & set(ACTIVE_STATES):
            return states
        time.sleep(5)
    raise AssertionError(f"sharded run {sharded_run_id} still active after {timeout} s: {states}")


def test_a_server_mode_fleet_run_splits_the_rows_as_speculators_does(pair):
    inventory, outs = pair
    code, launched = inv_json("extract", "--host", "pair", "--max-samples", str(ROWS), "--concurrency", "2",
                              inventory=inventory, timeout=CALL_TIMEOUT_S)
    assert code == 0, launched
    sharded_run_id = launched["lab-1"]["result"]["sharded_run_id"]
    try:
        states = wait_final(inventory, sharded_run_id)
        assert states == {"lab-1": SUCCEEDED, "lab-2": SUCCEEDED}, states
        code, gathered = inv_json("gather", "--host", "pair", "--run", sharded_run_id, inventory=inventory,
                                  timeout=CALL_TIMEOUT_S)
    finally:
        inv("stop", "--host", "pair", "--run", sharded_run_id, inventory=inventory, timeout=CALL_TIMEOUT_S)
    assert code == 0 and gathered["complete"], gathered
    assert gathered["dataset_samples"] == ROWS and gathered["samples"] == ROWS, gathered
    for rank, out in enumerate(outs):
        share = prepared.shard_indices(ROWS, None, len(HOSTS), rank)
        assert outputs.existing_indices(str(out)) == share  # contiguous chunks: 0-11 and 12-23
        states_against_transformers(out, files=len(share))


def test_a_sharded_launch_says_for_each_shard_that_its_layers_are_not_trainings_default(pair):
    inventory, _ = pair
    done = inv("extract", "--host", "pair", "--layers", "1,2,3", "--max-samples", "4", "--skip-preflight",
               "--detach", inventory=inventory, env={"COLUMNS": "300"}, timeout=CALL_TIMEOUT_S)
    sharded_run_id = next(iter(re.findall(r"\bsharded-\d{8}-\d{6}-\w{4}\b", done.stdout)), None)
    try:
        assert done.returncode == 0 and sharded_run_id, done.stdout + done.stderr
        said = [line for line in done.stdout.splitlines() if "as --layers asks" in line]
        assert sorted(line.split(": ", 1)[0] for line in said) == HOSTS, done.stdout
        # The tiny model's 8 layers: the plan adds the last one, training takes [2, L // 2, L - 3, L].
        assert all(line.split(": ", 1)[1].startswith("layers [1, 2, 3, 8], as --layers asks; speculators' "
                                                     "training defaults to [2, 4, 5, 8]") for line in said), said
    finally:
        if sharded_run_id:
            inv("stop", "--host", "pair", "--run", sharded_run_id, inventory=inventory, timeout=CALL_TIMEOUT_S)
