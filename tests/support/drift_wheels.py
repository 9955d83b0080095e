"""Released wheels for the drift tests, downloaded once into ~/.cache/specrig/wheels (as check-compat does)."""
from __future__ import annotations

import functools

from specrig.drift import compat
from support import paths

FIXTURES = paths.FIXTURES / "drift"
KIMI_CONFIG = FIXTURES / "kimi-k25" / "config.json"


@functools.cache
def root(name: str, version: str) -> dict:
    return compat.package_root(name, version)


@functools.cache
def report(vllm: str, *, model_config: str | None = None) -> dict:
    return compat.analyze_roots([root("speculators", "0.3.0")], root("vllm", vllm), model_config=model_config)


def ids(data: dict) -> set[str]:
    return {f["id"] for f in data["findings"]}


@functools.cache
def compat_report(speculators: str, vllm: str) -> dict:
    return compat.analyze_roots([root("speculators", speculators)], root("vllm", vllm))
