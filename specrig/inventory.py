"""hosts.yaml: hosts by name, groups of hosts, and defaults every host inherits.

The schema is data (FIELDS): each field's type, default and meaning. Every
problem is one line naming the file, the key and the bad value, and exits 2.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specrig.errors import InventoryError
from specrig.paths import checkout_dir, config_dir
from specrig.slurm_settings import SLURM, check_scheduler, check_slurm
from specrig.yamlfile import parse_yaml

LOCAL = "local"
HOST_KEY_POLICIES = ("reject", "accept-new")


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    types: tuple
    default: Any
    help: str

    def type_names(self) -> str:
        names = {str: "a string", int: "an integer", dict: "a mapping", list: "a list", bool: "true/false"}
        return " or ".join(names[t] for t in self.types)


#: Keys of a host entry (and of `defaults`).
FIELDS = {f.name: f for f in (
    Field("hostname", (str,), None, "address or ssh_config alias (default: the entry's name)"),
    Field("port", (int,), None, "SSH port (default: ssh_config, else 22)"),
    Field("user", (str,), None, "login user (default: ssh_config, else the local user)"),
    Field("identity_file", (str,), None, "private key; ssh_config and ssh-agent otherwise"),
    Field("python", (str,), "python3", "interpreter of the environment holding speculators (and vLLM, unless "
          "server_python names the vLLM server's)"),
    Field("server_python", (str,), None, "interpreter of the vLLM server's environment, where speculators "
          "(0.8 and newer) keeps vLLM apart from itself (default: python)"),
    Field("workdir", (str,), "~/specrig", "where runs, logs and outputs live on the host"),
    Field("env", (dict,), {}, "variables for remote jobs (CUDA_VISIBLE_DEVICES, NCCL_*)"),
    Field("gpus", (int,), None, "number of GPUs the host has"),
    Field("gpu_memory_mib", (int,), None, "each GPU's memory in MiB (nvidia-smi's memory.total): with gpus, "
          "`inv extract --dry-run` sizes a run from it without reaching the host"),
    Field("host_key_policy", (str,), None, "reject unknown host keys, or accept-new (record on first use); "
          "default: ssh_config's StrictHostKeyChecking, else reject"),
    Field("extract", (dict,), {}, "defaults for `inv extract`: model, data, out, tp, layers, batch_size, ..."),
    Field("scheduler", (str,), None, "slurm: the host is a Slurm cluster's login node (docs/slurm.md)"),
    Field("slurm", (dict,), {}, "the Slurm job's settings: partition, account, qos, gres, time, nodes, "
          "cpus_per_task, mem, constraint, extra_sbatch, fabric_interface"),
    Field("description", (str,), "", "free text shown by `inv hosts`"),
)}


@dataclasses.dataclass(frozen=True)
class Host:
    """One host of the inventory, with defaults applied and paths resolved."""

    name: str
    hostname: str | None = None
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    python: str = "python3"
    #: The vLLM server's environment as hosts.yaml gives it; None: the same as `python`
    #: (server_interpreter is the one to use).
    server_python: str | None = None
    workdir: str = "~/specrig"
    env: dict = dataclasses.field(default_factory=dict)
    gpus: int | None = None
    gpu_memory_mib: int | None = None
    #: None: ssh_config's StrictHostKeyChecking decides, else unknown keys are refused.
    host_key_policy: str | None = None
    extract: dict = dataclasses.field(default_factory=dict)
    #: "slurm" (contract.SCHEDULERS): a cluster's login node; None: one machine reached over SSH.
    scheduler: str | None = None
    #: With scheduler slurm: every setting of contract.SLURM_SETTINGS, defaults filled in.
    slurm: dict = dataclasses.field(default_factory=dict)
    description: str = ""
    #: Project known_hosts file that goes with hosts.yaml (inventory.known_hosts_for).
    known_hosts: str | None = None

    @property
    def server_interpreter(self) -> str:
        """The interpreter of the vLLM server's environment: server_python, by default python."""
        return self.server_python or self.python

    @property
    def two_environments(self) -> bool:
        """Whether the vLLM server runs from an environment other than speculators' (`python`)."""
        return self.server_interpreter != self.python

    @property
    def is_local(self) -> bool:
        return self.name == LOCAL

    def describe(self) -> str:
        if self.is_local:
            return "this machine"
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.hostname or self.name}{port}"

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "server_python": self.server_interpreter}


@dataclasses.dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: dict
    groups: dict

    def host(self, name: str) -> Host:
        """The host called `name`; `local` is always there (this machine, no SSH)."""
        if name in self.hosts:
            return self.hosts[name]
        if name == LOCAL:
            return Host(name=LOCAL, python=sys.executable, workdir=str(Path.home() / "specrig"))
        raise InventoryError(f"{self.path}: no host {name!r}",
                             hint=f"known hosts: {', '.join(sorted(self.hosts)) or 'none'}, local; "
                                  f"groups: {', '.join(sorted(self.groups)) or 'none'}")

    def select(self, name: str) -> list[Host]:
        """A host, or every host of a group."""
        if name in self.groups:
            return [self.hosts[member] for member in self.groups[name]]
        return [self.host(name)]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())


#: The file named by `specrig --hosts FILE` (set by specrig.cli.program through use_hosts_file):
#: first in the lookup order. A module setting rather than an environment variable, so that a
#: missing file's error can say which of the two named it.
_hosts_flag: Path | None = None


def use_hosts_file(path: str | os.PathLike | None) -> None:
    """Make `path` this process's inventory, ahead of $SPECRIG_HOSTS (`specrig --hosts FILE`)."""
    global _hosts_flag
    _hosts_flag = Path(os.path.expanduser(path)).absolute() if path else None


def user_inventory() -> Path:
    """The user-level inventory: ~/.config/specrig/hosts.yaml (or under $XDG_CONFIG_HOME)."""
    return config_dir() / "hosts.yaml"


def locate() -> tuple[Path, str | None]:
    """The inventory to read and what named it ('--hosts', 'SPECRIG_HOSTS', or None when found).

    Order: `specrig --hosts FILE`, $SPECRIG_HOSTS, ./hosts.yaml, ~/.config/specrig/hosts.yaml, and
    last, only when specrig runs from a source checkout, the checkout's own hosts.yaml (so that
    `inv` works from any directory of a clone, as it always has). A file named by --hosts or
    SPECRIG_HOSTS is used even if missing (load_inventory then says so); the others only if they exist.
    """
    if _hosts_flag:
        return _hosts_flag, "--hosts"
    if os.environ.get("SPECRIG_HOSTS"):
        return Path(os.path.expanduser(os.environ["SPECRIG_HOSTS"])), "SPECRIG_HOSTS"
    places = [Path.cwd() / "hosts.yaml", user_inventory()]
    checkout = checkout_dir()
    if checkout:
        places.append(checkout / "hosts.yaml")
    for place in places:
        if place.is_file():
            return place, None
    raise InventoryError(
        f"no inventory: none of {', '.join(map(str, places))} exists, and neither --hosts nor SPECRIG_HOSTS is set",
        hint=f"create ./hosts.yaml or {user_inventory()} as the README's hosts.yaml section shows, "
             "or name one with `specrig --hosts FILE` or SPECRIG_HOSTS=FILE")


def default_path() -> Path:
    """The inventory load_inventory() reads when given no path (see locate for the order)."""
    return locate()[0]


def load_inventory(path: str | os.PathLike | None = None) -> Inventory:
    named_by = None
    if path:
        path = Path(path)
    else:
        path, named_by = locate()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fix = {"--hosts": "named by --hosts: check the path",
               "SPECRIG_HOSTS": "named by SPECRIG_HOSTS: fix or unset it"}.get(
                   named_by, "create it (the README's hosts.yaml section)")
        raise InventoryError(f"{path}: inventory file not found", hint=fix) from None
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read inventory: {exc.strerror}") from None
    data = parse_yaml(text, path=path, error=InventoryError)
    return parse_inventory(data if data is not None else {}, path=path)


def known_hosts_for(inventory_path: Path) -> Path:
    """The project known_hosts that goes with an inventory: `.specrig/known_hosts` beside it, or,
    for the user-level inventory's directory (~/.config/specrig), `known_hosts` in that directory
    (a hidden `.specrig/` inside specrig's own config directory would only be noise)."""
    directory = inventory_path.resolve().parent
    if directory == config_dir().resolve():
        return directory / "known_hosts"
    return directory / ".specrig" / "known_hosts"


def parse_inventory(data: Any, *, path: Path) -> Inventory:
    def fail(key: str, message: str, hint: str | None = None) -> InventoryError:
        return InventoryError(f"{path}: {key}: {message}", hint=hint)

    if not isinstance(data, dict):
        raise fail("(top level)", f"expected a mapping with 'hosts', got {type(data).__name__} {data!r:.60}")
    unknown = set(data) - {"defaults", "hosts", "groups"}
    if unknown:
        raise fail(sorted(map(str, unknown))[0], "unknown top-level key", hint="allowed: defaults, hosts, groups")
    defaults = _check_entry(data.get("defaults") or {}, "defaults", fail)
    raw_hosts = data.get("hosts") or {}
    if not isinstance(raw_hosts, dict):
        raise fail("hosts", f"expected a mapping of host names, got {raw_hosts!r:.60}")
    known_hosts = str(known_hosts_for(path))
    hosts = {}
    for name, entry in raw_hosts.items():
        if not isinstance(name, str) or not name or name == LOCAL:
            raise fail(f"hosts.{name}", f"invalid host name {name!r}", hint="'local' is reserved for this machine")
        fields = {**defaults, **_check_entry(entry or {}, f"hosts.{name}", fail)}
        check_scheduler(fields, f"hosts.{name}", fail)
        if fields.get("scheduler") == SLURM:
            fields["slurm"] = check_slurm(fields.get("slurm") or {}, f"hosts.{name}.slurm", fail)
        if fields.get("identity_file"):
            fields["identity_file"] = _resolve(fields["identity_file"], path)
        hosts[name] = Host(name=name, known_hosts=known_hosts, **fields)
    raw_groups = data.get("groups") or {}
    if not isinstance(raw_groups, dict):
        raise fail("groups", f"expected a mapping of group names to host lists, got {raw_groups!r:.60}")
    groups = {}
    for group, members in raw_groups.items():
        if group in hosts:
            raise fail(f"groups.{group}", "a group may not share its name with a host")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise fail(f"groups.{group}", f"expected a list of host names, got {members!r:.60}")
        for member in members:
            if member not in hosts:
                raise fail(f"groups.{group}", f"names unknown host {member!r}",
                           hint=f"known hosts: {', '.join(sorted(hosts)) or 'none'}")
        groups[group] = list(members)
    return Inventory(path=path, hosts=hosts, groups=groups)


def _check_entry(entry: Any, where: str, fail) -> dict:
    if not isinstance(entry, dict):
        raise fail(where, f"expected a mapping of settings, got {entry!r:.60}")
    for key, value in entry.items():
        field = FIELDS.get(key)
        if field is None:
            raise fail(f"{where}.{key}", "unknown key", hint=f"allowed: {', '.join(FIELDS)}")
        # bool is an int subclass; `port: yes` must not pass as 1.
        if not isinstance(value, field.types) or (isinstance(value, bool) and bool not in field.types):
            raise fail(f"{where}.{key}", f"expected {field.type_names()}, got {value!r:.60}")
        if key == "port" and not 0 < value < 65536:
            raise fail(f"{where}.{key}", f"port {value!r} is out of range 1-65535")
        if key in ("gpus", "gpu_memory_mib") and value < 0:
            raise fail(f"{where}.{key}", f"{key} {value!r} must not be negative")
        if key == "host_key_policy" and value not in HOST_KEY_POLICIES:
            raise fail(f"{where}.{key}", f"unknown policy {value!r}", hint=f"use one of {', '.join(HOST_KEY_POLICIES)}")
        if key == "slurm":
            check_slurm(value, f"{where}.{key}", fail)
        if key == "env":
            for var, val in value.items():
                if not isinstance(var, str) or not var.isidentifier():
                    raise fail(f"{where}.env.{var}", f"invalid variable name {var!r}")
                if not isinstance(val, (str, int, float)) or isinstance(val, bool):
                    # The type, never the value: env: holds tokens (HF_TOKEN), which no message shows.
                    raise fail(f"{where}.env.{var}", f"expected a string or number, got a {type(val).__name__}")
    return dict(entry)


def _resolve(file: str, inventory_path: Path) -> str:
    """`~` expands to the laptop user's home; relative paths are relative to hosts.yaml."""
    expanded = Path(os.path.expanduser(file))
    return str(expanded if expanded.is_absolute() else inventory_path.resolve().parent / expanded)
