"""Shared fixtures and hooks: the real lab host (built by `inv lab.up`), inventories, markers. What
tests import lives in tests/support/."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from support.lab import lab_is_up, require_lab
from support.patchenv import patch_env  # noqa: F401 (a fixture, for the patching tests)
from support.paths import REPO

sys.path.insert(0, str(REPO / "remote"))  # remote/ modules are plain stdlib modules: test them directly


def pytest_collection_modifyitems(items):
    """Markers from what a test needs, so that none is forgotten: `lab` for every test using the
    `lab` fixture, `runnable` (and `slow`: they load models) for tests of modules importing
    tests/support/runnable_env.py, which needs `inv lab.up --runnable`; and `lab` for every test marked
    `runnable` by hand (it reads the lab's environments on this machine without asking for the host), so that
    `-m 'not lab'` selects only tests that need nothing `inv lab.up` builds."""
    for item in items:
        if item.get_closest_marker("runnable") and not item.get_closest_marker("lab"):
            item.add_marker("lab")
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker("lab")
            module = getattr(item, "module", None)
            if module is not None and "runnable_env_or_skip" in vars(module):
                item.add_marker("runnable")
                item.add_marker("slow")


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


@pytest.fixture
def trusted_known_hosts():
    """Copy the project known_hosts (holding the lab's key) into an inventory directory."""

    def copy(inventory: Path) -> None:
        target = inventory.parent / ".specrig" / "known_hosts"
        target.parent.mkdir(exist_ok=True)
        shutil.copy(REPO / ".specrig" / "known_hosts", target)

    return copy
