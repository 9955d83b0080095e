"""Fresh remote environments for the patch tests: a real venv of the lab user per test.

A template venv (speculators + vLLM installed --no-deps from the lab's wheels)
is built once and kept under the lab user's cache; each test gets a hard-linked
copy of it (`cp -al`: seconds, not 1.3 GB), with the files patches write given
their own inodes. The engine never writes in place (temporary file + rename),
and neither does pip, so the template stays pristine; `template()` checks the
patch targets against the wheels' RECORD hashes and rebuilds it otherwise.
"""
from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from support.lab import lab_entry
from support.paths import REPO

LAB_USER = "specrig"
WHEELS = Path("/var/lib/specrig-lab/wheels")
PATCHSET = "speculators-0.3-vllm-0.16-0.17"
STALE_ENV_S = 6 * 3600
KIMI_CONFIG = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"}}


def lab_home() -> Path:
    return Path(pwd.getpwnam(LAB_USER).pw_dir)


def as_lab_user(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(["runuser", "-u", LAB_USER, "--", *argv], capture_output=True, text=True,
                            cwd="/", **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{argv!r} failed ({result.returncode}): {result.stderr[-2000:]}")
    return result


def _wheels() -> list[Path]:
    wheels = sorted(WHEELS.glob("*.whl"))
    if not any(w.name.startswith("speculators-") for w in wheels) or not any(w.name.startswith("vllm-")
                                                                             for w in wheels):
        pytest.skip(f"the lab's wheels ({WHEELS}) are missing: run `inv lab.up`")
    return wheels


def _site_packages(prefix: Path) -> Path:
    return next((prefix / "lib").glob("python3*/site-packages"))


def record_hashes(site: Path) -> dict[str, str]:
    """{path: sha256 hex} from the RECORD of every installed distribution."""
    hashes = {}
    for record in site.glob("*.dist-info/RECORD"):
        with record.open(newline="") as handle:
            for row in csv.reader(handle):
                if len(row) >= 2 and row[1].startswith("sha256="):
                    digest = base64.urlsafe_b64decode(row[1][len("sha256="):] + "==")
                    hashes[row[0]] = digest.hex()
    return hashes


def target_paths() -> list[str]:
    import yaml

    data = yaml.safe_load((REPO / "patchsets" / PATCHSET / "patchset.yaml").read_text())
    return sorted({patch["target"]["path"] for patch in data["patches"]})


def _intact(prefix: Path) -> bool:
    try:
        site = _site_packages(prefix)
    except StopIteration:
        return False
    recorded = record_hashes(site)
    return all(path in recorded and sha256_file(site / path) == recorded[path] for path in target_paths())


def template() -> Path:
    """The template venv for the lab's wheels, built when missing or not pristine."""
    wheels = _wheels()
    key = hashlib.sha256("".join(f"{w.name}:{w.stat().st_size}" for w in wheels).encode()).hexdigest()[:12]
    root = lab_home() / ".cache" / "specrig-test"
    path = root / f"template-{key}"
    if path.exists() and _intact(path):
        return path
    staging = root / f"template-{key}.building-{uuid.uuid4().hex[:8]}"
    as_lab_user("mkdir", "-p", str(root))
    as_lab_user("/usr/bin/python3", "-m", "venv", str(staging))
    as_lab_user(str(staging / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                *map(str, wheels), timeout=600)
    # Python hard-codes nothing about the venv's own path, so a copy elsewhere works as is.
    shutil.rmtree(path, ignore_errors=True)
    staging.rename(path)
    return path


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclasses.dataclass
class PatchEnv:
    """One test's venv on the lab host, and a Host (inventory entry) whose python is its interpreter."""

    prefix: Path
    inventory: Path

    @property
    def python(self) -> str:
        return str(self.prefix / "bin" / "python")

    @property
    def site(self) -> Path:
        return _site_packages(self.prefix)

    @property
    def host(self):
        from specrig.inventory import load_inventory

        return load_inventory(self.inventory).host("lab")

    @property
    def state_dir(self) -> Path:
        return self.prefix / ".specrig" / "patches"

    def target(self, path: str) -> Path:
        return self.site / path

    def package_hashes(self) -> dict[str, str]:
        """sha256 of every file of the environment's speculators and vllm (dist-info included)."""
        hashes = {}
        for top in sorted(self.site.iterdir()):
            if top.name.split("-")[0] in ("speculators", "vllm"):
                for path in sorted(top.rglob("*")) if top.is_dir() else [top]:
                    if path.is_file():
                        hashes[str(path.relative_to(self.site))] = sha256_file(path)
        return hashes

    def target_hashes(self) -> dict[str, str]:
        return {path: sha256_file(self.target(path)) for path in target_paths()}

    def replace_file(self, path: Path, data: bytes) -> None:
        """Change a file the way upstream or pip would: a new file renamed over the old one."""
        temp = path.with_name(path.name + ".test-new")
        temp.write_bytes(data)
        shutil.copymode(path, temp)
        owner = path.stat()
        os.chown(temp, owner.st_uid, owner.st_gid)
        os.replace(temp, path)

    def model_dir(self, config: dict = KIMI_CONFIG) -> str:
        """A model directory on the host holding only config.json (what the analysis reads)."""
        directory = self.prefix / "model"
        as_lab_user("mkdir", "-p", str(directory))
        as_lab_user("tee", str(directory / "config.json"), input=json.dumps(config))
        return str(directory)

    def manifest(self) -> dict | None:
        path = self.state_dir / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else None

    def pip_reinstall(self, wheel_prefix: str, wheels: Path = WHEELS) -> None:
        wheel = next(wheels.glob(f"{wheel_prefix}-*.whl"))
        as_lab_user(self.python, "-m", "pip", "install", "--quiet", "--force-reinstall", "--no-deps",
                    "--no-index", str(wheel), timeout=600)


def make_patch_env(make_inventory, trusted_known_hosts) -> PatchEnv:
    source = template()
    envs = lab_home() / "specrig-test-envs"
    for stale in envs.glob("*") if envs.exists() else []:
        if time.time() - stale.stat().st_mtime > STALE_ENV_S:  # left by an interrupted run
            shutil.rmtree(stale, ignore_errors=True)
    prefix = envs / uuid.uuid4().hex[:12]
    as_lab_user("mkdir", "-p", str(envs))
    as_lab_user("cp", "-al", str(source), str(prefix))
    # The files the engine rewrites get inodes of their own: the template can never be touched through them.
    site = _site_packages(prefix)
    for path in target_paths():
        as_lab_user("cp", "--remove-destination", str(_site_packages(source) / path), str(site / path))
    inventory = make_inventory({"hosts": {"lab": lab_entry(python=str(prefix / "bin" / "python"))}})
    trusted_known_hosts(inventory)
    return PatchEnv(prefix=prefix, inventory=inventory)


@pytest.fixture
def patch_env(lab, make_inventory, trusted_known_hosts):
    env = make_patch_env(make_inventory, trusted_known_hosts)
    yield env
    shutil.rmtree(env.prefix, ignore_errors=True)


def engine_bundle() -> Path:
    """The bundle (remote/ + patchsets as JSON) unpacked where the lab user can run it, as a host has it."""
    from specrig.transport.bundle import current_bundle

    bundle = current_bundle()
    root = lab_home() / ".cache" / "specrig-test" / "bundles" / bundle.digest
    for old in root.parent.glob("*") if root.parent.exists() else []:
        # Bundles of code since changed, once no run can still be using them: a suite running
        # beside this one (another checkout, another version) has a bundle of its own here.
        if old.name != bundle.digest and time.time() - old.stat().st_mtime > STALE_ENV_S:
            shutil.rmtree(old, ignore_errors=True)
    if not (root / ".complete").exists():
        staging = root.with_name(root.name + f".{uuid.uuid4().hex[:8]}")
        for name, data in bundle.files:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(data)
        (staging / ".complete").write_text(bundle.digest)
        user = pwd.getpwnam(LAB_USER)
        for path in [staging, *staging.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid)
        if root.exists():
            shutil.rmtree(staging)
        else:
            staging.rename(root)
    return root


def start_engine(env: PatchEnv, action: str, args: dict | None = None) -> subprocess.Popen:
    """`<python> remote/entry.py <args.json>` as the lab user: the engine's `patch.<action>` exactly as a
    call runs it."""
    bundle = engine_bundle()
    call = env.prefix / f"call-{uuid.uuid4().hex[:8]}.json"
    call.write_text(json.dumps({"command": f"patch.{action}", "args": args or {}}))
    user = pwd.getpwnam(LAB_USER)
    os.chown(call, user.pw_uid, user.pw_gid)
    return subprocess.Popen([env.python, str(bundle / "remote" / "entry.py"), str(call)], user=user.pw_uid,
                            group=user.pw_gid, extra_groups=[], env={"HOME": user.pw_dir, "PATH": "/usr/bin:/bin"},
                            cwd=user.pw_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def engine_result(process: subprocess.Popen, timeout: float = 120) -> dict:
    """The {"ok": ..., "result"/"error": ...} reply of a finished engine run."""
    out, err = process.communicate(timeout=timeout)
    line = next((l for l in reversed(out.decode().splitlines()) if l.startswith("@@SPECRIG-RESULT@@")), None)
    assert line is not None, f"no result (exit {process.returncode}): {err.decode()[-2000:]}"
    return json.loads(line.split(" ", 1)[1])


def run_engine(env: PatchEnv, action: str, args: dict | None = None) -> dict:
    return engine_result(start_engine(env, action, args))
