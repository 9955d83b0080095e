"""The drift analyses of released wheel pairs, kept under ~/.cache/specrig/compat/ (inv compat-report).

An entry is keyed on what decides the analysis: each wheel's file name and sha256 (speculators, the
hs-connectors release it pins in server mode, vLLM) and the analyzer's own content hash (every file of
remote/, which the analysis runs from). A new release adds keys; a changed analyzer changes every key,
so stale entries are never read. A wheel's sha256 is computed once and remembered by its size and
mtime, so a refresh opens no wheel it already knew.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from specrig.transport.bundle import Bundle, current_bundle

ANALYSIS_CACHE = Path("~/.cache/specrig/compat").expanduser()
DIGESTS_FILE = "wheel-digests.json"
HASH_CHUNK = 1 << 20


def analyzer_digest() -> str:
    """The content hash of the analyzer: the remote/ files of the bundle the analysis runs from."""
    return Bundle([(name, data) for name, data in current_bundle().files if name.startswith("remote/")]).digest


def pair_key(wheels: list[Path], *, analyzer: str, cache: Path = ANALYSIS_CACHE) -> str:
    """The key of an analysis of `wheels` (consumers then the provider) by the analyzer `analyzer`."""
    identity = {"analyzer": analyzer, "wheels": [[wheel.name, wheel_digest(wheel, cache=cache)] for wheel in wheels]}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def read(key: str, *, cache: Path = ANALYSIS_CACHE) -> dict | None:
    """The stored analysis (a report's data, docs/findings.md), or None when there is none."""
    try:
        return json.loads((cache / "analyses" / f"{key}.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def write(key: str, data: dict, *, cache: Path = ANALYSIS_CACHE) -> None:
    _write_atomically(cache / "analyses" / f"{key}.json", data)


def wheel_digest(wheel: Path, *, cache: Path = ANALYSIS_CACHE) -> str:
    """The wheel's sha256, remembered by (name, size, mtime): hashing a vLLM wheel reads ~400 MB."""
    stat = wheel.stat()
    seen = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    digests = _read_digests(cache)
    known = digests.get(wheel.name)
    if known and {k: known.get(k) for k in seen} == seen:
        return known["sha256"]
    digest = hashlib.sha256()
    with wheel.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    # Read again just before writing: another build may have added its wheels meanwhile.
    digests = _read_digests(cache)
    digests[wheel.name] = {**seen, "sha256": digest.hexdigest()}
    _write_atomically(cache / DIGESTS_FILE, digests)
    return digest.hexdigest()


def _read_digests(cache: Path) -> dict:
    try:
        return json.loads((cache / DIGESTS_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _write_atomically(path: Path, data: dict) -> None:
    """A reader sees the old file or the new one, never half of one (builds may run side by side)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(data, out)
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
