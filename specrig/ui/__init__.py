"""Output for people (rich) and for scripts (JSON)."""
from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

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


def gpu_table(gpus: list[dict], *, apps: list[dict] | None = None, **table_options) -> Table:
    """One row per GPU (remote/telemetry.py's records): memory, utilization, temperature, power, and,
    given `apps`, the compute processes on it (`*` marks the run's own)."""
    table = Table(**table_options)
    columns = ["GPU", "name", "memory", "util", "temp", "power"] + (["processes"] if apps is not None else [])
    for column in columns:
        table.add_column(column)
    for gpu in gpus:
        row = [str(gpu["index"]), gpu.get("name") or "-",
               f"{gpu['memory_used_mib']:.0f}/{gpu['memory_total_mib']:.0f} MiB",
               _unit(gpu.get("utilization_pct"), "%"), _unit(gpu.get("temperature_c"), "°C"),
               _unit(gpu.get("power_w"), "W")]
        if apps is not None:
            row.append(", ".join(f"{a['pid']}{'*' if a.get('this_run') else ''} ({a['memory_used_mib']:.0f} MiB)"
                                 for a in apps if a["gpu_uuid"] == gpu.get("uuid")) or "-")
        table.add_row(*row)
    return table


def _unit(value: float | None, unit: str) -> str:
    """A reading with its unit; nvidia-smi's [N/A] (None) shows as '-', not as 0."""
    return "-" if value is None else f"{value:.0f} {unit}"
