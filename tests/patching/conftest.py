"""The lab host with two environments, each a private copy: what the patch tests of such hosts share."""
from __future__ import annotations

import hashlib
import shutil

import pytest

from support.lab import lab_entry, require_lab
from support.patchenv import lab_home
from support.runnable_env import clean_venv_copy, patch_targets
from support.shared_envs import one_at_a_time


def _site(prefix):
    return next((prefix / "lib").glob("python3*/site-packages"))


def _targets_sha256(prefix) -> dict:
    """{path: sha256} of every file a patchset may write that this environment holds."""
    site = _site(prefix)
    return {path: hashlib.sha256((site / path).read_bytes()).hexdigest()
            for paths in patch_targets().values() for path in sorted(paths) if (site / path).exists()}


@pytest.fixture
def server_env(lab, make_inventory, trusted_known_hosts):
    """(inventory, client prefix, server prefix): lab-server with its `python` and its `server_python` private
    copies of venv-spec-0.9 and venv-cpu-0.32 (runnable_env.clean_venv_copy: the patch targets get inodes of
    their own, taken from the wheels), so that the shared venvs, which other tests run, are never patched.
    It holds the suite's turn at patching the shared venvs (shared_envs.one_at_a_time) throughout: a test of
    the other process may patch them (ensure_patched) at any moment, and would otherwise change them under
    the copy and between the two looks that check that this test did not."""
    shared_client, shared_server = lab_home() / "venv-spec-0.9", lab_home() / "venv-cpu-0.32"
    missing = [str(p) for p in (shared_client / "bin" / "python", shared_server / "bin" / "python")
               if not p.exists()]
    require_lab(not missing, f"server-mode lab envs not built ({', '.join(missing)} missing): "
                             f"run `inv lab.up --runnable`")
    with one_at_a_time():
        shared_hashes = {venv: _targets_sha256(venv) for venv in (shared_client, shared_server)}
        client, prefix = clean_venv_copy(shared_client), clean_venv_copy(shared_server)
        inventory = make_inventory({"hosts": {"lab-server": lab_entry(
            python=str(client / "bin" / "python"), server_python=str(prefix / "bin" / "python"),
            description="lab-server with private environments")}})
        trusted_known_hosts(inventory)
        try:
            yield inventory, client, prefix
        finally:
            shutil.rmtree(prefix, ignore_errors=True)
            shutil.rmtree(client, ignore_errors=True)
            assert {venv: _targets_sha256(venv) for venv in shared_hashes} == shared_hashes, \
                "the shared venvs must never be patched by these tests"
