"""kill -9 of the engine at random points, and two clients at once: files are never half patched.

The engine runs as any call runs it, `<python> remote/entry.py <args.json>`,
as the lab user with the test venv's interpreter; here started directly so that
it can be killed at any instant.
"""
import ast
import fcntl
import hashlib
import json
import os
import random
import signal
import subprocess
import threading
import time

from specrig.exit_status import ExitStatus
from support.lab import inv
from support.patchenv import run_engine, start_engine, target_paths

KILL_TRIALS = 60
REVERT_KILL_TRIALS = 20


def key_of(path):
    return "%s:%s" % (path.split("/")[0], path)


def assert_consistent(env, original, patched):
    """Every target is the original or the fully patched file, parses, and the manifest agrees with it.

    The manifest agrees when, after a killed run's intent is read the way the engine reads it (a file
    holding the intended bytes was written), it records exactly the patched files as patched.
    """
    manifest = env.manifest() or {"files": {}, "intent": None}
    intent = (manifest.get("intent") or {}).get("files", {})
    for path in target_paths():
        data = env.target(path).read_bytes()
        ast.parse(data)
        digest = hashlib.sha256(data).hexdigest()
        assert digest in (original[path], patched[path]), f"{path} is neither the original nor the patched file"
        entry, intended = manifest["files"].get(key_of(path)), intent.get(key_of(path))
        if intended:
            assert digest in (intended["from_sha256"], intended["to_sha256"])
            if digest == intended["to_sha256"]:
                entry = intended["entry"]
        if digest == patched[path]:
            assert entry and entry["patched_sha256"] == digest, f"{path} is patched; the manifest says otherwise"
        else:
            assert entry is None, f"{path} is the original; the manifest records it patched"


def patch_states(env):
    reply = run_engine(env, "status")
    assert reply["ok"], reply
    return reply["result"]


def reset(env, original_bytes):
    for path, data in original_bytes.items():
        env.replace_file(env.target(path), data)
        for stale in env.target(path).parent.glob(".*.specrig-tmp-*"):
            stale.unlink()
    subprocess.run(["rm", "-rf", str(env.prefix / ".specrig")], check=True)


def test_kill_9_during_apply_never_leaves_a_half_patched_file(patch_env):
    env = patch_env
    original_bytes = {path: env.target(path).read_bytes() for path in target_paths()}
    original = env.target_hashes()

    # Calibrate: how long a whole apply takes, and when it starts writing (the manifest's intent appears).
    started = time.monotonic()
    process = start_engine(env, "apply")
    first_write = None
    while process.poll() is None:
        if first_write is None and (env.state_dir / "manifest.json").exists():
            first_write = time.monotonic() - started
        time.sleep(0.0005)
    whole = time.monotonic() - started
    first_write = first_write or whole / 2
    patched = env.target_hashes()
    assert all(patched[p] != original[p] for p in target_paths())
    reset(env, original_bytes)

    outcomes = {"original": 0, "partly written": 0, "fully written": 0}
    rng = random.Random(4)
    for trial in range(KILL_TRIALS):
        # Half the kills anywhere in the run, half inside the part that writes.
        window = (0.0, whole) if trial % 2 else (max(0.0, first_write - 0.002), whole)
        process = start_engine(env, "apply")
        time.sleep(rng.uniform(*window))
        os.kill(process.pid, signal.SIGKILL)
        process.wait()

        assert_consistent(env, original, patched)
        now = env.target_hashes()
        outcomes["original" if now == original else "fully written" if now == patched else "partly written"] += 1
        states = patch_states(env)
        assert {p["state"] for p in states["patches"]} <= {"applied", "pending", "not-applicable"}
        assert {r["state"] for r in states["recorded"]} <= {"intact"}

        # The next run recovers: it completes the apply, and a revert then restores the original bytes.
        reply = run_engine(env, "apply")
        assert reply["ok"], reply
        assert env.target_hashes() == patched and env.manifest()["intent"] is None
        assert not [p for path in target_paths() for p in env.target(path).parent.glob(".*.specrig-tmp-*")]
        reply = run_engine(env, "revert")
        assert reply["ok"], reply
        assert env.target_hashes() == original
        reset(env, original_bytes)
    print(f"kill -9 outcomes over {KILL_TRIALS} trials: {outcomes}")


def test_kill_9_during_revert_never_leaves_a_half_restored_file(patch_env):
    env = patch_env
    original = env.target_hashes()
    assert run_engine(env, "apply")["ok"]
    patched = env.target_hashes()
    started = time.monotonic()
    assert run_engine(env, "revert")["ok"]
    whole = time.monotonic() - started
    rng = random.Random(9)
    for _ in range(REVERT_KILL_TRIALS):
        assert run_engine(env, "apply")["ok"]
        process = start_engine(env, "revert")
        time.sleep(rng.uniform(0, whole))
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        assert_consistent(env, original, patched)
        assert run_engine(env, "revert")["ok"]
        assert env.target_hashes() == original


def test_two_applies_at_once_one_waits_or_fails_clearly(patch_env):
    env = patch_env
    original = env.target_hashes()
    results = []

    def apply():
        results.append(inv("apply-patches", "--host", "lab", "--json", inventory=env.inventory, timeout=300))

    threads = [threading.Thread(target=apply) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    codes = sorted(r.returncode for r in results)
    assert codes in ([0, 0], [0, ExitStatus.LOCKED]), [r.stderr for r in results]
    for result in results:
        if result.returncode == ExitStatus.LOCKED:
            assert "another specrig client is changing the patches" in result.stderr
    written = sum(json.loads(r.stdout)["bytes_written"] for r in results if r.returncode == 0)
    assert written > 0
    states = patch_states(env)
    assert {p["state"] for p in states["patches"]} == {"applied", "not-applicable"}
    assert [r["state"] for r in states["recorded"]] == ["intact"] * len(states["recorded"])

    # Engines started together, several times: never a corrupt file or manifest.
    patched = env.target_hashes()
    for _ in range(5):
        assert run_engine(env, "revert")["ok"]
        pair = [start_engine(env, "apply") for _ in range(2)]
        replies = [json.loads(p.communicate(timeout=120)[0].decode().rsplit("@@SPECRIG-RESULT@@ ", 1)[1])
                   for p in pair]
        assert any(r["ok"] for r in replies)
        assert all(r["ok"] or r["error"]["kind"] == "locked" for r in replies), replies
        assert_consistent(env, original, patched)
        assert env.target_hashes() == patched


def test_a_held_lock_refuses_apply_and_revert_naming_the_holder(patch_env):
    env = patch_env
    assert run_engine(env, "apply")["ok"]
    assert run_engine(env, "revert", {"patch": "scheduler-block-size"})["ok"]
    before = env.target_hashes()
    with open(env.state_dir / "lock", "r+") as lock:
        # Another client (the engine's own protocol: flock, then its holder record).
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.truncate()
        lock.write(json.dumps({"pid": 4242, "host": "laptop-b", "action": "apply", "since": "2026-01-01T00:00:00Z"}))
        lock.flush()
        for task in ("apply-patches", "revert-patches"):
            result = inv(task, "--host", "lab", inventory=env.inventory, timeout=300)
            assert result.returncode == ExitStatus.LOCKED, result.stderr
            assert "another specrig client" in result.stderr and "pid 4242 on laptop-b" in result.stderr
        assert env.target_hashes() == before
    result = inv("apply-patches", "--host", "lab", inventory=env.inventory, timeout=300)
    assert result.returncode == ExitStatus.OK, result.stderr
    assert {p["state"] for p in patch_states(env)["patches"]} == {"applied", "not-applicable"}
