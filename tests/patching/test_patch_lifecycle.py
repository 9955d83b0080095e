"""verify (drift) → apply → verify (clean) → apply again (no-op) → revert (original bytes), on a real venv."""
import json
import os

import pytest

from specrig.drift.verify import verify
from specrig.exit_status import ExitStatus
from specrig.patching.patches import apply_patches, claimed_fixes, patch_status, remaining_drift, revert_patches
from support.lab import inv
from support.patchenv import PATCHSET

#: What users first met on vLLM 0.16 with Kimi-K2.5 (docs/findings.md), each a patch's claim.
FIRST_MET = {
    "unexpected-keyword:vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups:kv_cache_specs",
    "missing-argument:vllm.v1.core.sched.scheduler.Scheduler:block_size",
    "missing-argument:vllm.config.scheduler.SchedulerConfig:is_encoder_decoder",
    "trust-remote-code:transformers.AutoTokenizer.from_pretrained:"
    "speculators.data_generation.vllm_hidden_states_generator",
    "model-interface:vllm.model_executor.models.kimi_k25.KimiK25ForConditionalGeneration:SupportsEagle3",
}


def unchanged_stats(paths):
    return {str(p): (os.stat(p).st_ino, os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in paths}


def test_verify_apply_verify_apply_again_revert(patch_env):
    env = patch_env
    model = env.model_dir()
    original = env.package_hashes()

    before = verify(env.host, model=model)
    status = patch_status(env.host)
    claimed = claimed_fixes(status)
    assert FIRST_MET <= before.ids
    assert {f["id"] for f in remaining_drift(before.findings, claimed)} == before.ids, \
        "the patchset claims every drift verify-signatures reports on vLLM 0.16.0"

    applied = apply_patches(env.host, model=model)
    assert applied["verification"]["remaining"] == [] and applied["verification"]["other_drift"] == []
    states = {p["id"]: p["state"] for p in applied["patches"]}
    assert states["request-drop-eos-token-id"] == "not-applicable"  # vLLM 0.16 still takes eos_token_id
    assert set(states.values()) == {"applied", "not-applicable"} and applied["bytes_written"] > 0

    after = verify(env.host, model=model)
    assert not remaining_drift(after.findings, claimed) and after.drift == []
    manifest = env.manifest()
    recorded = {p["id"] for entry in manifest["files"].values() for p in entry["patches"]}
    assert recorded == {p["id"] for p in applied["patches"] if p.get("applied_now")}
    for entry in manifest["files"].values():
        assert {"id", "patchset", "sha256_before", "sha256_after", "applied_at", "specrig_version"} <= \
            set(entry["patches"][0])
        assert (env.state_dir / entry["backup"]).read_bytes() and entry["original_sha256"] == original[
            os.path.relpath(entry["file"], env.site)]

    watched = [env.target(path) for path in env.target_hashes()] + sorted(env.state_dir.rglob("*"))
    stats = unchanged_stats(watched)
    again = apply_patches(env.host, model=model)
    assert again["bytes_written"] == 0
    assert {p["id"]: p["state"] for p in again["patches"]} == states
    assert all(p["by"] == "specrig" for p in again["patches"] if p["state"] == "applied")
    assert unchanged_stats(watched) == stats, "a second apply must write nothing, not even the manifest"

    reverted = revert_patches(env.host)
    assert {f["outcome"] for f in reverted["files"]} == {"restored original"}
    assert env.package_hashes() == original
    assert env.manifest()["files"] == {} and not list((env.state_dir / "backups").iterdir())


def test_cli_status_json_and_partial_revert(patch_env):
    env = patch_env
    result = inv("apply-patches", "--host", "lab", "--json", inventory=env.inventory, timeout=300)
    assert result.returncode == ExitStatus.OK, result.stderr
    assert json.loads(result.stdout)["patchset"]["name"] == PATCHSET

    status = inv("patch-status", "--host", "lab", "--json", inventory=env.inventory)
    patches = {p["id"]: p for p in json.loads(status.stdout)["patches"]}
    assert patches["scheduler-block-size"]["state"] == "applied"

    partial = inv("revert-patches", "--host", "lab", "--patch", "scheduler-block-size", inventory=env.inventory)
    assert partial.returncode == ExitStatus.OK, partial.stderr
    patches = {p["id"]: p for p in patch_status(env.host)["patches"]}
    assert patches["scheduler-block-size"]["state"] == "pending"
    assert patches["drop-kv-cache-specs"]["state"] == "applied" and patches["drop-kv-cache-specs"]["by"] == "specrig"

    unknown = inv("revert-patches", "--host", "lab", "--patch", "no-such-patch", inventory=env.inventory)
    assert unknown.returncode == ExitStatus.USAGE and "'no-such-patch'" in unknown.stderr


def test_revert_refuses_a_file_changed_since_patched(patch_env):
    env = patch_env
    original = env.target_hashes()
    apply_patches(env.host)
    worker = env.target("speculators/data_generation/custom_worker.py")
    env.replace_file(worker, worker.read_bytes() + b"# edited by hand after patching\n")
    edited = env.target_hashes()

    refused = inv("revert-patches", "--host", "lab", inventory=env.inventory)
    assert refused.returncode == ExitStatus.FINDINGS
    assert "custom_worker.py changed since specrig patched it" in refused.stderr and "--force" in refused.stderr
    assert env.target_hashes() == edited, "a refused revert changes nothing, not even the other files"

    forced = inv("revert-patches", "--host", "lab", "--force", inventory=env.inventory)
    assert forced.returncode == ExitStatus.OK, forced.stderr
    assert env.target_hashes() == original


def test_hand_made_fix_counts_as_applied(patch_env):
    env = patch_env
    generator = env.target("speculators/data_generation/vllm_hidden_states_generator.py")
    env.replace_file(generator, generator.read_bytes().replace(
        b"AutoTokenizer.from_pretrained(model_path)",
        b"AutoTokenizer.from_pretrained(\n            model_path, trust_remote_code=True\n        )"))
    patches = {p["id"]: p for p in patch_status(env.host)["patches"]}
    assert patches["tokenizer-trust-remote-code"]["state"] == "applied"
    assert patches["tokenizer-trust-remote-code"]["by"] == "already fixed (not by specrig)"
    applied = apply_patches(env.host)
    recorded = [p["id"] for e in env.manifest()["files"].values() for p in e["patches"]]
    assert "tokenizer-trust-remote-code" not in recorded and applied["bytes_written"] > 0


@pytest.mark.parametrize("patchset, message", [
    ("no-such-set", "no patchset named 'no-such-set'"),
])
def test_unknown_patchset_is_a_usage_error(patch_env, patchset, message):
    result = inv("apply-patches", "--host", "lab", "--patchset", patchset, inventory=patch_env.inventory)
    assert result.returncode == ExitStatus.USAGE and message in result.stderr
    assert not patch_env.state_dir.exists()


def test_revert_with_nothing_applied_is_a_no_op(patch_env):
    result = inv("revert-patches", "--host", "lab", inventory=patch_env.inventory)
    assert result.returncode == ExitStatus.OK and "nothing to revert" in result.stdout
    assert not patch_env.state_dir.exists()


@pytest.mark.parametrize("columns", ["80", "200"])
def test_patch_status_is_readable_narrow_and_wide(patch_env, columns):
    """Narrow: one block per patch (its id and state on a line of their own); wide: a table. Nothing cut."""
    result = inv("patch-status", "--host", "lab", inventory=patch_env.inventory, env={"COLUMNS": columns})
    assert result.returncode == ExitStatus.OK, result.stderr
    assert "…" not in result.stdout
    ids = [p["id"] for p in json.loads(inv("patch-status", "--host", "lab", "--json",
                                           inventory=patch_env.inventory).stdout)["patches"]]
    lines = result.stdout.splitlines()
    for patch_id in ids:
        if columns == "80":
            assert any(line.startswith(f"{patch_id}  ") for line in lines), patch_id
        else:
            assert any(f" {patch_id} " in line for line in lines), patch_id
