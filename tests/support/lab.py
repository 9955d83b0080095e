"""The lab host and the CLI, as tests use them: is the lab built, skip or fail without it, the lab's
hosts.yaml entry, and real `inv` runs of this checkout."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from specrig.lab import fleet as lab_fleet
from specrig.lab.machine import process_running
from support.paths import REPO

LAB_READY = Path("/var/lib/specrig-lab/READY")


def lab_is_up() -> bool:
    return LAB_READY.exists()


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
    SPECRIG_REQUIRE_LAB=1, fail it: CI builds every part, so a skip there would hide a broken lab.
    Under SPECRIG_LAB_BEING_BUILT=1 (.ci/tests runs the tests marked `not lab` while `inv lab.up` builds it)
    it fails whatever `condition` is: a test that asks for the lab must be marked `lab`, or it would pass
    or fail by how far the build had got."""
    if os.environ.get("SPECRIG_LAB_BEING_BUILT"):
        pytest.fail(f"this test needs the lab ({message}) but is not marked `lab`: ask for the `lab` fixture")
    if condition:
        return
    if os.environ.get("SPECRIG_REQUIRE_LAB"):
        pytest.fail(message)
    pytest.skip(message)


def lab_entry(**overrides) -> dict:
    """The lab host's hosts.yaml entry with an absolute key path, for inventories elsewhere."""
    entry = yaml.safe_load((REPO / "hosts.yaml").read_text())["hosts"]["lab"]
    entry["identity_file"] = str(REPO / entry["identity_file"])
    entry.update(overrides)
    return entry


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


def launch_failing_run(host: str = "lab") -> str:
    """Launch a run on the lab's analysis-only venv (no torch): it fails at once, a missing package that
    would repeat, so it is not restarted. Its run id."""
    out = f"~/specrig-work/test-out/{uuid.uuid4().hex[:12]}"
    launched = inv("extract", "--host", host, "--model", "~/venv", "--data", "sharegpt", "--out", out,
                   "--batch-size", "4", "--skip-preflight", "--detach")
    assert launched.returncode == 0, launched.stderr
    return launched.stdout.split("launched run ", 1)[1].split()[0]


def wait_for(what, predicate, timeout=600, interval=1.0):
    """The first truthy value of predicate(), polled every `interval` s; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@contextlib.contextmanager
def phase(name: str):
    """Assertions of one phase of a scenario on one run: a failure says which phase it was."""
    try:
        yield
    except AssertionError as failed:
        raise AssertionError(f"phase {name!r} failed: {failed}") from failed


# ---- fleet hosts of a test's own (above lab.FLEET_MAX: the shared lab-1 ... lab-N are others' too) ------

#: In a claimed host's directory: the pid of the test process that owns it.
OWNER = "owner.pid"


def quiet(line: str) -> None:
    pass


def claim_spare() -> int:
    """A fleet number of our own above FLEET_MAX: its directory, made atomically, is the claim
    (suites running side by side each get their own). Spares a killed suite left (their owner
    process is gone) are removed first."""
    lab_fleet.FLEET.mkdir(parents=True, exist_ok=True)
    spares = range(lab_fleet.FLEET_MAX + 1, 255)
    for number in spares:
        try:
            owner = int((lab_fleet.fleet_state(number) / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if not process_running(owner):
            lab_fleet.remove_fleet_host(number, log=quiet)
    for number in spares:
        try:
            lab_fleet.fleet_state(number).mkdir()
        except FileExistsError:
            continue
        (lab_fleet.fleet_state(number) / OWNER).write_text(f"{os.getpid()}\n")
        return number
    pytest.fail(f"no spare fleet address left under {lab_fleet.FLEET}: `inv lab.down` clears them")


def known_hosts_line(number: int) -> str:
    key_type, key_b64 = (lab_fleet.fleet_state(number) / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    return f"[{lab_fleet.fleet_address(number)}]:{lab_fleet.FLEET_PORT} {key_type} {key_b64}\n"


@contextlib.contextmanager
def host_of_its_own(*, private: tuple[Path, ...] = ()):
    """A running fleet host of this test's own (claim_spare), with `private` directories only it sees,
    each an empty tmpfs (lab.start_fleet_host): (its number, its name); an inventory naming it adds
    known_hosts_line(number) to its known_hosts. Stopped and removed afterwards; its private view ends
    with its sshd, so nothing it wrote there is left anywhere."""
    require_lab(os.geteuid() == 0, "starting lab sshds needs root: run the suite as root")
    number = claim_spare()
    try:
        lab_fleet.start_fleet_host(number, private=private, log=quiet)
        yield number, lab_fleet.fleet_name(number)
    finally:
        lab_fleet.remove_fleet_host(number, log=quiet)
