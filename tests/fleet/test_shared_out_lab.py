"""Fleet shards and one output directory (issue 17): where several hosts' shards write the same path, the
preflight proves with a token written by one host and read by the others whether that path is one
storage. `--shared-out` asks for one shared directory: a host that does not see the token is refused by
name, nothing launched. Without it the same path must be each host's own (gather counts each host's files).

lab-1 and lab-2 share this machine's disk (one storage). The host that does not share it is a fleet host
of the test's own whose sshd sees the output directory as an empty tmpfs of its own (support/lab.py
host_of_its_own: a private mount namespace), with lab-server's environments as the other fleet tests.
"""
from __future__ import annotations

import os
import shutil
import uuid

import pytest

from specrig.inventory import load_inventory
from specrig.lab import fleet as lab_fleet
from specrig.run import sharded_runs
from support.lab import host_of_its_own, inv_json, known_hosts_line
from support.runnable_env import HOME
from support.server_lab import require_server_fleet, server_fleet_inventory

CALL_TIMEOUT_S = 300


@pytest.fixture
def out():
    """An output directory of the test's own, owned by the lab user, holding a file of an earlier run."""
    path = HOME / "specrig-fleet" / "out" / f"shared-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    shutil.chown(path, "specrig", "specrig")
    (path / "kept.txt").write_text("a file of an earlier run\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def inventory_of(tmp_path, fleet, hosts, out, own=None):
    """hosts.yaml for `hosts` (lab-N names, and the test's own host `own`: (number, name)), one --out."""
    if own:
        fleet = {**fleet, own[1]: lab_fleet.fleet_entry(own[0])}
    inventory = server_fleet_inventory(tmp_path, fleet, hosts, extract=lambda number: {
        "port": 18400 + number, "out": str(out)})
    if own:
        with open(tmp_path / ".specrig" / "known_hosts", "a") as known:
            known.write(known_hosts_line(own[0]))
    return inventory


def test_shared_out_on_a_host_that_does_not_share_the_path_is_refused_by_name(lab, tmp_path, out):
    fleet = require_server_fleet(["lab-1"])
    with host_of_its_own(private=(out,)) as own:
        inventory = inventory_of(tmp_path, fleet, ["lab-1", own[1]], out, own)
        runs = [HOME / "specrig-fleet" / host / "runs" for host in ("lab-1", own[1])]
        before = [sorted(os.listdir(path)) if path.exists() else [] for path in runs]
        code, found = inv_json("extract", "--host", "pair", "--shared-out", inventory=inventory,
                               timeout=CALL_TIMEOUT_S)
        after = [sorted(os.listdir(path)) if path.exists() else [] for path in runs]
    assert code == 1 and found["launched"] is False, found
    refused = {host: [c for c in outcome["result"] if not c["ok"]] for host, outcome in found["preflight"].items()}
    assert [c["name"] for c in refused[own[1]]] == ["out-shared"], refused
    assert refused[own[1]][0]["detail"] == (
        f"{own[1]} does not see the token lab-1 wrote in {out} ({out} on 2 hosts): no such file there: the "
        "directory is this host's own, not the storage the others write"), refused
    assert refused[own[1]][0]["advice"].startswith(f"mount {out} on every host from one storage, at that path")
    assert [c["name"] for c in refused["lab-1"]] == ["out-shared"], refused  # the writer: no one read it
    assert after == before  # no run on either host
    assert sorted(os.listdir(out)) == ["kept.txt"] and (out / "kept.txt").read_text() == "a file of an earlier run\n"


def test_the_same_path_on_two_hosts_of_one_disk_is_one_directory(lab, tmp_path, out):
    fleet = require_server_fleet(["lab-1", "lab-2"])
    inventory = load_inventory(inventory_of(tmp_path, fleet, ["lab-1", "lab-2"], out))
    hosts = [inventory.host("lab-1"), inventory.host("lab-2")]
    requests = sharded_runs.shard_requests(hosts, {})
    asked = sharded_runs.shared_output(hosts, requests, shared_out=True)
    assert all(c["ok"] for c in asked.values()) and asked["lab-2"]["detail"] == (
        f"lab-2 reads the token lab-1 wrote in {out} ({out} on 2 hosts): one storage"), asked
    unasked = sharded_runs.shared_output(hosts, requests, shared_out=False)
    assert not unasked["lab-2"]["ok"] and unasked["lab-2"]["detail"].startswith(
        f"{out} is one directory for lab-1 and lab-2"), unasked
    assert "--shared-out" in unasked["lab-2"]["advice"] and "{host}" in unasked["lab-2"]["advice"]
    assert sorted(os.listdir(out)) == ["kept.txt"]  # every token taken away


def test_hosts_with_a_directory_each_take_no_token(lab, tmp_path):
    fleet = require_server_fleet(["lab-1", "lab-2"])
    inventory = load_inventory(inventory_of(tmp_path, fleet, ["lab-1", "lab-2"], "~/specrig-fleet/{host}/out/x"))
    hosts = [inventory.host("lab-1"), inventory.host("lab-2")]
    assert sharded_runs.shared_output(hosts, sharded_runs.shard_requests(hosts, {}), shared_out=False) == {}
