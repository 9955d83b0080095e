"""hosts.yaml's `scheduler:` and `slurm:`: each value checked before anything reaches a host.

The names and defaults are remote/base/contract.py's SLURM_SETTINGS; Slurm's time and memory formats are
remote/slurm/formats.py's, the same the host reads sinfo with. Every bad value is one InventoryError
naming the key, the value (`!r`) and the fix, as the rest of hosts.yaml.

Part of the inventory's schema, so it stands beside the inventory at the top of specrig/, below every
stage: the Slurm stage (specrig/slurm/) stands above the inventory and the transport it uses.
"""
from __future__ import annotations

import re

from specrig.contract import SCHEDULERS, SLURM, load_host_module
from specrig.contract import SLURM_SETTINGS as SETTINGS

formats = load_host_module("slurm/formats")
#: Names of partitions, accounts and QOS: what Slurm's tools print, no spaces or separators.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
#: An interface name (Linux: at most 15 characters), what NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME take.
INTERFACE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
#: The sbatch options the settings themselves set: extra_sbatch may not set them a second time.
OWNED_OPTIONS = {spec["sbatch"]: name for name, spec in SETTINGS.items() if spec["sbatch"]}


def check_scheduler(fields: dict, where: str, fail) -> None:
    """A host's `scheduler:` and `slurm:` together (after `defaults:`): `slurm:` needs `scheduler: slurm`."""
    scheduler = fields.get("scheduler")
    if scheduler is not None and scheduler not in SCHEDULERS:
        raise fail(f"{where}.scheduler", f"unknown scheduler {scheduler!r}",
                   hint=f"use {', '.join(SCHEDULERS)}, or leave it out for a host reached over SSH alone")
    if fields.get("slurm") and scheduler != SLURM:
        raise fail(f"{where}.slurm", f"slurm settings on a host whose scheduler is {scheduler!r}",
                   hint="add `scheduler: slurm` to the host, or remove its `slurm:`")


def check_slurm(settings: dict, where: str, fail) -> dict:
    """`slurm:` checked, with every setting's default filled in."""
    for key, value in settings.items():
        if key not in SETTINGS:
            raise fail(f"{where}.{key}", "unknown key", hint=f"allowed: {', '.join(SETTINGS)}")
        if value is not None:
            _check_value(key, value, f"{where}.{key}", fail)
    return {name: settings.get(name, spec["default"]) for name, spec in SETTINGS.items()}


def _check_value(key: str, value, where: str, fail) -> None:
    """One setting's value; None (YAML's `~`) leaves it to the cluster."""
    if key in ("partition", "account", "qos"):
        _check_names(value, where, fail, several=key == "partition")
    elif key == "gres":
        _check_gres(value, where, fail)
    elif key == "time":
        _check_time(value, where, fail)
    elif key in ("nodes", "cpus_per_task"):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise fail(where, f"expected a whole number from 1, got {value!r}")
    elif key == "mem":
        if isinstance(value, bool) or not formats.MEMORY.match(str(value)):
            raise fail(where, f"{value!r} is not a Slurm memory size",
                       hint="megabytes, or a number with K, M, G or T: 512000, 64G")
    elif key == "constraint":
        if not isinstance(value, str) or not value.strip() or not value.isprintable():
            raise fail(where, f"expected a Slurm constraint expression, got {value!r}", hint="e.g. h100 or a100&ib")
    elif key == "extra_sbatch":
        _check_extra(value, where, fail)
    elif key == "fabric_interface":
        if not isinstance(value, str) or not INTERFACE.match(value):
            raise fail(where, f"{value!r} is not a network interface name",
                       hint="the fast fabric's interface as `ip link` names it, e.g. ib0 or enp65s0f0")


def _check_names(value, where: str, fail, *, several: bool) -> None:
    names = value.split(",") if several and isinstance(value, str) else [value]
    if not all(isinstance(name, str) and NAME.match(name) for name in names):
        kind = "partition name (or a comma list of them)" if several else "name"
        raise fail(where, f"expected a Slurm {kind}, got {value!r}", hint="as sinfo or sacctmgr prints it")


def _check_gres(value, where: str, fail) -> None:
    try:
        # Sockets in parentheses are sinfo's, never a request's.
        requested = formats.gres(value) if isinstance(value, str) and "(" not in value else None
    except ValueError:
        requested = None
    if not requested or any(count < 1 for _, _, count in requested):
        raise fail(where, f"{value!r} is not a gres request", hint="name[:type]:count, e.g. gpu:8 or gpu:h100:8")


def _check_time(value, where: str, fail) -> None:
    try:
        limit = formats.seconds(value)
    except ValueError:
        raise fail(where, f"{value!r} is not a Slurm time", hint=f"use {formats.TIME_FORMATS}, e.g. 04:00:00") from None
    if limit is not None and limit <= 0:
        raise fail(where, f"time {value!r} is no time at all", hint="give the job's limit, e.g. 04:00:00")


def _check_extra(value, where: str, fail) -> None:
    if not isinstance(value, list):
        raise fail(where, f"expected a list of sbatch options, got {value!r:.60}", hint="e.g. ['--exclusive']")
    for index, option in enumerate(value):
        if not isinstance(option, str) or not option.startswith("--") or not option.isprintable():
            raise fail(f"{where}[{index}]", f"expected an sbatch long option (--name or --name=value), got {option!r}")
        owner = OWNED_OPTIONS.get(option.split("=", 1)[0])
        if owner:
            raise fail(f"{where}[{index}]", f"{option!r} sets what slurm.{owner} sets",
                       hint=f"use slurm.{owner} instead")
