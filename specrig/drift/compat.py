"""`inv check-compat`: the same drift analysis on released wheels, no host needed.

Wheels come from `pip download --no-deps` into ~/.cache/specrig/wheels and are
unpacked there once, .py files only (compiled modules are listed in a manifest
so that imports of them still resolve). The analyzer (remote/drift/) runs in
this process: it is standard-library code, the same that runs on hosts.

For speculators >= 0.8 (server mode, specrig.contract.extraction_mode) the hs-connectors
release speculators pins is fetched too: the analyzer compares its file backend with the
connector config specrig's launch sends.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specrig.contract import (
    COMPILED_MANIFEST,
    COMPILED_SUFFIXES,
    HS_CONNECTORS,
    SERVER,
    InvalidVersion,
    Version,
    extraction_mode,
)
from specrig.drift.verify import VERIFY_TIMEOUT_S, Report
from specrig.errors import CouldNotCheck, UsageError
from specrig.inventory import LOCAL, Host
from specrig.transport import connect

WHEEL_CACHE = Path("~/.cache/specrig/wheels").expanduser()
COMPLETE_MARKER = ".specrig-unpacked"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def check_version(name: str, version: str) -> str:
    try:
        Version(version or "")
    except InvalidVersion:
        raise UsageError(f"invalid {name} version {version!r}", hint="give a release such as 0.16.0") from None
    return version


def find_wheel(name: str, version: str, cache: Path = WHEEL_CACHE) -> Path | None:
    prefix = f"{_normalized(name)}-{version}-"
    for wheel in sorted(cache.glob("*.whl")):
        if _normalized(wheel.name.split("-")[0]) + "-" + wheel.name.split("-")[1] + "-" == prefix:
            return wheel
    return None


def fetch_wheel(name: str, version: str, cache: Path = WHEEL_CACHE) -> Path:
    """The wheel of name==version, downloaded once into the cache."""
    check_version(name, version)
    found = find_wheel(name, version, cache)
    if found is not None:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                           "--disable-pip-version-check", "-q", "-d", str(cache), f"{name}=={version}"],
                          capture_output=True, text=True)
    found = find_wheel(name, version, cache)
    if proc.returncode != 0 or found is None:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no wheel downloaded"]
        raise CouldNotCheck(f"cannot download {name}=={version}: {last[0]}",
                            hint=f"check the version exists: pip index versions {name}")
    return found


def unpack(wheel: Path, cache: Path = WHEEL_CACHE) -> Path:
    """The wheel's .py files under cache/unpacked/<name>-<version>/ (unpacked once, atomically)."""
    name, version = wheel.name.split("-")[:2]
    target = cache / "unpacked" / f"{_normalized(name)}-{version}"
    if (target / COMPLETE_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        compiled = []
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.endswith(".py"):
                    archive.extract(member, staging)
                elif member.endswith(COMPILED_SUFFIXES):
                    parts = member.split("/")
                    parts[-1] = parts[-1].split(".")[0]
                    compiled.append(".".join(parts))
        (staging / COMPILED_MANIFEST).write_text("".join(m + "\n" for m in sorted(compiled)))
        (staging / COMPLETE_MARKER).write_text(wheel.name + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def package_root(name: str, version: str, cache: Path = WHEEL_CACHE) -> dict:
    """{"name", "version", "root", "package"} of an unpacked release, downloading it if needed."""
    root = unpack(fetch_wheel(name, version, cache), cache)
    return {"name": name, "version": version, "root": str(root), "package": _normalized(name)}


def analyze_roots(consumers: list[dict], provider: dict, *, model_config: str | None = None,
                  storage: str | None = None) -> dict:
    """Run the analyzer on unpacked package roots with this machine's Python, through the same
    primitive as on a host (`--host local`); a bad root or config is CouldNotCheck. `storage`: a
    server-mode storage type whose points are then drift, not notes."""
    args = {"consumer_roots": consumers, "provider_root": provider}
    if model_config:
        args["model_config"] = model_config
    if storage:
        args["storage"] = storage
    with connect(Host(name=LOCAL, python=sys.executable)) as remote:
        try:
            return remote.call("verify", args, timeout=VERIFY_TIMEOUT_S)
        except UsageError as exc:
            raise CouldNotCheck(exc.message, hint=exc.hint) from None


def pinned_version(wheel: Path, dependency: str) -> str | None:
    """The version `wheel`'s METADATA pins `dependency` to (`Requires-Dist: name==X`), or None."""
    pattern = re.compile(r"^Requires-Dist:\s*" + re.escape(dependency).replace(r"\-", "[-_.]")
                         + r"\s*\(?\s*==\s*([^\s;,)]+)", re.I | re.M)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.endswith(".dist-info/METADATA"):
                found = pattern.search(archive.read(member).decode("utf-8", "replace"))
                return found.group(1) if found else None
    return None


def consumer_releases(speculators: str, cache: Path = WHEEL_CACHE) -> list[tuple[str, str, Path]]:
    """(name, version, wheel) of speculators, and in server mode (>= 0.8) of the hs-connectors release
    it pins (the same version when the pin cannot be read; left out when it cannot be downloaded)."""
    wheel = fetch_wheel("speculators", speculators, cache)
    releases = [("speculators", speculators, wheel)]
    if extraction_mode(speculators) == SERVER:
        version = pinned_version(wheel, HS_CONNECTORS) or speculators
        try:
            releases.append((HS_CONNECTORS, version, fetch_wheel(HS_CONNECTORS, version, cache)))
        except CouldNotCheck:
            pass  # optional: the analyzer skips the file-backend check without it
    return releases


def consumer_roots(speculators: str, cache: Path = WHEEL_CACHE) -> list[dict]:
    """The unpacked roots of consumer_releases()."""
    return [package_root(name, version, cache) for name, version, _ in consumer_releases(speculators, cache)]


def check_compat(speculators: str, vllm: str, *, model_config: str | None = None, storage: str | None = None,
                 cache: Path = WHEEL_CACHE) -> Report:
    if model_config and not Path(model_config).expanduser().is_file():
        raise UsageError(f"--model-config {model_config!r} is not a file", hint="give a model's config.json")
    consumers = consumer_roots(speculators, cache)
    provider = package_root("vllm", vllm, cache)
    data = analyze_roots(consumers, provider,
                         model_config=str(Path(model_config).expanduser()) if model_config else None, storage=storage)
    return Report(data=data, source="wheels")


def split_versions(text: str, name: str) -> list[str]:
    versions = [v.strip() for v in text.split(",") if v.strip()]
    if not versions:
        raise UsageError(f"no {name} version in {text!r}", hint="give versions separated by commas: 0.11.0,0.16.0")
    return [check_version(name, v) for v in versions]


def matrix(speculators_versions: list[str], vllm_versions: list[str], *, model_config: str | None = None,
           storage: str | None = None, cache: Path = WHEEL_CACHE) -> dict:
    """{"rows": speculators versions, "columns": vLLM versions, "cells": {spec: {vllm: drift count}}, "ids"}."""
    cells: dict[str, dict[str, int]] = {}
    ids: dict[str, dict[str, list[str]]] = {}
    for spec in speculators_versions:
        cells[spec], ids[spec] = {}, {}
        for vllm in vllm_versions:
            report = check_compat(spec, vllm, model_config=model_config, storage=storage, cache=cache)
            cells[spec][vllm] = len(report.drift)
            ids[spec][vllm] = sorted(report.ids)
    return {"rows": speculators_versions, "columns": vllm_versions, "cells": cells, "ids": ids}

