"""The fault matrix (issue 35): every run of tests/faults/cells.py on the lab, one at a time, each fault
injected at its phase (tests/support/faults_run.py), then docs/faults.md written with every cell's outcome,
its detection seconds and the commit. Cells of the runs not asked for keep their rows.

Needs `inv lab.up --runnable --hosts 3 --slurm`, as root (tmpfs outputs, a fleet host of its own); applies
lab-server's and lab-cpu's patchsets first.

    python benchmarks/faults.py [--run NAME ...] [--json FILE] [--no-doc]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "remote")]

# The paths above first: tests/ (support, faults) and remote/ (the host side).
from faults.cells import RUNS
from support.faults_doc import DOC, recorded, recorded_runs, render
from support.faults_run import run_cells
from support.shared_envs import ensure_patched


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", choices=[run.name for run in RUNS],
                        help="one run of the matrix (repeatable; default: every run)")
    parser.add_argument("--json", type=Path, help="also write every result here")
    parser.add_argument("--no-doc", action="store_true", help="leave docs/faults.md as it is")
    args = parser.parse_args()
    # `-dirty`: measured on a working tree with uncommitted changes (fixes under way), not the commit alone.
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    for host in ("lab-server", "lab-cpu"):
        ensure_patched(host)
    rows, runs = (recorded(), recorded_runs()) if DOC.exists() else ({}, {})
    measured = []
    for spec in (run for run in RUNS if not args.run or run.name in args.run):
        try:
            outcome = run_cells(spec, log=lambda line: print(line, flush=True))
        except Exception:  # the harness's own failure: the other runs still run, the doc keeps the old rows
            traceback.print_exc()
            continue
        measured.append(outcome)
        runs[spec.name] = {"seconds": outcome["seconds"], "commit": commit}
        rows.update({found["cell"]: dict(found, commit=commit) for found in outcome["cells"]})
        if not args.no_doc:  # after each run: a later run's crash keeps what was measured
            DOC.write_text(render(rows, runs, commit))
    if args.json:
        args.json.write_text(json.dumps(measured, indent=1))
    bad = [found for outcome in measured for found in outcome["cells"] if found["outcome"] not in
           ("recovered", "failed-named")]
    print(f"{sum(len(o['cells']) for o in measured)} cells, {len(bad)} not survived as issue 35 asks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
