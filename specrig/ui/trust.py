"""What `inv trust-host` did, for people."""
from __future__ import annotations

from rich.markup import escape

from specrig.ui import console, print_json


def show_trust(result: dict, *, as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    host = escape(result["host"])
    if "fingerprint" not in result:
        # The login failed before the host's own key was seen (at a ProxyJump gateway, say).
        console.print(f"[yellow]no key of {host} was seen[/]: {escape(result.get('note', ''))}")
        return
    key = f"{result['key_type']} {result['fingerprint']}"
    if result["recorded"]:
        console.print(f"recorded {key} for {host} in {escape(str(result['known_hosts']))}")
    else:
        console.print(f"{host} is already trusted: {key} (in {escape(str(result['known_in']))})")
    if not result.get("authenticated", True):
        console.print(f"[yellow]but logging in failed[/]: {escape(result.get('note', ''))}")
