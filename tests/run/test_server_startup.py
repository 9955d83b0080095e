"""A server-mode attempt's start-up off its critical path (issue 26): the prepared-data cache's key and its
atomic entries (remote/run/server/prepared_cache.py), and the warm start of a client step
(remote/run/server/warm_start.py) with a stand-in for speculators' CLI. The whole attempt, on the lab:
test_server_startup_lab.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from base import prepared
from run.server import prepared_cache, warm_steps

SETTINGS = {"seq_length": 1024, "max_samples": None, "seed": 0, "speculators": "0.9.0", "speculators_sources": "s1",
            "datasets": "5.1.0", "vllm": "0.32.0"}


def model_dir(root: Path) -> Path:
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "tokenizer.json").write_text('{"vocab": {"a": 0}}')
    (model / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    (model / "special_tokens_map.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "README.md").write_text("about the model")
    return model


def wanted(root: Path, **changes) -> dict:
    dataset = root / "chat.jsonl"
    if not dataset.exists():
        dataset.write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    return {"dataset": str(dataset), "model": str(root / "model"), **SETTINGS, **changes}


def key(root: Path, **changes) -> str:
    return prepared_cache.cache_key(prepared_cache.key_inputs(wanted(root, **changes)))


def test_the_same_inputs_keep_the_key_and_a_copy_of_the_dataset_elsewhere_too(tmp_path):
    model_dir(tmp_path)
    first = key(tmp_path)
    assert key(tmp_path) == first
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes((tmp_path / "chat.jsonl").read_bytes())
    assert key(tmp_path, dataset=str(elsewhere)) == first  # a file's name changes nothing prepare-data writes
    # Files rendering does not read: the weights, a README.
    (tmp_path / "model" / "model.safetensors").write_bytes(b"other weights")
    (tmp_path / "model" / "README.md").write_text("edited")
    assert key(tmp_path) == first


@pytest.mark.parametrize("change", ["dataset", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                    "config.json", "chat_template.jinja", "seq_length", "max_samples", "seed",
                                    "speculators", "speculators_sources", "datasets", "vllm"])
def test_every_input_changes_the_key(tmp_path, change):
    model = model_dir(tmp_path)
    before = key(tmp_path)
    changes = {}
    if change == "dataset":
        (tmp_path / "chat.jsonl").write_text('{"conversations": [{"role": "user", "content": "ho"}]}\n')
    elif "." in change:
        (model / change).write_text("changed")
    else:
        changes = {change: {"seq_length": 2048, "max_samples": 10, "seed": 1, "speculators": "0.8.1",
                            "speculators_sources": "s2", "datasets": "5.0.1", "vllm": "0.26.0"}[change]}
    assert key(tmp_path, **changes) != before


def test_a_directory_dataset_keys_its_json_files_names_and_bytes(tmp_path):
    model_dir(tmp_path)
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.jsonl").write_text("{}\n")
    (data / "sub" / "b.json").write_text("[]")
    (data / "notes.txt").write_text("not data")
    first = key(tmp_path, dataset=str(data))
    (data / "notes.txt").write_text("other notes")
    assert key(tmp_path, dataset=str(data)) == first
    (data / "sub" / "b.json").rename(data / "sub" / "c.json")  # the order speculators loads them in
    assert key(tmp_path, dataset=str(data)) != first


@pytest.mark.parametrize("dataset", ["hf:org/chat", "/nowhere/chat.jsonl"])
def test_a_dataset_that_is_no_local_file_has_no_key(tmp_path, dataset):
    model_dir(tmp_path)
    with pytest.raises(prepared_cache.NoKey, match="no local file or directory"):
        prepared_cache.key_inputs(wanted(tmp_path, dataset=dataset))


def test_file_hashes_are_remembered_until_the_file_changes(tmp_path, monkeypatch):
    model_dir(tmp_path)
    hashes = prepared_cache.FileHashes(str(tmp_path / "hashes.json"))
    first = prepared_cache.key_inputs(wanted(tmp_path), hashes)
    reads = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: reads.append(str(path)) or real_open(path, *a, **k))
    again = prepared_cache.key_inputs(wanted(tmp_path), prepared_cache.FileHashes(str(tmp_path / "hashes.json")))
    assert again == first and not [r for r in reads if r.endswith((".jsonl", "tokenizer.json"))], reads
    time.sleep(0.01)
    (tmp_path / "chat.jsonl").write_text('{"conversations": []}\n')
    changed = prepared_cache.key_inputs(wanted(tmp_path), prepared_cache.FileHashes(str(tmp_path / "hashes.json")))
    assert changed["dataset"] != first["dataset"] and changed["tokenizer"] == first["tokenizer"]


def prepared_dir(path: Path, rows: int = 3) -> Path:
    """A directory shaped as prepare-data's (state.json lists the data files; complete() reads only that)."""
    path.mkdir(parents=True)
    (path / "data-00000-of-00001.arrow").write_bytes(b"\0" * (8 * rows))
    (path / "dataset_info.json").write_text("{}")
    (path / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    return path


def test_publish_is_atomic_private_and_a_second_publisher_of_the_key_leaves_the_first_entry(tmp_path):
    cache = prepared_cache.PreparedCache(str(tmp_path / "work" / prepared_cache.CACHE))
    source = prepared_dir(tmp_path / "run" / "prepared")
    assert cache.lookup("k") is None
    assert cache.publish("k", str(source), {"format": 1}) is True
    entry = Path(cache.data("k"))
    assert prepared.complete(str(entry)) and cache.lookup("k") == str(entry)
    assert os.stat(cache.root).st_mode & 0o777 == 0o700
    assert json.loads((Path(cache.root) / "k" / prepared_cache.KEY_FILE).read_text()) == {"format": 1}
    # Hard links: the run's directory removed, the cache's stays whole.
    assert os.path.samefile(entry / "state.json", source / "state.json")
    other = prepared_dir(tmp_path / "other" / "prepared", rows=5)
    assert cache.publish("k", str(other), {"format": 1}) is False
    assert (entry / "data-00000-of-00001.arrow").stat().st_size == 24
    assert not [name for name in os.listdir(cache.root) if name.startswith(".partial")]


def test_two_publishers_racing_on_one_key_never_leave_a_partial_entry(tmp_path, monkeypatch):
    """Both get past the "already there?" look; one rename wins, the other's copy is dropped."""
    cache = prepared_cache.PreparedCache(str(tmp_path / prepared_cache.CACHE))
    sources = [prepared_dir(tmp_path / f"run{n}" / "prepared", rows=n + 1) for n in range(2)]
    both_linked = threading.Barrier(2)
    real_link_tree = prepared_cache.link_tree

    def link_tree(source, target):
        real_link_tree(source, target)
        both_linked.wait(timeout=10)

    monkeypatch.setattr(prepared_cache, "link_tree", link_tree)
    made = []
    threads = [threading.Thread(target=lambda s=s: made.append(cache.publish("k", str(s), {}))) for s in sources]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(made) == [False, True]
    assert os.listdir(cache.root) == ["k"] and prepared.complete(cache.data("k"))


def test_a_hit_links_the_entry_as_the_runs_prepared_directory_and_a_broken_entry_is_dropped(tmp_path):
    cache = prepared_cache.PreparedCache(str(tmp_path / prepared_cache.CACHE))
    cache.publish("k", str(prepared_dir(tmp_path / "first" / "prepared")), {})
    target = tmp_path / "run" / "prepared"
    target.parent.mkdir()
    assert cache.link_into("k", str(target)) is True
    assert prepared.complete(str(target)) and sorted(os.listdir(target.parent)) == ["prepared"]
    os.unlink(Path(cache.data("k")) / "data-00000-of-00001.arrow")
    assert cache.lookup("k") is None and os.listdir(cache.root) == []
    assert cache.link_into("k", str(tmp_path / "run" / "again")) is False


def test_the_key_job_hits_after_a_publish_and_says_why_it_cannot_key(tmp_path):
    model_dir(tmp_path)
    plan = {"prepared_key": wanted(tmp_path), "prepared": str(tmp_path / "run" / "prepared")}
    (tmp_path / "run").mkdir()
    root = str(tmp_path / "work" / prepared_cache.CACHE)
    job = warm_steps.KeyJob(plan, root, str(tmp_path)).start()
    job.thread.join()
    assert job.outcome == warm_steps.MISS and not os.path.exists(plan["prepared"])
    prepared_dir(Path(plan["prepared"]))
    assert job.publish() == "kept in the prepared-data cache as %s" % job.key
    os.rename(plan["prepared"], str(tmp_path / "run" / "old"))
    again = warm_steps.KeyJob(plan, root, str(tmp_path)).start()
    again.thread.join()
    assert (again.outcome, again.key) == (warm_steps.HIT, job.key) and prepared.complete(plan["prepared"])
    plan["prepared_key"] = wanted(tmp_path, dataset="hf:org/chat")
    unkeyed = warm_steps.KeyJob(plan, root, str(tmp_path)).start()
    unkeyed.thread.join()
    assert unkeyed.outcome == warm_steps.NO_KEY and "hf:org/chat is no local file" in unkeyed.detail


# ---- the warm start -------------------------------------------------------------------------------------------

#: A stand-in for speculators: its CLI import takes a while and says when it happened; `python -m` runs its
#: __main__, which records its argv and when it ran, and exits with the status its step names.
FAKE_CLI = """import time
time.sleep(0.5)
with open("imported", "w") as f:
    f.write(repr(time.time()))
"""
FAKE_MAIN = """import json, sys, time
import speculators.cli
with open("ran", "w") as f:
    json.dump({"argv": sys.argv[1:], "at": time.time(), "main": __name__, "path0": sys.path[0]}, f)
sys.exit(int(sys.argv[2]) if sys.argv[1] == "fail" else 0)
"""


@pytest.fixture
def fake_speculators(tmp_path):
    package = tmp_path / "site" / "speculators"
    (package / "cli").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cli" / "__init__.py").write_text(FAKE_CLI)
    (package / "__main__.py").write_text(FAKE_MAIN)
    work = tmp_path / "run"
    work.mkdir()
    return work, dict(os.environ, PYTHONPATH=str(tmp_path / "site"))


def test_the_warm_start_imports_first_runs_the_step_as_python_m_after_its_go(fake_speculators):
    work, env = fake_speculators
    go = work / "1-client.go"
    argv = warm_steps.warm_argv([sys.executable, "-m", "speculators", "generate-offline-data", "--x", "1"], str(go))
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not Path(str(go) + ".ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.5)
    assert (work / "imported").exists() and not (work / "ran").exists() and proc.poll() is None
    go.write_text("")
    released = time.time()
    assert proc.wait(timeout=30) == 0
    ran = json.loads((work / "ran").read_text())
    assert ran["argv"] == ["generate-offline-data", "--x", "1"] and ran["main"] == "__main__"
    assert ran["path0"] == str(work)  # as `python -m`: not warm_start.py's directory
    assert float((work / "imported").read_text()) < released <= ran["at"] + 0.01
    assert ran["at"] - released < 1.0
    assert "imported in" in proc.stdout.read()


def test_the_warm_start_exits_as_the_step_exits(fake_speculators):
    work, env = fake_speculators
    go = work / "go"
    go.write_text("")
    argv = warm_steps.warm_argv([sys.executable, "-m", "speculators", "fail", "7"], str(go))
    assert subprocess.run(argv, cwd=work, env=env, capture_output=True).returncode == 7


def test_the_warm_start_does_not_run_the_step_once_its_supervisor_is_gone(fake_speculators):
    """Its parent (a stand-in for the supervisor) exits before the go: the step never runs."""
    work, env = fake_speculators
    go = work / "go"
    argv = warm_steps.warm_argv([sys.executable, "-m", "speculators", "prepare-data"], str(go))
    parent = ("import subprocess, sys, time\n"
              "p = subprocess.Popen(sys.argv[1:])\n"
              "print(p.pid, flush=True)\n"
              "while True:\n"
              "    import os\n"
              "    if os.path.exists(%r): break\n"
              "    time.sleep(0.05)\n") % (str(go) + ".ready")
    run = subprocess.run([sys.executable, "-c", parent, *argv], cwd=work, env=env, capture_output=True, text=True,
                         timeout=30)
    child = int(run.stdout.split()[0])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and "zombie" not in Path(f"/proc/{child}/status").read_text().lower():
        assert time.monotonic() < deadline, "the warm start outlived its parent"
        time.sleep(0.05)
    go.write_text("")
    time.sleep(0.2)
    assert not (work / "ran").exists()


def test_a_warm_process_dying_in_its_imports_fails_the_attempt_as_its_step_classified(tmp_path):
    """generate-offline-data's warm process finds no speculators while the server loads: the attempt's look
    returns the step's failure, classified from driver.log (missing-package, role the step), not retried."""
    from test_server_supervision import workload

    extraction = workload(tmp_path)
    extraction.supervisor.options.update(grace_s=5.0)
    missing = [sys.executable, "-m", "speculators_nowhere", "generate-offline-data"]
    extraction.plan.update(prepared=str(tmp_path / "run" / "prepared"), prepare_argv=missing,
                           generate_argvs=[missing], prepared_key=None)
    entry = {"attempt": 1}
    startup = warm_steps.StartUp(extraction, entry)
    extraction.startup = startup
    try:
        assert startup.begin(time.time()) is None
        assert sorted(extraction.jobs.running) == ["client", "prepare"]
        assert extraction.supervisor.status["jobs"]["client"]["argv"][1] == warm_steps.WARM_START
        deadline = time.monotonic() + 60
        while (found := startup.look()) is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        extraction.jobs.end_all()
    assert found["kind"] == "missing-package" and found["callee"] == "speculators_nowhere", found
    assert found["role"] in (warm_steps.PREPARE, warm_steps.GENERATE) and not found["retryable"], found
    log = Path(extraction.client_log).read_text()
    assert "exited with status 1 before its go" in log
    assert entry["startup"]["server_started"] and "health" not in entry["startup"]


def test_prepare_data_is_done_once_its_directory_is_whole_though_its_process_still_exits(tmp_path):
    """save_to_disk writes state.json, then dataset_info.json: only both whole end the step early."""
    directory = tmp_path / "prepared"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        step = warm_steps.PreparedStep(lambda: [sleeper], str(directory))
        assert step.poll() is None
        prepared_dir(directory)
        (directory / "dataset_info.json").write_text('{"features": {"input_ids"')  # being written
        assert prepared.complete(str(directory)) and step.poll() is None
        (directory / "dataset_info.json").write_text('{"features": {}}')
        assert step.poll() == 0 and step.ending
    finally:
        sleeper.kill()
        sleeper.wait()
    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    failing.wait()
    assert warm_steps.PreparedStep(lambda: [failing], str(tmp_path / "nothing")).poll() == 3


def test_the_sources_digest_follows_the_files_prepare_data_runs(tmp_path):
    """A patch of the rendering changes the key; a file prepare-data does not run (the client's requests) does not."""
    for name in (*prepared_cache.PREPARE_SOURCES, "speculators/data_generation/vllm_client.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("# " + name)
    first = prepared_cache.sources_digest(str(tmp_path))
    (tmp_path / "speculators/data_generation/vllm_client.py").write_text("# patched")
    assert prepared_cache.sources_digest(str(tmp_path)) == first
    (tmp_path / "speculators/data_generation/render_client.py").write_text("# patched")
    assert prepared_cache.sources_digest(str(tmp_path)) != first


def test_a_plan_keys_this_environments_speculators_and_its_sources():
    """prepared_cache.key_of reads the client's own environment (the supervisor's, hosts.yaml `python`)."""
    settings = {"dataset": "/d.jsonl", "model": "/m", "max_length": 1024, "max_samples": None, "seed": 0}
    wanted = prepared_cache.key_of(settings, "0.32.0")
    assert wanted["vllm"] == "0.32.0" and wanted["seq_length"] == 1024 and wanted["dataset"] == "/d.jsonl"
    assert set(wanted) == {"dataset", "model", "seq_length", "max_samples", "seed", "speculators",
                           "speculators_sources", "datasets", "vllm"}
