"""docs/faults.md, the fault matrix written down (issue 35): made from tests/faults/cells.py and the
results of benchmarks/faults.py, read back by the tests (what a cell's recorded outcome is). A partial
benchmark run keeps the rows of the cells it did not run, each with the commit it was measured at.
"""
from __future__ import annotations

import re

from faults.cells import ELSEWHERE, FAULTS, OUTCOMES, PATHS, PHASES, RUNS, WATCH_S, every_cell
from support.paths import REPO

DOC = REPO / "docs" / "faults.md"
NOT_RUN = "not-run"
#: A cell's row: `| \`id\` | outcome | seconds | reaction | symptom | commit |`.
ROW = re.compile(r"^\| `(?P<cell>[^`]+)` \| (?P<outcome>[\w-]+) \| (?P<seconds>[\d.]+|—) \| (?P<reaction>.*?) \| "
                 r"(?P<symptom>.*?) \| (?P<commit>[\w-]+|—) \|$", re.MULTILINE)


def recorded(text: str | None = None) -> dict[str, dict]:
    """{cell id: {"outcome", "detection_s", "reaction", "symptom", "commit"}} of the doc's rows."""
    text = DOC.read_text() if text is None else text
    return {found["cell"]: {"outcome": found["outcome"],
                            "detection_s": None if found["seconds"] == "—" else float(found["seconds"]),
                            "reaction": found["reaction"], "symptom": found["symptom"],
                            "commit": None if found["commit"] == "—" else found["commit"]}
            for found in ROW.finditer(text)}


def cell_text(value: str | None) -> str:
    """A table cell's text: one line, no pipe (the row's separator), or a dash."""
    return " ".join((value or "—").replace("|", "/").split())


def render(rows: dict[str, dict], runs: dict[str, dict], commit: str) -> str:
    """The page: every cell of the matrix, `rows` (by cell id) where measured, `runs` the runs' wall times."""
    covered = {cell_id: test for run in RUNS for cell_id, test in run.covered_by.items()}
    lines = [
        "# The fault matrix",
        "",
        f"Built by `python benchmarks/faults.py` at {commit} (issue 35), on the lab (`inv lab.up --runnable --hosts 3 "
        "--slurm`): real extractions of the tiny model, each fault injected at its phase by "
        "tests/support/faults.py, the cells as data in tests/faults/cells.py. Do not edit: run the benchmark "
        "(`--run NAME` runs one run and keeps the other rows). CI runs the runs marked `ci` "
        "(tests/faults/test_fault_cells_lab.py) and fails when a cell ends worse than recorded here. A commit "
        "marked `-dirty` was measured on a working tree with uncommitted changes (fixes under way).",
        "",
        "A cell ends **recovered** or **failed-named**; every other outcome is a fault specrig does not yet "
        "survive as issue 35 asks. The detection seconds run from the fault to the supervisor's first reaction "
        "(a failure recorded in status.json, or a state that `inv status` shows: stalled, restarting, failed, "
        "lost), or, for a fault that only the laptop's commands meet, to that command's answer.",
        "",
        "| outcome | meaning |",
        "|---|---|",
        *[f"| {name} | {meaning} |" for name, meaning in OUTCOMES.items()],
        "",
        "Paths: " + "; ".join(f"`{name}` {what}" for name, what in PATHS.items()) + ".",
        "",
        "| phase | injected when | watch (s) |",
        "|---|---|---|",
        *[f"| {name} | {what} | {WATCH_S[name]} |" for name, what in PHASES.items()],
        "",
        "| fault | what is done |",
        "|---|---|",
        *[f"| {name} | {what} |" for name, what in FAULTS.items()],
        "",
        "## Cells",
        "",
        "A cell is `path/phase/fault/target`; the cells of one run share its launch and model loads, injected in "
        "this order.",
        "",
        "| cell | outcome | detection (s) | reaction | symptom | measured at |",
        "|---|---|---|---|---|---|",
    ]
    for cell_id in every_cell():
        row = rows.get(cell_id) or {"outcome": NOT_RUN}
        seconds = row.get("detection_s")
        lines.append(f"| `{cell_id}` | {row['outcome']} | {'—' if seconds is None else seconds} | "
                     f"{cell_text(row.get('reaction'))} | {cell_text(row.get('symptom'))} | "
                     f"{row.get('commit') or '—'} |")
    lines += ["", "## Runs", "", "| run | path | cells | ci | wall (s) | measured at |", "|---|---|---|---|---|---|"]
    for run in RUNS:
        measured = runs.get(run.name) or {}
        lines.append(f"| {run.name} | {run.path} | {len(run.cells)} | {'yes' if run.ci else 'no'} | "
                     f"{measured.get('seconds', '—')} | {measured.get('commit', '—')} |")
    if covered:
        lines += ["", "Cells that other lab tests inject too (CI runs them there, not here):", ""]
        lines += [f"- `{cell_id}`: {test}" for cell_id, test in covered.items()]
    lines += ["", "Cells that only other lab tests inject so far (the harness does not inject them itself):", ""]
    lines += [f"- `{cell.id}`: {test}" for cell, test in ELSEWHERE.items()]
    return "\n".join(lines) + "\n"


RUN_ROW = re.compile(r"^\| (?P<run>[\w-]+) \| [\w-]+ \| \d+ \| (?:yes|no) \| (?P<seconds>\d+|—) \| "
                     r"(?P<commit>[\w-]+|—) \|$", re.MULTILINE)


def recorded_runs(text: str | None = None) -> dict[str, dict]:
    text = DOC.read_text() if text is None else text
    return {found["run"]: {"seconds": int(found["seconds"]), "commit": found["commit"]}
            for found in RUN_ROW.finditer(text) if found["seconds"] != "—"}
