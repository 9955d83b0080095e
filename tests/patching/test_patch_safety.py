"""Dry runs change nothing; an upstream change refuses the whole run; a reinstall shows as missing patches."""
import json

from specrig.exit_status import ExitStatus
from specrig.patching.patches import apply_patches, patch_status
from support.lab import inv

GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"


def test_dry_run_prints_diffs_and_changes_nothing(patch_env):
    env = patch_env
    before = env.package_hashes()
    result = inv("apply-patches", "--host", "lab", "--dry-run", inventory=env.inventory, timeout=300)
    assert result.returncode == ExitStatus.OK, result.stderr
    assert "+            block_size=self.vllm_config.cache_config.block_size," in result.stdout
    assert "-            kv_cache_specs=kv_cache_spec," in result.stdout
    assert "dry run: nothing was changed" in result.stdout

    as_json = inv("apply-patches", "--host", "lab", "--dry-run", "--json", inventory=env.inventory, timeout=300)
    files = {f["path"]: f for f in json.loads(as_json.stdout)["files"]}
    assert files[GENERATOR]["diff"].startswith(f"--- a/{GENERATOR}\n+++ b/{GENERATOR}\n")
    assert env.package_hashes() == before
    assert not (env.prefix / ".specrig").exists(), "a dry run creates no state, not even the lock"


def test_anchor_gone_upstream_refuses_the_whole_run(patch_env):
    env = patch_env
    generator = env.target(GENERATOR)
    # Upstream moved the Scheduler construction into a factory: patch scheduler-block-size's anchor is gone.
    env.replace_file(generator, generator.read_bytes().replace(b"self.scheduler = Scheduler(",
                                                               b"self.scheduler = make_scheduler("))
    before = env.package_hashes()

    result = inv("apply-patches", "--host", "lab", inventory=env.inventory, timeout=300)
    assert result.returncode == ExitStatus.FINDINGS
    message = " ".join(result.stderr.split())
    assert "nothing was changed" in message
    assert "patch scheduler-block-size" in message and "expected 1 call to Scheduler(...), found 0" in message
    assert "Traceback" not in result.stderr and "conflict" in result.stdout  # the table of states, then the error
    assert env.package_hashes() == before, "no patch of the set may be applied, in any file"
    assert env.manifest() is None or env.manifest()["files"] == {}

    as_json = inv("apply-patches", "--host", "lab", "--json", inventory=env.inventory, timeout=300)
    assert as_json.returncode == ExitStatus.FINDINGS
    states = {p["id"]: p["state"] for p in json.loads(as_json.stdout)["patches"]}
    assert states["scheduler-block-size"] == "conflict" and states["kimi-k25-supports-eagle3"] == "pending"
    status = {p["id"]: p for p in patch_status(env.host)["patches"]}
    assert status["scheduler-block-size"]["state"] == "conflict"
    dry = inv("apply-patches", "--host", "lab", "--dry-run", inventory=env.inventory, timeout=300)
    assert dry.returncode == ExitStatus.FINDINGS and "the run would be refused" in dry.stderr
    assert env.package_hashes() == before


def test_ambiguous_anchor_is_a_conflict(patch_env):
    env = patch_env
    generator = env.target(GENERATOR)
    snippet = b"        aux_hidden_states = captured_states_list[0]\n"
    env.replace_file(generator, generator.read_bytes().replace(snippet, snippet * 2))
    result = inv("apply-patches", "--host", "lab", inventory=env.inventory, timeout=300)
    assert result.returncode == ExitStatus.FINDINGS
    assert "patch collective-rpc-single-reply" in result.stderr and "occurs 2 times (expected 1)" in result.stderr


def test_reinstall_after_patching_shows_missing_and_apply_restores(patch_env):
    env = patch_env
    apply_patches(env.host)
    patched = env.target_hashes()

    env.pip_reinstall("speculators")
    status = {p["id"]: p for p in patch_status(env.host)["patches"]}
    assert status["drop-kv-cache-specs"]["state"] == "missing"
    assert "replaced by its original" in status["drop-kv-cache-specs"]["reason"]
    assert status["worker-embed-input-ids"]["state"] == "missing"
    assert status["kimi-k25-supports-eagle3"]["state"] == "applied", "vllm was not reinstalled"
    shown = inv("patch-status", "--host", "lab", inventory=env.inventory)
    assert "missing" in shown.stdout and "reinstalled?" in " ".join(shown.stdout.split())

    restored = apply_patches(env.host)
    written = {f["path"] for f in restored["files"] if f["bytes_written"]}
    assert written == {GENERATOR, "speculators/data_generation/custom_worker.py"}
    assert env.target_hashes() == patched
    assert all(p["state"] in ("applied", "not-applicable") for p in patch_status(env.host)["patches"])


def set_vllm_version(env, version):
    metadata = next(env.site.glob("vllm-*.dist-info")) / "METADATA"
    text = metadata.read_text()
    current = next(line for line in text.splitlines() if line.startswith("Version: "))
    env.replace_file(metadata, text.replace(current, f"Version: {version}").encode())


def test_a_nightly_is_picked_and_an_unsupported_version_is_explained(patch_env):
    env = patch_env
    set_vllm_version(env, "0.16.0rc2.dev344+gea5f903f8")
    status = patch_status(env.host)
    assert status["patchset"]["name"] == "speculators-0.3-vllm-0.16-0.17"
    assert status["facts"]["packages"]["vllm"]["version"] == "0.16.0rc2.dev344+gea5f903f8"

    set_vllm_version(env, "0.18.0")
    result = inv("apply-patches", "--host", "lab", inventory=env.inventory, timeout=300)
    assert result.returncode == ExitStatus.USAGE
    message = " ".join(result.stderr.split())
    assert "no patchset applies to speculators 0.3.0, vllm 0.18.0" in message
    assert "vllm 0.18.0 is not in ==0.16.* or ==0.17.*" in message
    assert not (env.prefix / ".specrig").exists()


def test_a_read_only_target_directory_refuses_the_whole_run(patch_env):
    env = patch_env
    directory = env.target(GENERATOR).parent
    before = env.package_hashes()
    mode = directory.stat().st_mode
    directory.chmod(0o555)
    try:
        result = inv("apply-patches", "--host", "lab", inventory=env.inventory, timeout=300)
    finally:
        directory.chmod(mode)
    assert result.returncode == ExitStatus.USAGE
    assert "nothing was changed: specrig cannot write to" in result.stderr and "data_generation" in result.stderr
    assert env.package_hashes() == before, "the vLLM file, writable, is not patched either"
