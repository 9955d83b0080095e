"""Slurm's preflight as data (remote/slurm/partition_fit.py): sinfo's real text (tests/fixtures/slurm/) and
hosts.yaml's `slurm:` settings in, the problems out; a request some named partition can hold is none."""
from pathlib import Path

import pytest

from slurm import cluster, partition_fit
from specrig.contract import SLURM_SETTINGS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def partitions(name: str) -> list[dict]:
    return cluster.parse_partitions((FIXTURES / f"{name}.sinfo").read_text())


def settings(**given) -> dict:
    return {**{name: spec["default"] for name, spec in SLURM_SETTINGS.items()}, **given}


# (case, cluster, settings, [(check, partition)] of the problems)
CASES = [
    ("lab default partition", "lab", {}, []),
    ("lab two nodes, a gpu each, in the limit", "lab", {"nodes": 2, "gres": "gpu:1", "time": "02:00:00"}, []),
    ("lab partition missing", "lab", {"partition": "gpus"}, [("partition", "gpus")]),
    ("lab three gpus a node", "lab", {"gres": "gpu:3"}, [("gres", "gpu")]),
    ("lab three nodes", "lab", {"nodes": 3}, [("nodes", "gpu")]),
    ("lab debug over its limit", "lab", {"partition": "debug", "time": 30}, [("time", "debug")]),
    ("lab debug one node only", "lab", {"partition": "debug", "nodes": 2, "time": "1-00"},
     [("nodes", "debug"), ("time", "debug")]),
    ("lab second partition fits", "lab", {"partition": "debug,gpu", "nodes": 2}, []),
    ("lab no listed partition fits", "lab", {"partition": "debug,gpu", "nodes": 3},
     [("nodes", "debug"), ("nodes", "gpu")]),
    ("hopper typed gpus", "hopper", {"gres": "gpu:h100:8", "nodes": 8}, []),
    ("hopper only 8 H100 nodes", "hopper", {"gres": "gpu:h100:8", "nodes": 9}, [("nodes", "gpu")]),
    ("hopper untyped gpus count every node", "hopper", {"gres": "gpu:4", "nodes": 10}, []),
    ("hopper no such gpu type", "hopper", {"gres": "gpu:b200:8"}, [("gres", "gpu")]),
    ("hopper A100 nodes hold 4", "hopper", {"gres": "gpu:a100:8"}, [("gres", "gpu")]),
    ("hopper a week in gpu-long", "hopper", {"partition": "gpu-long", "time": "7-00:00:00"}, []),
    ("hopper a week in gpu", "hopper", {"time": "7-00:00:00"}, [("time", "gpu")]),
    ("hopper no limit on cpu", "hopper", {"partition": "cpu", "time": "30-00", "nodes": 16}, []),
    ("hopper gpus on cpu", "hopper", {"partition": "cpu", "gres": "gpu:1"}, [("gres", "cpu")]),
    ("hopper nic beside gpus", "hopper", {"partition": "maint", "gres": "gpu:8,nic:1", "time": 30}, []),
]


@pytest.mark.parametrize("name,given,expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_preflight_finds_what_could_never_run(name, given, expected):
    found = partition_fit.problems(settings(**given), partitions(name))
    assert [(problem["check"], problem["partition"]) for problem in found] == expected
    for problem in found:
        assert problem["message"] and problem["fix"]


def test_a_cluster_without_a_default_partition_needs_one_named():
    found = partition_fit.problems(settings(), [dict(partition, default=False) for partition in partitions("lab")])
    assert [problem["check"] for problem in found] == ["partition"]
    assert "debug, gpu" in found[0]["fix"]


def test_sinfo_lines_add_up_per_partition():
    gpu = {partition["name"]: partition for partition in partitions("hopper")}["gpu"]
    assert gpu["default"] and gpu["time_limit_s"] == 86400 and gpu["gpus_per_node"] == 8
    assert gpu["nodes"] == {"allocated": 7, "idle": 2, "other": 1, "total": 10}
    assert [kind["nodes"] for kind in gpu["node_kinds"]] == [8, 2]
