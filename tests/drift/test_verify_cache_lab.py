"""verify-signatures' host-side cache (remote/drift/answers.py) on the real lab host, each change that
could alter the answer made for real on a private copy of the lab venv (support/patchenv.py): a
repeat is one call answered from the cache; every such change is a miss that says why."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from specrig.contract import CACHE_BYPASSED, CACHE_HIT, CACHE_MISS
from specrig.drift.verify import verify, verify_host
from specrig.inventory import load_inventory
from specrig.patching.patches import apply_patches, revert_patches
from specrig.transport import connect
from specrig.transport.bundle import Bundle, current_bundle
from support.lab import inv_json, lab_entry
from support.patchenv import PatchEnv, as_lab_user
from support.runnable_env import clean_venv_copy

SCHEDULER = "vllm/v1/core/sched/scheduler.py"
BLOCK_SIZE_DRIFT = "missing-argument:vllm.v1.core.sched.scheduler.Scheduler:block_size"


@pytest.fixture
def cached_env(patch_env, make_inventory, trusted_known_hosts):
    """The private venv with a workdir of its own inside it (the cache's directory starts empty)."""
    workdir = patch_env.prefix / "work"
    inventory = make_inventory({"hosts": {"lab": lab_entry(python=patch_env.python, workdir=str(workdir))}})
    trusted_known_hosts(inventory)
    patch_env.inventory = inventory
    return patch_env


def state(report) -> str:
    return report.data["cache"]["state"]


def without_cache(report) -> dict:
    return {key: value for key, value in report.data.items() if key != "cache"}


def assert_miss_then_hit(env, why: str, **options):
    """The next verify analyses again, saying `why` (a path or a phrase in its reason); the one after
    is answered from the cache with the same report."""
    missed = verify(env.host, **options)
    assert state(missed) == CACHE_MISS, missed.data["cache"]
    assert why in missed.data["cache"]["why"]
    hit = verify(env.host, **options)
    assert state(hit) == CACHE_HIT
    assert without_cache(hit) == without_cache(missed)
    return missed


def test_repeat_is_one_call_from_the_private_cache_and_no_cache_bypasses_it(cached_env):
    env = cached_env
    first = verify(env.host)
    assert state(first) == CACHE_MISS
    assert first.data["cache"]["why"].startswith("no answer kept")
    with connect(env.host) as remote:
        again = verify_host(remote)
        assert remote.exec_count == 1
    assert state(again) == CACHE_HIT
    assert without_cache(again) == without_cache(first)

    cache = env.prefix / "work" / "verify-cache"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert [stat.S_IMODE(p.stat().st_mode) for p in cache.iterdir()] == [0o600]

    bypassed = verify(env.host, use_cache=False)
    assert state(bypassed) == CACHE_BYPASSED
    assert bypassed.ids == first.ids

    code, data = inv_json("verify-signatures", "--host", "lab", inventory=env.inventory)
    assert (code, data["cache"]["state"]) == (1, CACHE_HIT)
    code, data = inv_json("verify-signatures", "--host", "lab", "--no-cache", inventory=env.inventory)
    assert (code, data["cache"]["state"]) == (1, CACHE_BYPASSED)


def test_hand_edits_that_leave_record_untouched(cached_env):
    env = cached_env
    verify(env.host)
    record = env.site / "vllm-0.16.0.dist-info" / "RECORD"
    recorded = record.read_bytes()
    scheduler = env.target(SCHEDULER)

    # An editor's save: new bytes, a new file renamed over the old one (an inode of this copy's own:
    # the template it was hard-linked from is not touched by the in-place edit below).
    env.replace_file(scheduler, scheduler.read_bytes() + b"# a hand edit\n")
    assert_miss_then_hit(env, SCHEDULER)

    # In place, same size, mtime put back (cp -p, touch -d): only ctime and the bytes tell.
    before = scheduler.stat()
    assert before.st_nlink == 1
    data = scheduler.read_bytes()
    edited = data.replace(b"# a hand edit\n", b"# A HAND EDIT\n")
    assert len(edited) == len(data) and edited != data
    with scheduler.open("r+b") as handle:
        handle.write(edited)
    os.utime(scheduler, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = scheduler.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert_miss_then_hit(env, SCHEDULER)

    # A hand edit that changes the answer: the drift it fixes is gone at once.
    source = scheduler.read_text()
    fixed = source.replace("        block_size: int,\n", "        block_size: int = 16,\n", 1)
    assert fixed != source
    env.replace_file(scheduler, fixed.encode())
    missed = assert_miss_then_hit(env, SCHEDULER)
    assert BLOCK_SIZE_DRIFT not in missed.ids

    # A consumer module added by hand (RECORD knows nothing of it): its package's listing changed.
    package = env.site / "speculators" / "data_generation"
    as_lab_user("tee", str(package / "hand_added.py"), input="from vllm import SamplingParams\n")
    assert_miss_then_hit(env, str(package))
    assert record.read_bytes() == recorded


def tiny_wheel(directory: Path, version: str) -> Path:
    """A real wheel of a one-module distribution, `specrig_cache_probe`, for pip to install."""
    name = f"specrig_cache_probe-{version}"
    files = {"specrig_cache_probe.py": b"VALUE = 1\n",
             f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: specrig-cache-probe\nVersion: {version}\n".encode(),
             f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: specrig-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in files.items()) + f"{name}.dist-info/RECORD,,\n"
    files[f"{name}.dist-info/RECORD"] = record.encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    wheel = directory / f"{name}-py3-none-any.whl"
    wheel.write_bytes(buffer.getvalue())
    wheel.chmod(0o644)
    return wheel


def test_packages_installed_upgraded_and_removed(cached_env):
    env = cached_env
    verify(env.host)
    wheels = env.prefix.parent / f"{env.prefix.name}-wheels"
    as_lab_user("mkdir", "-p", str(wheels))
    try:
        for version in ("1.0", "1.1"):  # installed, then upgraded
            wheel = tiny_wheel(Path("/tmp"), version)
            as_lab_user("cp", str(wheel), str(wheels / wheel.name))
            wheel.unlink()
            as_lab_user(env.python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                        str(wheels / wheel.name), timeout=300)
            assert_miss_then_hit(env, str(env.site))
        as_lab_user(env.python, "-m", "pip", "uninstall", "--quiet", "--yes", "specrig-cache-probe", timeout=300)
        assert_miss_then_hit(env, str(env.site))
    finally:
        as_lab_user("rm", "-rf", str(wheels))


def test_specrig_apply_and_revert(cached_env):
    env = cached_env
    model = env.model_dir()
    before = verify(env.host, model=model)
    assert BLOCK_SIZE_DRIFT in before.ids
    apply_patches(env.host, model=model)  # its verify analyses the patched files and keeps the answer
    after = verify(env.host, model=model)
    assert state(after) == CACHE_HIT
    assert BLOCK_SIZE_DRIFT not in after.ids
    revert_patches(env.host)
    reverted = assert_miss_then_hit(env, str(env.site), model=model)
    assert reverted.ids == before.ids


def test_the_model_config(cached_env):
    env = cached_env
    model = env.model_dir()
    verify(env.host, model=model)
    assert state(verify(env.host, model=model)) == CACHE_HIT
    config = Path(model) / "config.json"
    as_lab_user("tee", str(config), input=json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    assert_miss_then_hit(env, str(config), model=model)


def test_the_analyzers_own_code(cached_env):
    env = cached_env
    verify(env.host)
    assert state(verify(env.host)) == CACHE_HIT
    changed = Bundle(current_bundle().files + [("remote/drift/a_changed_analyzer.py", b"# not the same code\n")])
    with connect(env.host, bundle=changed) as remote:
        missed = verify_host(remote)
    assert state(missed) == CACHE_MISS
    assert missed.data["cache"]["why"].startswith("no answer kept")
    host = load_inventory(env.inventory).host("lab")
    assert state(verify(host)) == CACHE_HIT, "the current code's answer is still kept"


def test_a_package_installed_in_the_server_environment(lab, make_inventory, trusted_known_hosts):
    """Server mode (speculators 0.9 here, vLLM in server_python's environment, read by another
    process): an install there is seen too, through that environment's sys.path listings."""
    server = clean_venv_copy(Path("/home/specrig/venv-server-0.32"))
    try:
        inventory = make_inventory({"hosts": {"lab": lab_entry(
            python="~/venv-spec-0.9/bin/python", server_python=str(server / "bin" / "python"),
            workdir=str(server / "work"))}})
        trusted_known_hosts(inventory)
        env = PatchEnv(prefix=server, inventory=inventory)
        assert state(verify(env.host)) == CACHE_MISS
        assert state(verify(env.host)) == CACHE_HIT
        wheel = tiny_wheel(Path("/tmp"), "1.0")
        as_lab_user("cp", str(wheel), str(server / wheel.name))
        wheel.unlink()
        as_lab_user(env.python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    str(server / wheel.name), timeout=300)
        assert_miss_then_hit(env, str(env.site))
    finally:
        shutil.rmtree(server, ignore_errors=True)
