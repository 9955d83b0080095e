"""Output for people (rich) and for scripts (JSON)."""
from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from specrig.contract import human_bytes  # noqa: F401 (the views' byte formatter, shared with the host)
from specrig.ui.terminal import markup

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)


#: How far the lines under a block's first line (a finding, a patch) are indented.
BLOCK_INDENT = 4


def print_indented(text: Text | str, *, indent: int = BLOCK_INDENT) -> None:
    """`text` wrapped to the console's width less `indent`, each line indented. Wrapped by hand, not by
    rich's Padding, which pads every line with spaces to the full width (a pipe would keep them)."""
    text = Text.from_markup(text) if isinstance(text, str) else text
    for line in text.wrap(console, console.width - indent):
        line.rstrip()
        console.print(Text(" " * indent).append_text(line), soft_wrap=True)


def print_json(data) -> None:
    """Machine output: plain JSON on stdout, nothing else; indented for a person at a terminal, one
    line for a pipe or a file (json's C encoder, which cannot indent: a group's answers are megabytes)."""
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(data, indent=indent, default=str) + "\n")




def gpu_table(gpus: list[dict], *, apps: list[dict] | None = None, **table_options) -> GpuTable:
    """One row per GPU (remote/base/telemetry.py's records): memory, utilization, temperature, power, and,
    given `apps`, the compute processes on it (`*` marks the run's own).

    The layout follows the width it is given: on a wide terminal one line per GPU with every
    column; where that does not fit (8 GPUs in 80 columns), each process on a line of its own, then
    no name column when every GPU has the same name (it moves to the caption), then memory without
    its unit in each cell. A number is never cut or wrapped."""
    return GpuTable(gpus, apps, table_options)


class GpuTable:
    """gpu_table's renderable: the first layout whose natural width fits, else the narrowest."""

    #: (processes one per line, name in the caption, bare memory cells), widest first.
    LAYOUTS = ((False, False, False), (True, False, False), (True, True, False), (True, True, True))

    def __init__(self, gpus: list[dict], apps: list[dict] | None, table_options: dict) -> None:
        self.gpus, self.apps, self.table_options = gpus, apps, table_options

    def table(self, one_per_line: bool = False, name_in_caption: bool = False, bare_memory: bool = False) -> Table:
        names = {markup(gpu.get("name") or "-") for gpu in self.gpus}  # nvidia-smi's: the host's text
        name_in_caption = name_in_caption and len(names) == 1
        ours = self.apps is not None and any(app.get("this_run") for app in self.apps)
        caption = "; ".join(part for part in (
            f"{len(self.gpus)} × {next(iter(names))}" if name_in_caption else "",
            "* the run's processes" if ours else "") if part)
        options = dict(self.table_options)
        if caption and "caption" not in options:
            options.update(caption=caption, caption_justify="left")
        table = Table(**options)
        table.add_column("GPU", no_wrap=True, justify="right")
        if not name_in_caption:
            table.add_column("name")
        table.add_column("memory MiB" if bare_memory else "memory", no_wrap=True, justify="right")
        for column in ("util", "temp", "power"):
            table.add_column(column, no_wrap=True, justify="right")
        if self.apps is not None:
            table.add_column("processes", no_wrap=True)
        for gpu in self.gpus:
            memory = f"{_number(gpu.get('memory_used_mib'))}/{_number(gpu.get('memory_total_mib'))}"
            row = [str(gpu["index"])] + ([] if name_in_caption else [markup(gpu.get("name") or "-")])
            row += [memory if bare_memory else memory + " MiB", _unit(gpu.get("utilization_pct"), "%"),
                    _unit(gpu.get("temperature_c"), "°C"), _unit(gpu.get("power_w"), "W")]
            if self.apps is not None:
                mine = [app for app in self.apps if app.get("gpu_uuid") == gpu.get("uuid")]
                if one_per_line:
                    row.append("\n".join(f"{app['pid']}{'*' if app.get('this_run') else ''}"
                                         + ("" if app.get("memory_used_mib") is None
                                            else f" {app['memory_used_mib']:.0f} MiB") for app in mine) or "-")
                else:
                    row.append(", ".join(f"{app['pid']}{'*' if app.get('this_run') else ''}"
                                         + ("" if app.get("memory_used_mib") is None
                                            else f" ({app['memory_used_mib']:.0f} MiB)") for app in mine) or "-")
            table.add_row(*row)
        return table

    def _chosen(self, console, options) -> Table:
        unbounded = options.update_width(10_000)
        tables = [self.table(*layout) for layout in self.LAYOUTS]
        for table in tables:
            if Measurement.get(console, unbounded, table).maximum <= options.max_width:
                return table
        return tables[-1]

    def __rich_console__(self, console, options):
        yield self._chosen(console, options)

    def __rich_measure__(self, console, options) -> Measurement:
        return Measurement.get(console, options, self._chosen(console, options))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _unit(value: float | None, unit: str) -> str:
    """A reading with its unit; nvidia-smi's [N/A] (None) shows as '-', not as 0."""
    return "-" if value is None else f"{value:.0f} {unit}"
