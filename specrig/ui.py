"""Output for people (rich) and for scripts (JSON)."""
from __future__ import annotations

import json
import sys

from rich.console import Console

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)


def print_json(data) -> None:
    """Machine output: plain JSON on stdout, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"
