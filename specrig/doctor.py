"""`inv doctor`: what a host is and whether it can run specrig's work."""
from __future__ import annotations

import time

from rich.table import Table

from specrig.transport.bundle import Bundle
from specrig.inventory import Host
from specrig.transport import connect
from specrig.ui import console, gpu_table, human_bytes, print_json


def doctor(host: Host, *, bundle: Bundle | None = None) -> dict:
    """One connection, one call: the host's facts plus how we reached it."""
    started = time.monotonic()
    with connect(host, bundle=bundle) as remote:
        facts = remote.call("doctor", {"workdir": host.workdir}, timeout=60)
        facts["connection"] = {"target": host.describe(), "ssh": not host.is_local,
                               "exec_channels": remote.exec_count,
                               "bundle_uploaded": getattr(remote, "uploaded", False)}
    facts["connection"]["seconds"] = round(time.monotonic() - started, 3)
    return facts


def show(facts: dict, *, as_json: bool, host: Host) -> None:
    if as_json:
        print_json(facts)
        return
    conn, python = facts["connection"], facts["python"]
    summary = Table.grid(padding=(0, 2))
    summary.add_row("host", f"{host.name} → {conn['target']} (reached in {conn['seconds']:.2f} s)")
    summary.add_row("user / shell", f"{facts['user']} / {facts['login_shell']}")
    summary.add_row("python", f"{python['version']}  {python['executable']}")
    for name, version in facts["packages"].items():
        summary.add_row(name, version or "[yellow]not installed[/]")
    disk = facts["disk"]
    summary.add_row("workdir", f"{disk['path']}: {human_bytes(disk['free_bytes'])} free"
                               + ("" if disk["exists"] else " (does not exist yet)"))
    console.print(summary)
    gpu = facts["gpu"]
    if not gpu["available"]:
        console.print(f"GPUs: none visible ({gpu['reason']})")
        return
    table = gpu_table(gpu["gpus"], title="GPUs")
    console.print(table)
