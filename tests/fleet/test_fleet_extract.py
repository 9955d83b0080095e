"""One extraction over the lab fleet (lab-1 … lab-3, docs/runs.md "Sharded runs"): the dataset split by
sample index, one shard per host, under one sharded-run id; status/stop/resume on the whole sharded run
or one host of it; `inv gather` checks the union (every index once, each file loads).

Tiny runs (9 samples, batch 1, 256 tokens) on the shared runnable ~/venv-cpu; each test writes its
own output directories (`{host}` in --out), removed afterwards.
"""
from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest

from base.contract import ACTIVE_STATES, LOST, RUNNING, STOPPED, SUCCEEDED
from specrig.exit_status import ExitStatus
from specrig.lab import READY
from specrig.lab import fleet as lab_fleet
from support.lab import inv, inv_json, require_lab
from support.paths import REPO
from support.runnable_env import patch, runnable_env_or_skip  # also marks these tests runnable (they load a model)

GROUP = "lab-fleet"
HOSTS = ["lab-1", "lab-2", "lab-3"]
#: Seconds for each task the tests run: an extract or a stop across three hosts takes a while on two cores.
CALL_TIMEOUT_S = 300
SAMPLES = 9
SETTINGS = ("--max-samples", str(SAMPLES), "--batch-size", "1", "--max-len", "256")
#: bf16 states against transformers' own (tests/run/test_extraction_driver.py says why).
TOLERANCE = 2e-2
#: Sharded runs this module launched and has not stopped yet.
LAUNCHED: list[str] = []


@pytest.fixture(scope="module")
def fleet(lab):
    build = f"run `inv lab.up --runnable --hosts {lab_fleet.FLEET_SHIPPED}` as root"
    require_lab(lab.groups.get(GROUP) == HOSTS, f"hosts.yaml has no group {GROUP} of {HOSTS}")
    require_lab(lab_fleet.fleet_size() >= len(HOSTS)
            and all(lab_fleet.fleet_host_running(number) for number in range(1, len(HOSTS) + 1)),
            f"lab fleet not running: {build}")
    require_lab(READY.read_text() == "runnable\n", f"the lab fleet needs the runnable environments: {build}")
    # The fleet's hosts share ~/venv-cpu: the preflight's verify-signatures passes once it is patched.
    patch(runnable_env_or_skip(lab), "apply")
    return lab


@pytest.fixture
def out(fleet):
    """A fresh output directory per host ({host} in --out); removed afterwards (as root, or left)."""
    name = f"fleet-test-{uuid.uuid4().hex[:10]}"
    yield f"~/specrig-fleet/{{host}}/out/{name}"
    while LAUNCHED:  # a test that failed midway leaves nothing running
        inv("stop", "--host", GROUP, "--run", LAUNCHED.pop(), timeout=300)
    for host in HOSTS:
        for directory in (host_path(fleet, host, f"out/{name}"), host_path(fleet, host, f"out/{name}-whole")):
            shutil.rmtree(directory, ignore_errors=True)


def host_path(inventory, host: str, relative: str) -> Path:
    """A path under a fleet host's workdir, as this machine sees it (the lab's hosts are local)."""
    return Path(inventory.host(host).workdir.replace("~", str(Path("~specrig").expanduser()), 1)) / relative


def launch(out: str) -> str:
    """A detached fleet extraction; its sharded-run id."""
    code, launched = inv_json("extract", "--host", GROUP, *SETTINGS, "--out", out, timeout=CALL_TIMEOUT_S)
    assert code == 0, launched
    assert list(launched) == HOSTS
    ids = {record["result"]["sharded_run_id"] for record in launched.values()}
    assert len(ids) == 1
    assert [record["result"]["shard_index"] for record in launched.values()] == [0, 1, 2]
    LAUNCHED.append(ids.pop())
    return LAUNCHED[-1]


def runs(sharded_run_id: str, hosts: str = GROUP) -> dict:
    code, found = inv_json("status", "--host", hosts, "--run", sharded_run_id, timeout=CALL_TIMEOUT_S)
    assert code == 0, found
    if "runs" in found:  # one host: its own answer
        return {hosts: found["runs"][0]}
    return {host: record["result"]["runs"][0] for host, record in found.items()}


def wait_until_ended(sharded_run_id: str, hosts: str = GROUP, timeout: float = 420) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        now = runs(sharded_run_id, hosts)
        if not any(run["state"] in ACTIVE_STATES for run in now.values()):
            return now
        assert time.monotonic() < deadline, {host: run["state"] for host, run in now.items()}
        time.sleep(2)


def gather(sharded_run_id: str) -> tuple[int, dict]:
    return inv_json("gather", "--host", GROUP, "--run", sharded_run_id, timeout=CALL_TIMEOUT_S)


def ssh_kill_9(host: str, *targets: str) -> None:
    """kill -9 on a fleet host, as its user, over SSH (a pid, or -PGID for a process group)."""
    from specrig.inventory import load_inventory
    from specrig.transport import open_ssh
    from specrig.transport.quoting import command_line

    connection = open_ssh(load_inventory(REPO / "hosts.yaml").host(host))
    try:
        connection.run(command_line("kill", "-9", "--", *targets), hide=True, in_stream=False, warn=True)
    finally:
        connection.close()


def test_a_fleet_run_one_host_killed_then_resumed_alone_gathers_every_sample_once(fleet, out):
    runnable = runnable_env_or_skip(fleet)
    sharded_run_id = launch(out)
    # The same extraction on one host, for the numbering: shard files must be its files.
    whole = out.replace("{host}", "lab-1") + "-whole"
    single = inv("extract", "--host", "lab-1", *SETTINGS, "--out", whole, "--skip-preflight", "--detach")
    assert single.returncode == 0, single.stdout + single.stderr
    whole_run = single.stdout.split("launched run ", 1)[1].split()[0]
    LAUNCHED.append(whole_run)
    started = runs(sharded_run_id)
    for index, host in enumerate(HOSTS):
        record = started[host]["shard"]
        assert record == {"sharded_run_id": sharded_run_id, "hosts": HOSTS, "shard_index": index, "shard_count": 3,
                          "shared_out": False}
        assert started[host]["driver_args"]["shard_index"] == index
        assert started[host]["driver_args"]["output_dir"].endswith(f"/{host}/out/{out.rsplit('/', 1)[1]}")

    # kill -9 of lab-2's supervisor and driver job as soon as the driver runs: its run is lost.
    deadline = time.monotonic() + 120
    while not (run := runs(sharded_run_id, "lab-2")["lab-2"]).get("driver_pgid"):
        assert time.monotonic() < deadline, run
        time.sleep(0.5)
    ssh_kill_9("lab-2", str(run["supervisor_pid"]), f"-{run['driver_pgid']}")

    ended = wait_until_ended(sharded_run_id)
    assert ended["lab-2"]["state"] == LOST, ended["lab-2"]
    assert ended["lab-1"]["state"] == ended["lab-3"]["state"] == SUCCEEDED
    for host, index in (("lab-1", 0), ("lab-3", 2)):
        beat = ended[host]["heartbeat"]
        assert beat["samples_done"] == beat["samples_total"] == len(range(index, SAMPLES, 3))

    # The union lacks lab-2's samples, and says which.
    code, found = gather(sharded_run_id)
    assert code == ExitStatus.FINDINGS, found
    assert not found["complete"] and found["duplicated"] == {} and found["unloadable"] == []
    assert found["missing"] and set(found["missing"]) <= {1, 4, 7}, found
    shown = inv("gather", "--host", GROUP, "--run", sharded_run_id, env={"COLUMNS": "200"})
    assert shown.returncode == ExitStatus.FINDINGS and "missing: " in shown.stdout, shown.stdout

    # The whole sharded run resumed, detached: only lab-2 restarts; the others are left as they are.
    code, resumed = inv_json("resume", "--host", GROUP, "--run", sharded_run_id, timeout=CALL_TIMEOUT_S)
    assert code == 0, resumed
    assert resumed["lab-2"]["result"]["resumed_from"] == LOST and not resumed["lab-2"]["result"].get("skipped")
    assert resumed["lab-1"]["result"]["skipped"] and resumed["lab-3"]["result"]["skipped"]
    final = wait_until_ended(sharded_run_id, "lab-2")
    assert final["lab-2"]["state"] == SUCCEEDED, final

    code, found = gather(sharded_run_id)
    assert code == 0, found
    assert found["complete"] and found["dataset_samples"] == SAMPLES and found["samples"] == SAMPLES
    for index, host in enumerate(HOSTS):
        assert found["hosts"][host]["result"]["indices"] == list(range(index, SAMPLES, 3))

    total = inv("status", "--host", GROUP, "--run", sharded_run_id, env={"COLUMNS": "200"})
    assert f"total: {SAMPLES}/{SAMPLES} samples over 3 host(s) (3 succeeded)" in total.stdout, total.stdout

    # Each shard's states are transformers' own, and each file is the one-host run's sample of its index.
    shards = [str(host_path(fleet, host, "out/" + out.rsplit("/", 1)[1])) for host in HOSTS]
    for shard in shards:
        report = runnable.run_program("hidden_states_reference.py", shard, str(runnable.model))
        assert report["bad_shapes"] == [] and max(report["max_abs_diff"].values()) < TOLERANCE, report
    assert wait_until_ended(whole_run, "lab-1")["lab-1"]["state"] == SUCCEEDED
    same = runnable.run_program("same_samples.py", str(host_path(fleet, "lab-1", "out/" + whole.rsplit("/", 1)[1])),
                                *shards)
    assert same["compared"] == SAMPLES and same["differing_input_ids"] == [] and same["absent"] == [], same
    assert same["max_state_diff"] < TOLERANCE, same
    LAUNCHED.clear()


def test_stop_of_the_whole_fleet_run_leaves_every_host_clean_and_one_host_resumes_alone(fleet, out):
    sharded_run_id = launch(out)
    code, stopped = inv_json("stop", "--host", GROUP, "--run", sharded_run_id, timeout=CALL_TIMEOUT_S)
    assert code == 0, stopped
    for host in HOSTS:
        result = stopped[host]["result"]
        assert result["clean"] and result["left"] == [] and result["state"] == STOPPED, (host, result)
    assert {run["state"] for run in runs(sharded_run_id).values()} == {STOPPED}

    # One host of it, by the sharded-run id: only that host's run restarts.
    code, resumed = inv_json("resume", "--host", "lab-3", "--run", sharded_run_id, timeout=CALL_TIMEOUT_S)
    assert code == 0 and resumed["resumed_from"] == STOPPED, resumed
    code, stopped = inv_json("stop", "--host", "lab-3", "--run", sharded_run_id, timeout=CALL_TIMEOUT_S)
    assert code == 0 and stopped["clean"] and stopped["was"] in ACTIVE_STATES, stopped
    assert {run["state"] for run in runs(sharded_run_id).values()} == {STOPPED}
    LAUNCHED.clear()


def test_a_failed_preflight_launches_nothing_on_any_host(fleet, out):
    before = {host: len(record["result"]["runs"])
              for host, record in inv_json("status", "--host", GROUP, timeout=CALL_TIMEOUT_S)[1].items()}
    # More tokens than the tiny model has positions: a finding of every host's preflight (a model that is
    # not there at all is bad input, refused before any check: test_hfcache.py).
    too_long = [*SETTINGS[:-1], "4096"]
    result = inv("extract", "--host", GROUP, *too_long, "--out", out, "--detach", env={"COLUMNS": "200"})
    assert result.returncode == ExitStatus.FINDINGS, result.stdout + result.stderr
    assert "nothing was launched: the preflight failed on lab-1, lab-2, lab-3" in result.stdout
    after = {host: len(record["result"]["runs"])
             for host, record in inv_json("status", "--host", GROUP, timeout=CALL_TIMEOUT_S)[1].items()}
    assert after == before


# ---- the union's arithmetic (no lab) ---------------------------------------------------------------

def test_the_union_names_missing_duplicated_out_of_range_and_unloadable_indices():
    from specrig.group import HostOutcome
    from specrig.run.sharded_runs import ranges, union

    def shard(host, indices, total, state=SUCCEEDED, unloadable=()):
        return HostOutcome(host, ExitStatus.OK, 0.1, result={"state": state, "indices": indices,
                                                             "unloadable": list(unloadable),
                                                             "dataset_samples": total})

    whole = union([shard("a", [0, 2, 4], 6), shard("b", [1, 3, 5], 6)])
    assert whole["complete"] and whole["problems"] == [] and whole["samples"] == 6
    broken = union([shard("a", [0, 2, 4, 9], 6, unloadable=[{"index": 4, "reason": "EOF"}]),
                    shard("b", [1, 2], None, state=RUNNING),
                    HostOutcome("c", ExitStatus.CONNECTION, 0.1)])
    assert not broken["complete"]
    assert broken["missing"] == [3, 5] and broken["duplicated"] == {"2": ["a", "b"]}
    assert broken["out_of_range"] == [9] and broken["unloadable"] == [{"host": "a", "index": 4, "reason": "EOF"}]
    assert broken["problems"][:3] == ["still running on b", "no answer from c", "2 missing: 3, 5"]
    assert ranges([7, 1, 2, 3, 5]) == "1-3, 5, 7"
    unknown = union([shard("a", [], None)])
    assert not unknown["complete"] and "sample count is unknown" in unknown["problems"][0]
    # No answer at all: that is the one problem, not a data_config.json that no shard wrote.
    assert union([HostOutcome("c", ExitStatus.CONNECTION, 0.1)])["problems"] == ["no answer from c"]


def test_shards_of_other_layers_dtypes_storage_or_models_are_not_merged():
    """gather refuses to call shards one dataset when their layer ids, storage dtype, storage type or model differ
    (issue 17)."""
    from specrig.group import HostOutcome
    from specrig.run.sharded_runs import union

    model = {"snapshot": None, "config_sha256": "0123456789abcdef"}

    def shard(host, indices, **identity):
        identity = {"layer_ids": [2, 4, 5, 8], "dtype": "BF16", "model": model, **identity}
        return HostOutcome(host, ExitStatus.OK, 0.1, result={"state": SUCCEEDED, "indices": indices, "unloadable": [],
                                                             "dataset_samples": 4, "identity": identity})

    assert union([shard("a", [0, 1]), shard("b", [2, 3])])["complete"]
    mixed = union([shard("a", [0, 1]), shard("b", [2], layer_ids=[3, 4, 5, 8]),
                   shard("c", [3], dtype="F8_E4M3", model=dict(model, config_sha256="fedcba9876543210"))])
    assert not mixed["complete"] and mixed["missing"] == []
    assert mixed["problems"] == [
        "the shards differ in layer ids, so they are not one dataset: a, c: [2, 4, 5, 8]; b: [3, 4, 5, 8]",
        'the shards differ in storage dtype, so they are not one dataset: a, b: "BF16"; c: "F8_E4M3"',
        'the shards differ in model (snapshot, config.json), so they are not one dataset: a, b: '
        '{"config_sha256": "0123456789abcdef", "snapshot": null}; c: {"config_sha256": "fedcba9876543210", '
        '"snapshot": null}']
    # fp8 and bf16 shards of one model and layers: the storage type is named (in-process shards report none).
    stored = union([shard("a", [0, 1], storage="bf16"), shard("b", [2, 3], dtype="F8_E4M3", storage="fp8")])
    assert not stored["complete"] and stored["problems"] == [
        'the shards differ in storage dtype, so they are not one dataset: a: "BF16"; b: "F8_E4M3"',
        'the shards differ in storage type (--storage), so they are not one dataset: a: "bf16"; b: "fp8"']


def test_each_host_gets_its_shard_and_its_own_output_directory(make_inventory):
    from specrig.inventory import load_inventory
    from specrig.run.sharded_runs import shard_requests

    entry = {"hostname": "h", "extract": {"model": "/m", "data": "/d.jsonl", "out": "/data/{host}/out"}}
    inventory = load_inventory(make_inventory({"hosts": {"x": entry, "y": entry}}))
    requests = shard_requests([inventory.host("y"), inventory.host("x")], {"batch_size": 1})
    assert [(r.driver_args["shard_index"], r.driver_args["shard_count"], r.driver_args["output_dir"])
            for r in requests.values()] == [(0, 2, "/data/y/out"), (1, 2, "/data/x/out")]


def test_shared_out_needs_one_path_on_every_host(make_inventory):
    from specrig.errors import UsageError
    from specrig.inventory import load_inventory
    from specrig.run.sharded_runs import shard_requests

    entry = {"hostname": "h", "extract": {"model": "/m", "data": "/d.jsonl", "out": "/data/{host}/out"}}
    inventory = load_inventory(make_inventory({"hosts": {"x": entry, "y": entry}}))
    hosts = [inventory.host("y"), inventory.host("x")]
    with pytest.raises(UsageError, match=r"^--shared-out: the shards' output directories differ \(/data/x/out, "
                                         r"/data/y/out\); one shared directory is one path on every host$"):
        shard_requests(hosts, {}, shared_out=True)
    assert {r.driver_args["output_dir"] for r in shard_requests(hosts, {"out": "/shared/out"},
                                                                 shared_out=True).values()} == {"/shared/out"}


def test_shared_out_on_one_host_is_refused_in_one_line():
    done = inv("extract", "--host", "lab", "--shared-out")
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: --shared-out: 'lab' is one host; one shared directory is for the shards of several (name a group "
        "or a comma list in --host, or drop --shared-out)"), done.stderr


def test_the_driver_takes_a_shard_by_global_index_and_refuses_half_a_shard(tmp_path):
    from run.driver.arguments import Refused, load_arguments
    from run.driver.extraction import resume_settings, shard_indices

    assert shard_indices(10, {"shard_index": None, "shard_count": None}) == list(range(10))
    assert shard_indices(10, {"shard_index": 1, "shard_count": 3}) == [1, 4, 7]
    assert sorted(i for k in range(3) for i in shard_indices(10, {"shard_index": k, "shard_count": 3})) \
        == list(range(10))
    (tmp_path / "model").mkdir()
    base = {"model": str(tmp_path / "model"), "dataset": "sharegpt", "output_dir": str(tmp_path / "out"),
            "batch_size": 1}
    for shard, message in (({"shard_index": 0}, "give both"), ({"shard_index": 3, "shard_count": 3}, "0 .. "),
                           ({"shard_index": 0, "shard_count": 0}, "0 .. ")):
        path = tmp_path / "args.json"
        path.write_text(json.dumps({**base, **shard}))
        with pytest.raises(Refused, match=message):
            load_arguments(str(path))
    path.write_text(json.dumps(base))
    one_host = load_arguments(str(path))
    assert "shard_index" not in resume_settings(one_host, [1, 2])  # one host's data_config.json as before
    path.write_text(json.dumps({**base, "shard_index": 2, "shard_count": 3}))
    assert resume_settings(load_arguments(str(path)), [1, 2])["shard_index"] == 2


def test_each_shard_keeps_where_its_settings_came_from(make_inventory):
    """The layers line of a sharded launch says whether --layers chose the ids or hosts.yaml set them."""
    from specrig.inventory import load_inventory
    from specrig.run.sharded_runs import shard_requests

    entry = {"hostname": "h", "extract": {"model": "/m", "data": "/d.jsonl", "out": "/data/{host}/out"}}
    chosen = {**entry, "extract": {**entry["extract"], "layers": [1, 2, 3]}}
    inventory = load_inventory(make_inventory({"hosts": {"x": chosen, "y": entry}}))
    requests = shard_requests([inventory.host("x"), inventory.host("y")], {})
    assert requests["x"].sources["layers"] == "hosts.yaml: hosts.x.extract.layers"
    assert "layers" not in requests["y"].driver_args
    given = shard_requests([inventory.host("x"), inventory.host("y")], {"layers": [4, 5]})
    assert {name: request.sources["layers"] for name, request in given.items()} == {"x": "--layers", "y": "--layers"}
