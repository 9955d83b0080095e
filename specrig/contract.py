"""The contracts shared with the host side: remote/base/contract.py (and remote/base/versions.py), loaded from their files.

remote/ is not a package of the laptop side (it runs on the host's own Python, from the bundle),
so the one definition is read from where the bundle takes it: a checkout's remote/ or an
installed copy's package data (specrig.paths).
"""
from __future__ import annotations

import importlib.util

from specrig.paths import remote_dir


def load_host_module(path: str):
    """A module of remote/ loaded from its file (`path` without .py: "base/contract", "run/storage"),
    for one that imports nothing the laptop lacks."""
    spec = importlib.util.spec_from_file_location("specrig._host." + path.replace("/", "."),
                                                  remote_dir() / f"{path}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The one byte formatter of both sides, in IEC units ("59.5 GiB"; remote/base/units.py).
human_bytes = load_host_module("base/units").human_bytes
#: The one PEP 440 parser (remote/base/versions.py), for versions the user gives on this side too.
_versions = load_host_module("base/versions")
_contract = load_host_module("base/contract")
_contract.versions = _versions  # what `from base import versions` finds on a host (remote/ on sys.path)
Version = _versions.Version
InvalidVersion = _versions.InvalidVersion
#: Whether a version is in a patchset's range (patchsets/README.md, "Version ranges"): the engine's own rule.
in_range = _versions.in_range

SENTINEL: str = _contract.SENTINEL
# The run states (remote/base/contract.py names each once).
STARTING: str = _contract.STARTING
RUNNING: str = _contract.RUNNING
RESTARTING: str = _contract.RESTARTING
STALLED: str = _contract.STALLED
SUCCEEDED: str = _contract.SUCCEEDED
FAILED: str = _contract.FAILED
STOPPED: str = _contract.STOPPED
LOST: str = _contract.LOST
UNRESPONSIVE: str = _contract.UNRESPONSIVE
ACTIVE_STATES: tuple[str, ...] = _contract.ACTIVE_STATES
FINAL_STATES: tuple[str, ...] = _contract.FINAL_STATES
# What a run does (run.json "kind") and the defaults of a training's and an acceptance's launch.
KIND_TRAIN: str = _contract.KIND_TRAIN
KIND_ACCEPT: str = _contract.KIND_ACCEPT
TRAIN_CHECKPOINT_MINUTES: float = _contract.TRAIN_CHECKPOINT_MINUTES
ACCEPT_DEFAULTS: dict = _contract.ACCEPT_DEFAULTS
DRIVER_DEFAULTS: dict = _contract.DRIVER_DEFAULTS
DRIVER_REQUIRED: tuple[str, ...] = _contract.DRIVER_REQUIRED
SUPERVISOR_DEFAULTS: dict = _contract.SUPERVISOR_DEFAULTS
SERVER_DEFAULTS: dict = _contract.SERVER_DEFAULTS
STAGING_MARGIN: int = _contract.STAGING_MARGIN
stored_bytes_per_token = _contract.stored_bytes_per_token
#: Server mode's storage types of the hidden states (remote/base/contract.py STORAGES).
STORAGES: tuple[str, ...] = _contract.STORAGES
HS_CONNECTORS: str = _contract.HS_CONNECTORS
COMPILED_SUFFIXES: tuple[str, ...] = _contract.COMPILED_SUFFIXES
COMPILED_MANIFEST: str = _contract.COMPILED_MANIFEST
# The extraction modes, and the one rule that picks a speculators release's (remote/base/contract.py).
IN_PROCESS: str = _contract.IN_PROCESS
REPOSITORY_SCRIPTS: str = _contract.REPOSITORY_SCRIPTS
SERVER: str = _contract.SERVER
extraction_mode = _contract.extraction_mode
# Slurm: the schedulers hosts.yaml's `scheduler:` takes, and its `slurm:` settings (remote/base/contract.py).
SLURM: str = _contract.SLURM
SCHEDULERS: tuple[str, ...] = _contract.SCHEDULERS
SLURM_SETTINGS: dict = _contract.SLURM_SETTINGS
# Where a verify report came from: its "cache" state (remote/base/contract.py).
CACHE_HIT: str = _contract.CACHE_HIT
CACHE_MISS: str = _contract.CACHE_MISS
CACHE_BYPASSED: str = _contract.CACHE_BYPASSED
