"""A preflight's checks for people: the table every launch draws before it starts anything, and a failed
preflight (nothing launched). Here, below the stages, so that a run's views (specrig/run/view.py and its
siblings) and a Slurm submission's (specrig/slurm/view.py) draw them the same way without importing each
other.
"""
from __future__ import annotations

from rich.table import Table

from specrig.inventory import Host
from specrig.ui import console, print_json
from specrig.ui.terminal import markup


def show_checks(checks: list[dict]) -> None:
    """A preflight's checks as one table: each ok or FAIL, with its detail and any advice."""
    table = Table(title="preflight")
    for column in ("check", "", "detail"):
        table.add_column(column, overflow="fold")
    for item in checks:
        mark = "[green]ok[/]" if item["ok"] else "[bold red]FAIL[/]"
        detail = markup(item["detail"]) + (f"\n[yellow]→ {markup(item['advice'])}[/]" if item.get("advice") else "")
        table.add_row(markup(item["name"]), mark, detail)
    console.print(table)


def show_preflight_failed(found, *, host: Host, as_json: bool) -> None:
    """A failed preflight: its checks (--json: {launched: false, preflight}); nothing was launched."""
    if as_json:
        print_json({"launched": False, "preflight": found.payload})
    else:
        show_checks(found.payload)
