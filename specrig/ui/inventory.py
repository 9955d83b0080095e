"""Tables of the inventory."""
from __future__ import annotations

from rich.table import Table

from specrig.inventory import Inventory
from specrig.ui import console, print_json


def show_inventory(inventory: Inventory, *, as_json: bool) -> None:
    if as_json:
        print_json({"file": str(inventory.path), "hosts": {h.name: _shown(h.as_dict()) for h in inventory},
                    "groups": inventory.groups})
        return
    table = Table(title=f"hosts ({inventory.path})")
    for column in ("name", "target", "python", "workdir", "gpus", "host keys", "groups", "description"):
        table.add_column(column)
    for host in inventory:
        groups = ", ".join(g for g, members in inventory.groups.items() if host.name in members)
        python = host.python + (f"\nserver: {host.server_interpreter}" if host.two_environments else "")
        table.add_row(host.name, host.describe(), python, host.workdir,
                      str(host.gpus) if host.gpus is not None else "-", _policy(host), groups,
                      host.description)
    console.print(table)


def _shown(host: dict) -> dict:
    """A host's settings as --json shows them: the names of its `env:` variables, not their values (tokens)."""
    env = host.pop("env", None) or {}
    return {**host, "env_keys": sorted(env)}


def _policy(host) -> str:
    if host.is_local:
        return "-"
    # None: ssh_config's StrictHostKeyChecking decides, and unknown keys are refused without it.
    return host.host_key_policy or "ssh_config"
