"""Shared pieces of the server-mode lab tests (test_server_runs_lab, test_fleet_server_lab,
test_multinode_lab): lab-server's environments on the fleet hosts, a run's files read directly, and
the stored states compared with transformers' own forward."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from specrig.lab import fleet as lab_fleet
from support.paths import REPO
from support.runnable_env import HOME
from support.shared_envs import ensure_patched

CLIENT = HOME / "venv-spec-0.9"
MODEL = HOME / "models" / "tiny-llama"
#: lab-server's default layer ids on the tiny model (L = 8): [2, L // 2, L - 3, L].
LAYERS = [2, 4, 5, 8]
#: bf16 keeps 8 bits of mantissa: a few ulps of the largest value.
TOLERANCE = 2 ** -6
#: fp8 storage (float8_e4m3fn, one scale per token): each value's relative rounding error is at most 2^-4
#: (3 mantissa bits, round to nearest: half of the 2^-3 spacing), so a sample's relative L2 error from the
#: quantization alone is at most 2^-4 (values under the smallest normal, 2^-6 x scale, round with an absolute
#: error of 2^-10 x scale = amax / 458752: under 5e-5 of the token's norm for 512 values); training's
#: dequantization in bf16 adds 2^-9. What the server computes differs from transformers' forward by bf16 rounding
#: (measured on the lab's bf16 files: relative L2 0.007 at most, layer 8): 2^-6 is left for it.
FP8_REL_L2 = 2 ** -4 + 2 ** -6
#: What every lab server's environment holds beside its KV cache's size: lab-server's hosts.yaml `env:`, whose
#: comment says why.
LAB_SERVER_ENV = {name: value for name, value in
                  yaml.safe_load((REPO / "hosts.yaml").read_text())["hosts"]["lab-server"]["env"].items()
                  if name != "VLLM_CPU_KVCACHE_SPACE"}


def require_server_fleet(hosts: list[str]) -> dict:
    """The fleet hosts' entries of .lab/fleet.yaml, once server mode's environments are built and
    lab-server's server venv (which the fleet hosts share here) is patched; else the test is skipped."""
    if not (CLIENT / "bin" / "python").exists() or lab_fleet.fleet_size() < len(hosts):
        pytest.skip(f"needs `inv lab.up --runnable --hosts {len(hosts)}` (server mode's environments and "
                    f"{len(hosts)} fleet hosts)")
    ensure_patched("lab-server")
    return yaml.safe_load((REPO / ".lab" / "fleet.yaml").read_text())["hosts"]


def server_fleet_inventory(directory: Path, fleet: dict, hosts: list[str], *, extract, **entry) -> Path:
    """hosts.yaml in `directory` holding `hosts` in server mode (lab-server's python and server_python),
    `extract(number)` over each one's `extract:`, `entry` over each entry, group `pair`; the project
    known_hosts beside it."""
    written = {}
    for number, host in enumerate(hosts):
        written[host] = dict(fleet[host], identity_file=str(REPO / ".lab" / "client_key"),
                             python="~/venv-spec-0.9/bin/python", server_python="~/venv-server-0.32/bin/python",
                             **entry)
        written[host]["env"] = dict(written[host].get("env") or {}, **LAB_SERVER_ENV)
        written[host]["extract"] = dict(fleet[host]["extract"], **extract(number))
    inventory = directory / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": written, "groups": {"pair": hosts}}))
    (directory / ".specrig").mkdir()
    shutil.copy(REPO / ".specrig" / "known_hosts", directory / ".specrig" / "known_hosts")
    return inventory


def run_files(run: Path) -> dict:
    """A run's status.json and heartbeat.json as the host has them, read directly (the lab is this
    machine), so that a wait polls in tenths of a second; the exit record's state once there is one."""

    def read(name):
        try:
            return json.loads((run / name).read_text())
        except (OSError, ValueError):  # not written yet
            return {}

    exit_record = read("exit.json")
    return dict(read("status.json"), heartbeat=read("heartbeat.json"),
                **({"state": exit_record["state"]} if exit_record else {}))


def reference_measures(out: Path, files: int) -> dict:
    """What tests/programs/server_hidden_states_reference.py measured on `out` (fp8 files dequantized as
    training reads them): every file there read, none with a problem."""
    reference = subprocess.run([str(CLIENT / "bin" / "python"),
                                str(REPO / "tests" / "programs" / "server_hidden_states_reference.py"),
                                str(out), str(MODEL), ",".join(map(str, LAYERS))],
                               capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert reference.returncode == 0, reference.stderr[-3000:]
    measured = json.loads(reference.stdout.strip().splitlines()[-1])
    assert measured["files"] == files and not measured["problems"], measured
    return measured


def states_against_transformers(out: Path, files: int) -> dict:
    """reference_measures() of `out`, each stored id k equal to the input of decoder layer k (docs/server-mode.md
    §3, §12) within TOLERANCE; what it measured."""
    measured = reference_measures(out, files)
    for k in LAYERS:
        assert measured["max_abs_diff"]["input"][str(k)] <= TOLERANCE * measured["max_abs_value"], measured
    return measured
