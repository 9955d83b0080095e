"""The GPUs in `inv status --run` and in the live view, at 80 columns and on a wide terminal.

The status JSON is what `runs status` returned on 2x H200 under a tensor-parallel job
(tests/programs/gpu_check_tp.py); the 8-GPU one is built from it (see tests/fixtures/gpu-views/README.md).
Each is rendered with specrig's own view code; every GPU must be on a line of its own with its numbers
whole, and at 80 columns no line may be wider. The captures in tests/fixtures/gpu-views/ are the same
renderings, kept for people to look at: `python tests/run/test_gpu_views.py` writes them anew.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

if __name__ == "__main__":
    # This checkout's specrig, not an installed one, and the tests' support package.
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]

import specrig.run.view as view
from specrig.run.live import render, samples_bar
from support.paths import FIXTURES

VIEWS = FIXTURES / "gpu-views"
STATUSES = {"h200x2": "status_h200x2.json", "8gpu": "status_8gpu_constructed.json"}
WIDTHS = (80, 160)
LOG_RULE = "last log lines"


def load(name: str) -> dict:
    return json.loads((VIEWS / STATUSES[name]).read_text())


def status_view(result: dict, width: int, monkeypatch=None) -> str:
    """What `inv status --run` prints (view.show_run), on a terminal `width` columns wide."""
    console = Console(record=True, width=width, file=open("/dev/null", "w"), highlight=False)
    saved, view.console = view.console, console
    try:
        view.show_run(result["runs"][0], log_tail=result.get("log_tail"))
    finally:
        view.console = saved
    return console.export_text()


def live_view(result: dict, width: int) -> str:
    """One frame of the live view (live.render)."""
    console = Console(record=True, width=width, file=open("/dev/null", "w"), highlight=False)
    progress, bar = samples_bar()
    console.print(render(result["runs"][0], result.get("log_tail") or "", progress, bar))
    return console.export_text()


def renderings() -> dict[str, str]:
    return {f"{kind}_{name}_{width}.txt": shown(load(name), width)
            for kind, shown in (("status", status_view), ("live", live_view))
            for name in STATUSES for width in WIDTHS}


def gpu_lines(text: str, result: dict) -> dict[int, str]:
    """{GPU index: its line}: the line that starts with the index, then its memory."""
    found = {}
    for gpu in result["runs"][0]["gpus"]["gpus"]:
        memory = f"{gpu['memory_used_mib']:.0f}/{gpu['memory_total_mib']:.0f}"
        pattern = re.compile(rf"^\W*{gpu['index']}\W.*\b{re.escape(memory)}\b")
        lines = [line for line in text.splitlines() if pattern.search(line)]
        assert len(lines) == 1, f"GPU {gpu['index']} ({memory}) is not on one line:\n{text}"
        found[gpu["index"]] = lines[0]
    return found


def table_part(text: str) -> str:
    """Everything before the log tail: `inv status` prints log lines as they are (soft wrap)."""
    return text.split(LOG_RULE)[0]


@pytest.mark.parametrize("name", STATUSES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", ["status", "live"])
def test_every_gpu_on_one_line_with_whole_numbers(kind, name, width):
    result = load(name)
    text = (status_view if kind == "status" else live_view)(result, width)
    lines = gpu_lines(text, result)
    for gpu in result["runs"][0]["gpus"]["gpus"]:
        line = lines[gpu["index"]]
        for reading in (f"{gpu['utilization_pct']:.0f} %", f"{gpu['temperature_c']:.0f} °C", f"{gpu['power_w']:.0f} W"):
            assert re.search(rf"(?<![\d.]){re.escape(reading)}", line), f"{reading!r} not whole in {line!r}"
        assert "…" not in line
    if width == 80:
        wide = [line for line in table_part(text).splitlines() if cell_len(line) > 80]
        assert not wide, "\n".join(wide)


@pytest.mark.parametrize("name", STATUSES)
@pytest.mark.parametrize("width", WIDTHS)
def test_status_lists_every_process_on_its_gpu_with_the_runs_own_marked(name, width):
    result = load(name)
    run = result["runs"][0]
    text = status_view(result, width)
    for app in run["gpu_apps"]:
        shown = f"{app['pid']}{'*' if app['this_run'] else ''}"
        assert re.search(rf"(?<!\d){re.escape(shown)}(?![\d*]) \(?{app['memory_used_mib']:.0f} MiB",
                         table_part(text)), f"{shown} missing:\n{text}"
    # Each of the run's workers is on its own GPU's line (or right under it, one process a line).
    index_of = {gpu["uuid"]: gpu["index"] for gpu in run["gpus"]["gpus"]}
    rows = gpu_lines(text, result)
    for app in run["gpu_apps"]:
        if app["this_run"]:
            assert f"{app['pid']}*" in rows[index_of[app["gpu_uuid"]]]
    assert "* the run's processes" in text
    if width == 160:
        assert all("NVIDIA H200" in line for line in rows.values())


def test_where_even_one_process_a_line_is_too_wide_the_shared_name_moves_to_the_caption():
    """Seven-digit pids (a long-running host) and two processes on a GPU, 80 columns."""
    result = load("8gpu")
    run = result["runs"][0]
    for app in run["gpu_apps"]:
        app["pid"] += 4_000_000
    text = status_view(result, 80)
    rows = gpu_lines(text, result)
    assert "8 × NVIDIA H200; * the run's processes" in text
    assert not any("NVIDIA H200" in line for line in rows.values())
    assert all(cell_len(line) <= 80 for line in table_part(text).splitlines())
    assert "4000970* 9706 MiB" in rows[5] and "4000742 4706 MiB" in text


def test_the_live_view_lists_the_runs_processes():
    result = load("8gpu")
    text = live_view(result, 80)
    assert all(f"{app['pid']}*" in text for app in result["runs"][0]["gpu_apps"] if app["this_run"])


@pytest.mark.parametrize("capture", sorted(renderings()))
def test_the_kept_captures_are_readable(capture):
    """The captures kept beside the JSON: every GPU there, nothing wider than 80 in the narrow ones."""
    text = (VIEWS / capture).read_text()
    name = capture.split("_")[1]
    gpu_lines(text, load(name))
    if capture.endswith("_80.txt"):
        assert all(cell_len(line) <= 80 for line in table_part(text).splitlines())


if __name__ == "__main__":
    for file_name, text in renderings().items():
        (VIEWS / file_name).write_text(text)
        sys.stdout.write(f"wrote {VIEWS / file_name}\n")
