"""`inv verify-dataset` for people (specrig/dataset/view.py), rendered from a real result (tests/fixtures/dataset/):
the verdict first, every bad row with its reason, the command whole on one line, at 80 columns; a run's end."""
from __future__ import annotations

import json

from rich.console import Console

from specrig.dataset import view
from specrig.exit_status import ExitStatus
from specrig.inventory import Host
from support.paths import REPO

FAULTS = json.loads((REPO / "tests" / "fixtures" / "dataset" / "faults.json").read_text())


def rendered(monkeypatch, result: dict) -> str:
    console = Console(record=True, width=80, file=open("/dev/null", "w"), highlight=False)
    monkeypatch.setattr(view, "console", console)
    monkeypatch.setattr("specrig.ui.console", console)
    view.show(result, host=Host(name="lab-server", hostname="127.0.0.1"), as_json=False)
    return console.export_text()


def test_a_result_with_faults_names_every_bad_row_and_prints_the_command_whole(monkeypatch):
    text = rendered(monkeypatch, FAULTS)
    lines = text.splitlines()
    assert lines[0] == "NOT trainable by speculators 0.9.0 (speculators train)"
    assert "3 bad row(s)" in text
    for bad in FAULTS["bad"]:
        assert f"{bad['row']:>3}  {bad['reason'][:40]}" in text, text
    assert FAULTS["command_line"] in lines, text
    assert view.DATASET.judge(FAULTS) == ExitStatus.FINDINGS
    assert view.figures(FAULTS) == "16 rows, 2.5 MiB: NOT trainable: 3 bad row(s), 0 other problem(s)"


def test_a_run_end_says_whether_its_dataset_verified():
    assert view.run_end_text({"verified": True, "trainable": True, "rows": 16, "bad_rows": 0, "problems": [],
                              "command_file": "/o/specrig-train-command.sh"}) == (
        "[green]trainable[/]: 16 rows; the command is the output's specrig-train-command.sh")
    assert view.run_end_text({"verified": True, "trainable": False, "rows": 16, "bad_rows": 2, "problems": ["x"],
                              "command_file": None}).startswith("[bold red]NOT trainable[/]: 2 bad row(s), 1 other")
    assert view.run_end_text({"verified": False, "error": "bad-argument: [x]"}) == (
        "[bold red]not verified[/]: bad-argument: \\[x]")
