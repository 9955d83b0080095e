"""The fault matrix's cells after a run ended (phase `ended` of tests/faults/cells.py): the output read back by
a laptop command while a fault is in it, then again once the cause is gone. The command is the cell's target:
`sample` is `inv verify-dataset` (is the output trainable), `gather` is `inv gather` (each shard's files listed
and loaded on its host, their union every index once; it copies nothing: docs/runs.md, "Sharded runs").
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable

from faults.cells import WATCH_S, Cell
from support.faults import VICTIM, LabRun, Reaction, command_reaction, result
from support.faults_inject import INJECTORS, sample_file

#: The laptop command of each `ended` target, and the exit statuses it documents for a fault it meets: 1 for
#: a finding (a bad row; an index missing or not loading whole), 3 for a host it could not reach
#: (specrig/exit_status.py).
READ_BACK = {"sample": "verify-dataset", "gather": "gather"}
DOCUMENTED_EXITS = {"sample": {1}, "gather": {1, 3}}


def read_back(target: str, run: LabRun, at: float) -> Reaction:
    """The target's command on the run's output (a job's on its head), its answer as the reaction."""
    host, run_id = run.output_target()
    return command_reaction((READ_BACK[target], "--host", host, "--run", run_id), run, at)


def ended_cell(run: LabRun, cell: Cell, log: Callable[[str], None]) -> dict:
    """A fault met by the target's command after the run: it must exit with a status it documents, naming
    what is wrong in a line (the damaged sample's index, or the lost host), without a traceback; and pass
    once the cause is gone (the file restored, the connection whole)."""
    with INJECTORS[cell.fault](run, cell.target, None) as fault:
        log(f"{cell.id}: {fault.what}")
        reaction = (fault.reaction or (lambda run, before, at, watch_s: read_back(cell.target, run, at)))(
            run, {}, fault.at, WATCH_S[cell.phase])
    log(f"{cell.id}: reaction {reaction}")
    if reaction.exit_status == 0:
        return result(cell, "silent", f"{READ_BACK[cell.target]} passed all the same: {reaction.what}", reaction,
                      fault=fault.what)
    # The damaged file's index, or (the connection dropped) the host that did not answer.
    named = re.search(rf"\b{VICTIM}\b", reaction.what) if cell.fault.startswith("file-") else re.search(
        r"SSH|connection|no answer", reaction.what)
    if reaction.exit_status not in DOCUMENTED_EXITS[cell.target] or "Traceback" in reaction.what or not named:
        return result(cell, "unnamed", f"{sample_file(run).name}: {reaction.what}", reaction, fault=fault.what)
    again = read_back(cell.target, run, time.time())
    if again.exit_status != 0:
        return result(cell, "resume-failed", f"with the cause gone: {again.what}", reaction, fault=fault.what)
    return result(cell, "failed-named", reaction.what, reaction, fault=fault.what)
