"""`inv compat-report`'s data: every released speculators against every released vLLM, one cell a pair.

Each pair's drift analysis is check-compat's (specrig/drift/compat.py: the same wheels, the same
analyzer), read from the analysis cache when the wheels and the analyzer are unchanged
(specrig/drift/analysis_cache.py): a refresh after one new release analyzes only that release's
pairs, and unpacks only its wheel. specrig/drift/cells.py judges each cell; compat_page.py renders them.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specrig.contract import extraction_mode
from specrig.drift import analysis_cache, compat
from specrig.drift.cells import classify, has_mode, no_mode_cell
from specrig.drift.patchset_claims import claim_for, load_patchsets
from specrig.drift.releases import released_versions
from specrig.errors import UsageError

#: The oldest releases the page covers (issue 17): speculators' first in-process release specrig runs,
#: and the vLLM speculators 0.3 pins.
SPECULATORS_SINCE = "0.3.0"
VLLM_SINCE = "0.11.0"
#: How a cell's analysis was had, for the progress and the summary.
ANALYZED, CACHED, UNANALYZED = "analyzed", "cached", "no mode"


def pick_versions(name: str, given: str | None, *, since: str) -> list[str]:
    """The released versions of `name` from `since` on; with `given` (a comma list) those, each checked
    against the index's releases of any age."""
    if not given:
        return released_versions(name, since=since)
    known = released_versions(name, since="0")
    versions = [v.strip() for v in given.split(",") if v.strip()]
    for version in versions or [given]:
        if version not in known:
            raise UsageError(f"{name} {version!r} is not a released version",
                             hint=f"give versions the index lists, e.g. {', '.join(known[-3:])}")
    return versions


def build(speculators: list[str], vllm: list[str], *, on_cell: Callable[[str, str, str], None] | None = None,
          analyzer: str | None = None, cache: Path = analysis_cache.ANALYSIS_CACHE,
          wheels: Path = compat.WHEEL_CACHE) -> dict:
    """The matrix: {"speculators": [{version, mode}], "vllm": [versions], "cells": {spec: {vllm: cell}},
    "analyzer", "patchsets", "analyzed": ["spec vllm" pairs analyzed now], "cached": count}.
    `on_cell(speculators, vllm, how)` is called as each cell is done (how: ANALYZED, CACHED or UNANALYZED).
    `analyzer` is the analyzer's content hash the cache is keyed on (default: that of the remote/ that runs)."""
    analyzer = analyzer or analysis_cache.analyzer_digest()
    patchsets = load_patchsets()
    cells: dict[str, dict[str, dict]] = {}
    analyzed, cached = [], 0
    for spec in speculators:
        cells[spec] = {}
        for version in vllm:
            cell, how = _cell(spec, version, patchsets=patchsets, analyzer=analyzer, cache=cache, wheels=wheels)
            cells[spec][version] = cell
            if how == ANALYZED:
                analyzed.append(f"{spec} {version}")
            cached += how == CACHED
            if on_cell:
                on_cell(spec, version, how)
    return {"speculators": [{"version": v, "mode": extraction_mode(v)} for v in speculators], "vllm": vllm,
            "cells": cells, "analyzer": analyzer, "patchsets": [p["name"] for p in patchsets],
            "analyzed": analyzed, "cached": cached}


def _cell(speculators: str, vllm: str, *, patchsets: list[dict], analyzer: str, cache: Path,
          wheels: Path) -> tuple[dict, str]:
    if not has_mode(speculators):
        return no_mode_cell(speculators), UNANALYZED
    consumers = compat.consumer_releases(speculators, wheels)
    provider = compat.fetch_wheel("vllm", vllm, wheels)
    key = analysis_cache.pair_key([wheel for _, _, wheel in consumers] + [provider], analyzer=analyzer, cache=cache)
    data, how = analysis_cache.read(key, cache=cache), CACHED
    if data is None:
        data = compat.analyze_roots([compat.package_root(name, version, wheels) for name, version, _ in consumers],
                                    compat.package_root("vllm", vllm, wheels))
        analysis_cache.write(key, data, cache=cache)
        how = ANALYZED
    return classify(data["findings"], claim_for(patchsets, speculators=speculators, vllm=vllm)), how
