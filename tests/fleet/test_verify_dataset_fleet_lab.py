"""`inv verify-dataset` of a real sharded run (issue 28): server mode over lab-1 and lab-2 writing one shared
output (`--shared-out`), extracted once for the module. Each host checks its own shard's rows, the other's
files in the directory being no extra; the union is every row once. A file removed from a copy of the shared
output is then named with its row, by the host whose shard it is.
"""
from __future__ import annotations

import shutil
import time
import uuid

import pytest

from base import outputs, prepared
from base.contract import ACTIVE_STATES, SUCCEEDED
from support.lab import inv, inv_json
from support.runnable_env import HOME, runnable_env_or_skip  # noqa: F401 (marks the module runnable)
from support.server_lab import require_server_fleet, server_fleet_inventory

HOSTS = ["lab-1", "lab-2"]
ROWS = 8
CALL_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def sharded(lab, tmp_path_factory):
    """One sharded server-mode run over lab-1 and lab-2 into one shared --out: (inventory, sharded run id, out)."""
    fleet = require_server_fleet(HOSTS)
    out = HOME / "specrig-fleet" / "out" / f"dataset-{uuid.uuid4().hex[:8]}"
    out.mkdir(parents=True)
    shutil.chown(out, "specrig", "specrig")
    inventory = server_fleet_inventory(tmp_path_factory.mktemp("fleet"), fleet, HOSTS, extract=lambda number: {
        "port": 18500 + number, "out": str(out)})
    code, launched = inv_json("extract", "--host", "pair", "--shared-out", "--max-samples", str(ROWS),
                              "--concurrency", "2", inventory=inventory, timeout=CALL_TIMEOUT_S)
    assert code == 0, launched
    sharded_run_id = launched["lab-1"]["result"]["sharded_run_id"]
    try:
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while time.monotonic() < deadline:
            code, found = inv_json("status", "--host", "pair", "--run", sharded_run_id, inventory=inventory)
            states = {host: record["result"]["runs"][0]["state"] for host, record in found.items()}
            if not set(states.values()) & set(ACTIVE_STATES):
                break
            time.sleep(3)
        assert states == {"lab-1": SUCCEEDED, "lab-2": SUCCEEDED}, states
    finally:
        inv("stop", "--host", "pair", "--run", sharded_run_id, inventory=inventory, timeout=CALL_TIMEOUT_S)
    yield inventory, sharded_run_id, out
    shutil.rmtree(out, ignore_errors=True)


def test_each_host_checks_its_shard_and_the_union_is_every_row_once(sharded):
    inventory, sharded_run_id, out = sharded
    code, found = inv_json("verify-dataset", "--host", "pair", "--run", sharded_run_id, inventory=inventory,
                           timeout=CALL_TIMEOUT_S)
    assert code == 0 and found["trainable"] and found["rows"] == ROWS and found["problems"] == [], found
    for rank, host in enumerate(HOSTS):
        result = found["hosts"][host]["result"]
        share = prepared.shard_indices(ROWS, ROWS, len(HOSTS), rank)
        assert result["held"] == share and result["partial"] and result["bad"] == [] and result["extra"] == []
        assert result["trainable"] and result["command"][result["command"].index("--hidden-states-path") + 1] == str(out)


def test_a_row_missing_from_a_shard_is_named_by_its_host_and_in_the_union(sharded):
    inventory, sharded_run_id, out = sharded
    victim = prepared.shard_indices(ROWS, ROWS, len(HOSTS), 1)[0]
    kept = out / f"kept-{outputs.file_name(victim)}"
    shutil.move(out / outputs.file_name(victim), kept)
    try:
        code, found = inv_json("verify-dataset", "--host", "pair", "--run", sharded_run_id, inventory=inventory,
                               timeout=CALL_TIMEOUT_S)
    finally:
        shutil.move(kept, out / outputs.file_name(victim))
    assert code == 1 and not found["trainable"], found
    assert found["hosts"]["lab-2"]["result"]["bad"] == [
        {"row": victim, "reason": f"no file: {outputs.file_name(victim)} is missing"}], found["hosts"]["lab-2"]
    assert found["hosts"]["lab-1"]["exit_status"] == 0, found["hosts"]["lab-1"]
    assert f"row {victim} is on no host" in found["problems"], found["problems"]
