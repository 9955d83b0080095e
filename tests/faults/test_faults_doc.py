"""docs/faults.md against tests/faults/cells.py, without the lab: the page is the one the benchmark writes
(benchmarks/faults.py, tests/support/faults_doc.py) from the cells as they are now, every cell once, and CI's
runs hold one cell of each fault kind."""
from __future__ import annotations

import re
from itertools import pairwise

from faults.cells import ELSEWHERE, FAULTS, OUTCOMES, PATHS, PHASES, RUNS, WATCH_S, ci_runs, every_cell
from support.faults import PROCESS_TARGETS
from support.faults_doc import DOC, NOT_RUN, recorded, recorded_runs, render
from support.faults_inject import INJECTORS
from support.paths import REPO


def test_every_cell_has_one_row_and_an_outcome_the_matrix_knows():
    rows = recorded()
    listed = re.findall(r"^\| `([^`]+)` \|", DOC.read_text(), re.MULTILINE)
    assert sorted(listed) == sorted(set(listed)), "a cell listed twice"
    assert set(rows) == set(every_cell()), set(rows) ^ set(every_cell())
    assert {row["outcome"] for row in rows.values()} <= set(OUTCOMES) | {NOT_RUN}
    for cell_id, row in rows.items():
        assert (row["outcome"] == NOT_RUN) == (row["commit"] is None), (cell_id, row)


def test_the_page_is_the_one_the_benchmark_writes_from_the_cells_as_they_are():
    """Phases, faults, watches, runs and rows as tests/faults/cells.py has them: a cell added, renamed or
    reworded there and not measured again (or a row edited by hand) fails here."""
    text = DOC.read_text()
    commit = re.search(r"Built by `python benchmarks/faults.py` at ([\w-]+) ", text)[1]
    assert text == render(recorded(text), recorded_runs(text), commit)


def test_each_cell_names_a_known_path_phase_fault_and_target():
    for cell in every_cell().values():
        assert cell.path in PATHS and cell.phase in PHASES and cell.fault in FAULTS, cell
        assert cell.fault in INJECTORS or cell.phase == "preflight", cell
        if cell.fault in ("kill-9", "sigstop", "freeze"):
            assert cell.target in PROCESS_TARGETS, cell
    assert set(WATCH_S) == set(PHASES)
    assert set(INJECTORS) | {"wrong-hosts", "wrong-dataset"} == set(FAULTS)


def test_ci_runs_one_cell_of_each_fault_kind():
    faults = [cell.fault for run in ci_runs() for cell in run.cells]
    assert sorted(faults) == sorted(FAULTS), faults


def test_covered_cells_are_cells_of_their_run_and_each_test_named_exists():
    for run in RUNS:
        assert set(run.covered_by) <= {cell.id for cell in run.cells}, run.name
        assert len({cell.id for cell in run.cells}) == len(run.cells), run.name
    tests = [test for run in RUNS for test in run.covered_by.values()] + list(ELSEWHERE.values())
    for test in tests:
        path, name = test.split("::")
        assert f"def {name}(" in (REPO / path).read_text(), test
    assert not {cell.id for cell in ELSEWHERE} & set(every_cell())


def test_a_run_reaches_its_last_files_after_every_other_cell_it_runs():
    """The run ends after its last files: a cell while it runs that came later would never be reached."""
    order = ["preflight", "loading|prepare-data|prepare-data-render|generating|backoff", "last-files", "ended"]
    for run in RUNS:
        stages = [next(i for i, names in enumerate(order) if cell.phase in names.split("|")) for cell in run.cells]
        assert stages == sorted(stages), run.name


def test_a_backoff_cell_follows_a_kill_that_restarts_the_run():
    """Between attempts only after a failure that is restarted: the server (or its engine) or the driver (or its
    worker) killed during an attempt; a client step killed is started again within it."""
    for run in RUNS:
        for before, cell in pairwise(run.cells):
            if cell.phase == "backoff":
                assert before.fault == "kill-9" and before.phase in ("loading", "generating") and before.target in (
                    "api-server", "engine-core", "driver", "worker"), (run.name, cell)
