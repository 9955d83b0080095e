"""Shared fixtures: the real lab host (built by `inv lab.up`), inventories, the CLI."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
#: Real nvidia-smi output of a 2x H200 machine, idle and under load: copied from
#: ../shared/fixtures so that a clone anywhere (CI) runs the telemetry tests; test_fixtures_sync
#: keeps the copy equal to the original where that is present.
H200X2 = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200x2"
LAB_READY = Path("/var/lib/specrig-lab/READY")

sys.path.insert(0, str(REPO / "remote"))  # remote/ modules are plain stdlib modules: test them directly


def lab_is_up() -> bool:
    return LAB_READY.exists()


def pytest_collection_modifyitems(items):
    """Markers from what a test needs, so that none is forgotten: `lab` for every test using the
    `lab` fixture, `runnable` (and `slow`: they load models) for tests of modules importing
    tests/runnable_env.py, which needs `inv lab.up --runnable`."""
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker("lab")
            module = getattr(item, "module", None)
            if module is not None and "runnable_env_or_skip" in vars(module):
                item.add_marker("runnable")
                item.add_marker("slow")


def find_python(version: str) -> Path | None:
    """An interpreter of `version` ("3.9", "2.7"): $SPECRIG_TEST_PYTHON_<digits> (e.g.
    SPECRIG_TEST_PYTHON_39), else `pythonX.Y` on PATH, else pyenv's versions; None if none."""
    named = os.environ.get("SPECRIG_TEST_PYTHON_" + version.replace(".", ""))
    candidates = [Path(named)] if named else []
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(Path(on_path))
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(Path(root, "versions").glob(f"{version}.*/bin/python"), reverse=True)
    for candidate in candidates:
        # pyenv's shims exist for versions that are not active; ask the interpreter itself.
        try:
            answer = subprocess.run([str(candidate), "--version"], capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if re.search(rf"Python {re.escape(version)}\.", answer.stdout + answer.stderr):
            return candidate
    return None


def require_lab(condition: bool, message: str) -> None:
    """Skip the test unless `condition` (a part of the lab is built), or, under CI's
    SPECRIG_REQUIRE_LAB=1, fail it: CI builds every part, so a skip there would hide a broken lab."""
    if condition:
        return
    if os.environ.get("SPECRIG_REQUIRE_LAB"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def lab():
    """The lab's inventory; the test is skipped (failed under CI) when the lab host is not built."""
    require_lab(lab_is_up(), "lab host not built: run `inv lab.up` as root")
    from specrig.inventory import load_inventory

    return load_inventory(REPO / "hosts.yaml")


@pytest.fixture
def make_inventory(tmp_path):
    """Write a hosts.yaml in a fresh directory (own known_hosts) and return its path."""

    def make(data: dict | str) -> Path:
        path = tmp_path / "hosts.yaml"
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
        return path

    return make


def lab_entry(**overrides) -> dict:
    """The lab host's hosts.yaml entry with an absolute key path, for inventories elsewhere."""
    entry = yaml.safe_load((REPO / "hosts.yaml").read_text())["hosts"]["lab"]
    entry["identity_file"] = str(REPO / entry["identity_file"])
    entry.update(overrides)
    return entry


@pytest.fixture
def trusted_known_hosts():
    """Copy the project known_hosts (holding the lab's key) into an inventory directory."""

    def copy(inventory: Path) -> None:
        target = inventory.parent / ".specrig" / "known_hosts"
        target.parent.mkdir(exist_ok=True)
        shutil.copy(REPO / ".specrig" / "known_hosts", target)

    return copy


def inv(*args: str, inventory: Path | None = None, timeout: float = 120,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a real `inv` task of this repo, as a user would (`env`: variables to add, e.g. COLUMNS)."""
    env = {**os.environ, **(env or {})}
    if inventory:
        env["SPECRIG_HOSTS"] = str(inventory)
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=REPO)


def inv_json(*args: str, inventory: Path | None = None, timeout: float = 120) -> tuple[int, dict]:
    """`inv ... --json`: its exit status and what it printed, parsed (the whole output on a parse failure)."""
    result = inv(*args, "--json", inventory=inventory, timeout=timeout)
    try:
        return result.returncode, json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(result.stdout + result.stderr) from None

