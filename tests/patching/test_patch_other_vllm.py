"""The patchset on other vLLM releases (0.17.x, nightlies): verify (drift) → apply → verify (clean) → revert.

The lab holds vLLM 0.16.0 only; point SPECRIG_VLLM_WHEELS at a directory of
other vLLM wheels (e.g. `pip download vllm==0.17.0 --no-deps -d DIR`) to run it.
"""
import os
from pathlib import Path

import pytest

from specrig.drift.verify import verify
from specrig.patching.patches import apply_patches, claimed_fixes, patch_status, remaining_drift, revert_patches

WHEELS = Path(os.environ.get("SPECRIG_VLLM_WHEELS", "/nonexistent"))
VLLM_WHEELS = sorted(WHEELS.glob("vllm-*.whl"))


@pytest.mark.skipif(not VLLM_WHEELS, reason="set SPECRIG_VLLM_WHEELS to a directory of vLLM wheels")
@pytest.mark.parametrize("wheel", VLLM_WHEELS, ids=[w.name.split("-")[1] for w in VLLM_WHEELS])
def test_patchset_fixes_what_verify_reports_on(patch_env, wheel):
    env = patch_env
    env.pip_reinstall("-".join(wheel.name.split("-")[:2]), wheels=wheel.parent)
    original = env.package_hashes()
    model = env.model_dir()

    before = verify(env.host, model=model)
    status = patch_status(env.host)
    assert status["facts"]["packages"]["vllm"]["version"] == wheel.name.split("-")[1]
    claimed = claimed_fixes(status)
    assert before.drift and {f["id"] for f in remaining_drift(before.findings, claimed)} == before.ids

    applied = apply_patches(env.host, model=model)
    assert applied["verification"]["remaining"] == [] and applied["verification"]["other_drift"] == []
    assert verify(env.host, model=model).drift == []

    revert_patches(env.host)
    assert env.package_hashes() == original
