"""One run of the fault matrix on the lab (a Run of tests/faults/cells.py): its host, inventory and output
made, its preflight cells tried, the run launched, each cell injected at its phase and judged, the run's
end checked (every sample once, the states against transformers', no process left), then the cells after
its end. Each cell gets a result: its outcome (cells.OUTCOMES), the seconds from the fault to the reaction,
what the reaction was, and the symptom in one line.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from base import outputs
from base.contract import FAILED, FINAL_STATES, LOST, RUNNING, STALLED, STOPPED, SUCCEEDED
from faults.cells import WATCH_S, Cell, Run
from specrig.exit_status import ExitStatus
from specrig.lab import fleet as lab_fleet
from support import faults_nodes
from support.faults import (
    LabRun,
    PhaseMissed,
    Reaction,
    ancestors,
    failures_of,
    free_port,
    json_line,
    newest_failure,
    result,
    run_processes,
    snapshot,
    still_running,
    supervisor_reaction,
    tmpfs_output,
    wait_for_phase,
)
from support.faults_ended import ended_cell
from support.faults_inject import INJECTORS
from support.lab import host_of_its_own, inv, known_hosts_line
from support.patchenv import as_lab_user
from support.paths import PROGRAMS, REPO
from support.runnable_env import HOME, private_inventory
from support.server_lab import LAYERS, run_files, server_fleet_inventory, states_against_transformers

#: The harness's runs carry several failures each: more restarts than the default 3, and short back-offs.
SUPERVISION = {"max_restarts": 10, "backoff_s": 5, "backoff_max_s": 10}
SHIPPED = {"server": "lab-server", "in-process": "lab-cpu"}
#: The paths whose run is a multi-node job (tests/support/faults_nodes.py).
JOBS = ("slurm", "multinode-dp")
#: Words of `inv extract` by path: server mode one request at a time, in process one sample a batch, so
#: that samples flow for long enough to be hit (tests/run/test_runs_lab.py's settings).
#: A job's launch skips the preflight on Slurm, as tests/lab/test_lab_slurm_multinode.py's does.
LAUNCH = {"server": ("--concurrency", "1"), "in-process": ("--batch-size", "1", "--max-len", "512"),
          "multinode-dp": ("--concurrency", "1"), "slurm": ("--concurrency", "1", "--skip-preflight")}
#: In process: bf16 through the tiny model's 8 layers, vLLM's kernels against transformers' (as
#: tests/run/test_extraction_driver.py bounds it).
IN_PROCESS_TOLERANCE = 2e-2
RUN_END_TIMEOUT_S = 900
#: Seconds the supervisor has to finish a reaction (judge a failure, start the next attempt) before the
#: harness takes the run as having gone on.
SETTLE_S = 20
RANK = {"recovered": 0, "failed-named": 1}
#: The exit statuses that refuse with a named cause (specrig/exit_status.py); REMOTE_ERROR is a host-side
#: exception, a traceback's.
REFUSALS = {status.value for status in ExitStatus} - {ExitStatus.OK, ExitStatus.REMOTE_ERROR}


def rank(outcome: str) -> int:
    """0 recovered, 1 failed-named, 2 every other outcome (what issue 35 forbids)."""
    return RANK.get(outcome, 2)


@contextlib.contextmanager
def lab_run(spec: Run, directory: Path) -> Iterator[LabRun]:
    """The host, inventory and output of `spec`; afterwards the run stopped if still active, the live view
    ended, the output removed (a tmpfs unmounted), a host of the harness's own removed."""
    with contextlib.ExitStack() as stack:
        if spec.path in JOBS:
            number, (host, inventory, under) = None, faults_nodes.job_host(spec.path, directory, SUPERVISION)
            workdir = under.parent  # the nodes' own are in the job's launch (LabRun.node_dirs)
        elif spec.own_host:
            number, host = stack.enter_context(host_of_its_own())
            workdir = HOME / "specrig-fleet" / host
            inventory = server_fleet_inventory(directory, {host: lab_fleet.fleet_entry(number)}, [host],
                                               extract=lambda _: dict(SUPERVISION, **spec.extract))
            with open(directory / ".specrig" / "known_hosts", "a") as known:
                known.write(known_hosts_line(number))
        else:
            number, host, workdir = None, SHIPPED[spec.path], HOME / "specrig-work"
            shipped = yaml.safe_load((REPO / "hosts.yaml").read_text())["hosts"][host]
            inventory = private_inventory(directory, host,
                                          extract=dict(shipped["extract"], **SUPERVISION, **spec.extract))
        if spec.tmpfs_mib:
            root = stack.enter_context(tmpfs_output(spec.tmpfs_mib))
        elif spec.path in JOBS:
            root = faults_nodes.job_output(under)
            stack.callback(as_lab_user, "rm", "-rf", str(root))
        else:
            root = HOME / "specrig-work" / "out" / f"faults-{uuid.uuid4().hex[:8]}"
            as_lab_user("mkdir", "-p", str(root))
            stack.callback(as_lab_user, "rm", "-rf", str(root))
        run = LabRun(host=host, path=spec.path, inventory=inventory, workdir=workdir, out=root / "out",
                     port=free_port() if spec.path == "server" else None, own_host=number,
                     data=repeated_dataset(root, spec.copies))
        stack.callback(end_run, run)
        yield run


def repeated_dataset(root: Path, copies: int) -> Path:
    """The tiny chat dataset `copies` times over, written by the lab user beside the output: its 96
    conversations (189 rows in server mode) take seconds once the model is loaded (tests/run/test_runs_lab.py
    repeats it too)."""
    path = root / f"chat-x{copies}.jsonl"
    as_lab_user("tee", str(path), input=(HOME / "data" / "tiny-chat.jsonl").read_text() * copies)
    return path


def end_run(run: LabRun) -> None:
    if run.attached is not None and run.attached.poll() is None:
        run.attached.kill()
        run.attached.wait()
    if run.run_id and run.state() not in FINAL_STATES:
        run.inv("stop", "--host", run.host, "--run", run.run_id)
    faults_nodes.end_job(run)


def launch_words(run: LabRun, spec: Run, **changes: str) -> tuple[str, ...]:
    words = {"--out": str(run.out), **({"--port": str(run.port)} if run.port else {}),
             **({"--data": str(run.data)} if run.data else {}), **changes}
    return ("extract", "--host", run.host, *[w for pair in words.items() for w in pair], *LAUNCH[run.path],
            *(faults_nodes.job_words() if run.path in JOBS else ()), *spec.flags)


def launch(run: LabRun, spec: Run) -> None:
    """`inv extract`: attached (its live view kept as run.attached) or --detach; the run's id."""
    if not spec.attached:
        done = run.inv(*launch_words(run, spec), "--detach", "--json")
        launched = json_line(done.stdout)
        if done.returncode != 0 or not launched.get("launched"):
            raise AssertionError(f"the launch failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
        if spec.path in JOBS:
            faults_nodes.take_launch(run, launched)
        else:
            run.run_id = launched["run_id"]
        return
    run.attached = subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(REPO), *launch_words(run, spec)],
                                    cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    env={**os.environ, "SPECRIG_HOSTS": str(run.inventory)})
    deadline = time.monotonic() + 600
    while run.run_id is None:
        for record in (run.workdir / "runs").glob("*/run.json"):
            if json.loads(record.read_text()).get("out") == str(run.out):
                run.run_id = record.parent.name
        if run.attached.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the attached launch ended ({run.attached.returncode}) or took too long: "
                                 f"{run.attached.stderr.read().decode(errors='replace')[-2000:]}")
        time.sleep(0.5)


# ---- the cells ---------------------------------------------------------------------------------------------

def preflight_cell(run: LabRun, spec: Run, cell: Cell, directory: Path) -> dict:
    """A wrong hosts.yaml or dataset given to `inv extract`: refused with the line or the failing checks that
    name it, each with its advice, nothing launched (the run's own launch after it is the command with the
    cause gone)."""
    inventory, changes = run.inventory, {}
    if cell.fault == "wrong-hosts":
        wrong = directory / "wrong-hosts"
        wrong.mkdir()
        inventory = _with_python(run.inventory, wrong, "~/no-such-venv/bin/python")
    else:
        changes["--data"] = "~/no-such-dataset.jsonl"
    runs = run.workdir / "runs"
    before = set(runs.glob("*"))
    at = time.time()
    done = inv(*launch_words(run, spec, **changes), "--detach", "--json", inventory=inventory)
    reaction = Reaction(round(time.time() - at, 1), "", done.returncode)
    try:
        checks = [check for check in json_line(done.stdout).get("preflight") or [] if not check["ok"]]
    except ValueError:
        checks = []
    said = "; ".join(f"check {check['name']}: {check['detail']} (advice: {check['advice']})" for check in checks) \
        or " ".join(done.stderr.split())
    reaction.what = f"exit {done.returncode}: {said[:300]}"
    launched = [path.name for path in set(runs.glob("*")) - before
                if json.loads((path / "run.json").read_text()).get("out") == str(run.out)]
    if launched:
        return result(cell, "unnamed", f"a run was launched all the same: {launched}", reaction)
    if done.returncode not in REFUSALS or "Traceback" in done.stdout + done.stderr or not all(
            check["advice"] for check in checks):
        return result(cell, "unnamed", reaction.what, reaction)
    return result(cell, "failed-named", reaction.what, reaction)


def _with_python(inventory: Path, directory: Path, python: str) -> Path:
    """A copy of `inventory` (and its known_hosts) whose hosts' `python` is `python`."""
    data = yaml.safe_load(inventory.read_text())
    for entry in data["hosts"].values():
        entry["python"] = python
    shutil.copytree(inventory.parent / ".specrig", directory / ".specrig")
    (directory / "hosts.yaml").write_text(yaml.safe_dump(data))
    return directory / "hosts.yaml"


def inject(run: LabRun, cell: Cell, log: Callable[[str], None]) -> dict:
    """Wait for the cell's phase, inject its fault, watch for the reaction, take the cause away, judge."""
    try:
        pid = wait_for_phase(run, cell.phase, cell.target)
    except PhaseMissed as missed:
        return result(cell, "phase-missed", str(missed))
    before, processes = snapshot(run), run_processes(run)
    run.samples_mark = run.samples()
    watch_s = WATCH_S[cell.phase]
    with INJECTORS[cell.fault](run, cell.target, pid) as fault:
        log(f"{cell.id}: {fault.what}")
        reaction = (fault.reaction or supervisor_reaction)(run, before, fault.at, watch_s)
    log(f"{cell.id}: reaction {reaction}")
    if reaction is None:
        status = run.files()
        return result(cell, "silent", f"no reaction within {watch_s} s: state {run.state()}, heartbeat "
                      f"{(status.get('heartbeat') or {}).get('phase')} {run.samples()} samples", fault=fault.what)
    if "Traceback" in reaction.what:
        return result(cell, "unnamed", f"a traceback: {reaction.what}", reaction, fault=fault.what)
    return dict(settle(run, cell, reaction, before, processes), fault=fault.what)


def settle(run: LabRun, cell: Cell, reaction: Reaction, before: dict, processes: dict[int, str]) -> dict:
    """Where the run went after the reaction: on (restarting, or untouched), or ended (failed, stopped,
    lost), then resumed; the attempt's processes gone either way."""
    state, status, failed_anew = settled(run, before, laptop_side=cell.fault in ("ssh-drop", "sshd-killed"))
    failure = ({"kind": "lost", "explain": "the supervisor is gone without an exit record",
                "advice": "inv resume"} if state == LOST else newest_failure(run, before))
    kind = failure.get("kind")
    named = bool(kind) and kind != "unknown" and bool(failure.get("advice")) and "\n" not in failure.get(
        "explain", "")
    said = f"{state}: {kind}: {failure.get('explain', '')}; advice: {failure.get('advice', '')}" if (
        failed_anew or state in (FAILED, STOPPED, LOST)) else f"{state}: the run went on"
    if state in (FAILED, STOPPED, LOST):
        resumed = run.inv("resume", "--host", run.host, "--run", run.run_id, "--detach")
        if resumed.returncode != 0:
            return result(cell, "resume-failed", f"{said}; `inv resume` exit {resumed.returncode}: "
                          f"{resumed.stdout[-300:]} {resumed.stderr[-300:]}", reaction, kind=kind)
    left = leftovers(run, processes) if failed_anew or state in (FAILED, STOPPED, LOST) else {}
    if left:
        return result(cell, "left-behind", f"{said}; left running: {left}", reaction, kind=kind)
    if (failed_anew or state in (FAILED, STOPPED, LOST)) and not named:
        return result(cell, "unnamed", said, reaction, kind=kind)
    outcome = "failed-named" if state in (FAILED, STOPPED, LOST) else "recovered"
    return result(cell, outcome, said, reaction, kind=kind)


def settled(run: LabRun, before: dict, laptop_side: bool) -> tuple[str, dict, bool]:
    """The run once the supervisor is done reacting (state, status, whether a failure was recorded): a
    failure recorded and judged (restarting, or the next attempt up), the run ended or lost, or SETTLE_S
    without either (the run went on: a step started again within its attempt, a port moved). A fault only
    the laptop's commands meet leaves the run as it was: looked at once."""
    deadline = time.monotonic() + (0 if laptop_side else SETTLE_S)
    while True:
        status, state = run.files(), run.state()
        failed_anew = failures_of(run) > before["failures"]
        attempts = len(status.get("attempts") or [])
        judged = failed_anew and (state not in (RUNNING, STALLED) or attempts > before["attempts"])
        if judged or state in (LOST, *FINAL_STATES) or time.monotonic() > deadline:
            return state, status, failed_anew
        time.sleep(0.2)


def leftovers(run: LabRun, processes: dict[int, str]) -> dict[int, str]:
    """The processes of the run before the fault that a new attempt (or a resume) should have ended: all
    but each node's supervisor, when it is still the same one, what started it (a Slurm job's script) and
    what launched it (a Slurm step's srun, on the head's node: its ancestors are slurmstepd's); their command
    lines, short."""
    supervisors = {run_files(directory).get("supervisor_pid") for directory in run.dirs()} - {None}
    keep = supervisors.union(*(ancestors(pid) for pid in supervisors))
    serving = [directory for directory in run.dirs() if run_files(directory).get("supervisor_pid") in processes]
    old = {pid: args for pid, args in processes.items() if pid not in keep
           and not any(f"{directory}/code/run/supervisor.py" in args for directory in serving)}
    return {pid: args[:120] for pid, args in still_running(old).items()}


# ---- the run's end -----------------------------------------------------------------------------------------

def run_end(run: LabRun) -> dict:
    """The run waited for to its end, and checked: succeeded, every sample once and whole, the states equal
    transformers', no process of it left. {"ok", "symptom", "state"}."""
    deadline = time.monotonic() + RUN_END_TIMEOUT_S
    while run.state() not in FINAL_STATES and time.monotonic() < deadline:
        time.sleep(1)
    state, status = run.state(), run.files()
    left = still_running(run_processes(run))
    if state != SUCCEEDED:
        failure = status.get("last_failure") or {}
        return {"ok": False, "state": state, "outcome": "resume-failed" if state in FINAL_STATES else "silent",
                "symptom": f"the run ended {state}: {failure.get('kind')}: {failure.get('explain')}"}
    if left:
        return {"ok": False, "state": state, "outcome": "left-behind",
                "symptom": f"left running after the run's end: {left}"}
    try:
        checked = data_check(run, status)
    except AssertionError as wrong:
        return {"ok": False, "state": state, "outcome": "data-wrong", "symptom": str(wrong)[:400]}
    return {"ok": True, "state": state, "outcome": "recovered", "symptom": checked}


def data_check(run: LabRun, status: dict) -> str:
    if run.path != "in-process":
        rows = status.get("samples_total")
        report = outputs.check_dataset(str(run.out), rows, n_layers=len(LAYERS), hidden_size=128)
        assert report["complete"] and not report["extra"], {k: report[k] for k in ("by_status", "extra")}
        measured = states_against_transformers(run.out, files=rows)
        return f"{rows} files once, states within bf16 of transformers' (max diff {measured['max_abs_diff']['input']})"
    total = (status.get("heartbeat") or {}).get("samples_total")
    names = sorted(path.name for path in run.out.iterdir())
    samples = sorted(name for name in names if re.fullmatch(r"data_\d+\.pt", name))
    assert samples == sorted(f"data_{i}.pt" for i in range(total)), f"{len(samples)} of {total}: {names[:20]}"
    assert not [n for n in names if ".tmp." in n], names
    reference = subprocess.run([str(HOME / "venv-cpu" / "bin" / "python"), str(PROGRAMS / "hidden_states_reference.py"),
                                str(run.out), str(HOME / "models" / "tiny-llama")],
                               capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert reference.returncode == 0, reference.stderr[-2000:]
    report = json_line(reference.stdout)
    assert report["samples"] == total and not report["bad_shapes"], report
    assert max(report["max_abs_diff"].values()) < IN_PROCESS_TOLERANCE, report
    return f"{total} files once, states within {IN_PROCESS_TOLERANCE} of transformers'"


# ---- a whole run -------------------------------------------------------------------------------------------

def run_cells(spec: Run, log: Callable[[str], None] = print) -> dict:
    """Every cell of `spec` on the lab: {"run", "seconds", "end", "cells": [result…]}, the end's verdict
    folded into the cells that depend on it (a cell is recovered only if the run's end is)."""
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory() as scratch, lab_run(spec, Path(scratch)) as run:
        for cell in (c for c in spec.cells if c.phase == "preflight"):
            results.append(preflight_cell(run, spec, cell, Path(scratch)))
            log(f"{cell.id}: {results[-1]['outcome']}: {results[-1]['symptom']}")
        launch(run, spec)
        log(f"{spec.name}: run {run.run_id} on {run.host}")
        during = [inject(run, cell, log) for cell in spec.cells if cell.phase not in ("preflight", "ended")]
        end = run_end(run)
        log(f"{spec.name}: the run's end: {end}")
        for cell_result in during:
            if rank(cell_result["outcome"]) < 2 and not end["ok"]:
                cell_result.update(outcome=end["outcome"], symptom=f"{cell_result['symptom']}; the run's end: "
                                   f"{end['symptom']}"[:400])
        results += during
        if end["ok"]:
            results += [ended_cell(run, cell, log) for cell in spec.cells if cell.phase == "ended"]
        else:
            results += [result(cell, "phase-missed", f"the run did not succeed: {end['symptom']}")
                        for cell in spec.cells if cell.phase == "ended"]
        for cell_result in results:
            log(f"{cell_result['cell']}: {cell_result['outcome']} ({cell_result['detection_s']} s): "
                f"{cell_result['symptom']}")
    return {"run": spec.name, "run_id": run.run_id, "seconds": round(time.monotonic() - started),
            "end": end, "cells": results}
