"""Released wheels for the drift tests, downloaded once into ~/.cache/specrig/wheels (as check-compat does)."""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from specrig.drift import compat
from support import paths

FIXTURES = paths.FIXTURES / "drift"
KIMI_CONFIG = FIXTURES / "kimi-k25" / "config.json"
#: Every vLLM release the per-release tests read (the server's parser, specrig's own programs), 0.16-0.33.
VLLM_RELEASES = ["0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2",
                 "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1",
                 "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]


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


def in_source(vllm: Path, flag: str) -> bool:
    """The text oracle of a server option in a release's source (`vllm`, its package directory): the option's
    literal, or its field declared in a class body, under vllm/entrypoints/ or vllm/engine/."""
    option = "--" + flag[2:].replace("_", "-")
    field = re.compile(r"^    %s\s*:" % re.escape(option[2:].replace("-", "_")), re.M)
    for folder in ("entrypoints", "engine"):
        for path in (vllm / folder).rglob("*.py"):
            text = path.read_text(errors="replace")
            if '"%s"' % option in text or field.search(text):
                return True
    return False
