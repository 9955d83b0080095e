"""Released wheels for the drift tests, downloaded once into ~/.cache/specrig/wheels (as check-compat does)."""
from __future__ import annotations

import functools
import os

from specrig.drift import compat
from support import paths

FIXTURES = paths.FIXTURES / "drift"
KIMI_CONFIG = FIXTURES / "kimi-k25" / "config.json"


@functools.cache
def root(name: str, version: str) -> dict:
    return compat.package_root(name, version)


def sources(*packages: tuple[str, str, str]):
    """(path, text) of every .py file under each (name, version, package folder) of the released wheels."""
    for name, version, package in packages:
        top = os.path.join(root(name, version)["root"], package)
        for directory, _, files in os.walk(top):
            for file in sorted(files):
                if file.endswith(".py"):
                    path = os.path.join(directory, file)
                    with open(path, "rb") as handle:
                        yield path, handle.read().decode("utf-8", errors="replace")


@functools.cache
def report(vllm: str, *, model_config: str | None = None) -> dict:
    return compat.analyze_roots([root("speculators", "0.3.0")], root("vllm", vllm), model_config=model_config)


def ids(data: dict) -> set[str]:
    return {f["id"] for f in data["findings"]}


@functools.cache
def compat_report(speculators: str, vllm: str) -> dict:
    return compat.analyze_roots([root("speculators", speculators)], root("vllm", vllm))
