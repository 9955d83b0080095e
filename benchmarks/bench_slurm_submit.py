"""Seconds from `inv extract --host lab-slurm` to its job RUNNING, against sbatch of an equivalent script by hand.

Runs against the lab's Slurm (`inv lab.up --runnable --slurm`), as root, on an idle cluster. specrig's
side is the real task: the login node's checks (the mode, Slurm's request and shared-filesystem checks,
with or without the usual preflight), the run directory, the job script, sbatch. By hand is one `ssh`
to the login node running `sbatch` of a script with the same #SBATCH lines (its payload a sleep: the
time to RUNNING does not depend on it). A poller here (squeue every 50 ms) notes when each new job is
RUNNING; each job is cancelled then, before any model loads.

    python benchmarks/bench_slurm_submit.py [--repeat N]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "remote"))

from slurm import jobs
from specrig.inventory import load_inventory

#: The jobs each side submits are told apart by name: a run's job is specrig-<run id>.
RUN_JOB, BY_HAND = "specrig-2", "bench-by-hand"
HOME = Path("/home/specrig")
MODEL, DATA = HOME / "models" / "tiny-llama", HOME / "data" / "tiny-chat.jsonl"
SSH = ["ssh", "-p", "2222", "-i", str(REPO / ".lab" / "client_key"), "-o", "BatchMode=yes",
       "-o", f"UserKnownHostsFile={REPO / '.specrig' / 'known_hosts'}", "specrig@127.0.0.1"]


class RunningWatch:
    """squeue every 50 ms: when each job named `prefix...`, not in the queue at the start, was first seen
    RUNNING (by name: specrig's own test job, the shared-filesystem check, runs meanwhile)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.before = set(self.jobs())
        self.running: dict[str, float] = {}
        #: When each new job was first seen in the queue at all (submitted).
        self.queued: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def jobs(self) -> dict[str, str]:
        listed = subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True).stdout
        return {job: state for job, state, name in (line.split() for line in listed.splitlines())
                if name.startswith(self.prefix)}

    def _watch(self):
        while not self._stop.is_set():
            now = time.perf_counter()
            for job, state in self.jobs().items():
                if job not in self.before:
                    self.queued.setdefault(job, now)
                    if state == "RUNNING":
                        self.running.setdefault(job, now)
            time.sleep(0.05)

    def until_running(self, timeout=120.0) -> tuple[str, float, float]:
        """(the job, when it was first seen queued, when RUNNING)."""
        deadline = time.perf_counter() + timeout
        while not self.running:
            if time.perf_counter() > deadline:
                raise TimeoutError("no new job ran")
            time.sleep(0.02)
        self._stop.set()
        self._thread.join()
        job, running = next(iter(self.running.items()))
        return job, self.queued[job], running


def by_hand(script: str) -> tuple[float, float]:
    """(seconds to queued, to RUNNING)."""
    watch = RunningWatch(BY_HAND)
    started = time.perf_counter()
    subprocess.run(SSH + ["sbatch --parsable"], input=script, capture_output=True, text=True, check=True)
    job, queued, running = watch.until_running()
    jobs.cancel(job)  # scancel, and wait until it has left the queue
    return queued - started, running - started


def with_specrig(*preflight: str) -> tuple[float, float]:
    """(seconds to queued, to RUNNING)."""
    watch = RunningWatch(RUN_JOB)
    out = HOME / "specrig-slurm" / "bench-out" / uuid.uuid4().hex[:8]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), "extract", "--host", "lab-slurm",
                           "--model", str(MODEL), "--data", str(DATA), "--out", str(out), "--max-len", "512", *preflight,
                           "--json"], capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(done.stdout + done.stderr)
    job, queued, running = watch.until_running()
    jobs.cancel(job)  # scancel, and wait until it has left the queue
    launched = json.loads(done.stdout)
    assert launched["slurm"]["job_id"] == job, (launched["slurm"], job)
    # The run directory of a run that never ran: removed, so that `inv status` does not list it.
    shutil.rmtree(launched["path"])
    return queued - started, running - started


def equivalent() -> str:
    """A script with the #SBATCH request of lab-slurm's run (jobs.script's options), its payload a sleep,
    its output thrown away."""
    settings = load_inventory(REPO / "hosts.yaml").host("lab-slurm").slurm
    options = jobs.options(settings, name=BY_HAND, directory="/tmp") + jobs.requeue_options(settings)
    kept = [option for option in options if not option.startswith(("--output", "--error", "--chdir"))]
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {option}" for option in kept), "#SBATCH --output=/dev/null",
                      "sleep 30", ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the median is shown")
    repeat = parser.parse_args().repeat
    cases: dict[str, list[tuple[float, float]]] = {"inv extract (with preflight)": [],
                                                   "inv extract --skip-preflight": [], "sbatch by hand (one ssh)": []}
    for _ in range(repeat):
        cases["inv extract (with preflight)"].append(with_specrig())
        cases["inv extract --skip-preflight"].append(with_specrig("--skip-preflight"))
        cases["sbatch by hand (one ssh)"].append(by_hand(equivalent()))
    hand = [statistics.median(times) for times in zip(*cases["sbatch by hand (one ssh)"], strict=True)]
    print(f"{'case':32} {'queued s':>9} {'added':>6} {'RUNNING s':>10} {'added':>6}   runs (queued/RUNNING)")
    for name, runs in cases.items():
        queued, running = (statistics.median(times) for times in zip(*runs, strict=True))
        print(f"{name:32} {queued:9.2f} {queued - hand[0]:6.2f} {running:10.2f} {running - hand[1]:6.2f}   "
              + ", ".join(f"{q:.2f}/{r:.2f}" for q, r in runs))


if __name__ == "__main__":
    main()
