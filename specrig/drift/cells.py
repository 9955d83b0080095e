"""What one cell of the compatibility matrix says: a speculators release against a vLLM release.

A cell is judged from the drift analysis of the two released wheels (docs/findings.md) and the
patchsets that claim to fix its findings (specrig/drift/patchset_claims.py), in this order:

- `no-mode`: the speculators release has no extraction mode specrig runs (0.5-0.7: repository scripts);
- `works`: no finding of severity drift;
- `patchset`: every drift finding is fixed by the patchset that applies to the pair, or avoided by a
  launch flag (the cell names both);
- `flag`: every drift finding left is avoided by a launch flag the finding names (LAUNCH_FLAG);
- `breaks`: otherwise; the cell names the first finding that nothing fixes.
"""
from __future__ import annotations

from specrig.contract import IN_PROCESS, SERVER, extraction_mode
from specrig.drift.patchset_claims import PatchsetClaim

NO_MODE = "no-mode"
WORKS = "works"
PATCHSET = "patchset"
FLAG = "flag"
BREAKS = "breaks"
#: Best first: the order of the legend.
STATUSES = (WORKS, PATCHSET, FLAG, BREAKS, NO_MODE)
#: The modes a cell can be analyzed in (remote/base/contract.py's extraction_mode()).
ANALYZED_MODES = (IN_PROCESS, SERVER)

#: The finding field naming the server launch flag that avoids the finding (e.g. "--no-enable-prefix-caching").
#: Findings without it (every finding of analyzers that predate it) are fixed by no flag.
LAUNCH_FLAG = "launch_flag"


def has_mode(speculators: str) -> bool:
    """Whether the release's extraction runs in a mode the analyzer checks (else the cell is `no-mode`)."""
    return extraction_mode(speculators) in ANALYZED_MODES


def no_mode_cell(speculators: str) -> dict:
    return {"status": NO_MODE, "patchset": None, "flags": [], "first": None, "findings": [],
            "reason": f"speculators {speculators} ships its data generation only as repository scripts "
                      f"({extraction_mode(speculators)}): no extraction mode to check"}


def classify(findings: list[dict], claim: PatchsetClaim | None) -> dict:
    """The cell of an analysis: its status, what fixes it, the first finding left, and every finding
    annotated with what fixes it (`fixed_by`: the patchset's name, the flag, or None)."""
    annotated = [_annotated(finding, claim) for finding in findings]
    drift = [f for f in annotated if f["severity"] == "drift"]
    unfixed = [f for f in drift if f["fixed_by"] is None]
    used_patchset = claim is not None and any(f["fixed_by"] == claim.name for f in drift)
    # A note can carry a flag too: a start-up refusal specrig's launch already avoids still means "works
    # with that flag", which a user launching by hand must pass.
    flags = sorted({f[LAUNCH_FLAG] for f in annotated if f[LAUNCH_FLAG] and f["fixed_by"] == f[LAUNCH_FLAG]})
    if unfixed:
        status = BREAKS
    elif used_patchset:
        status = PATCHSET
    elif flags:
        status = FLAG
    else:
        status = WORKS
    return {"status": status, "patchset": claim.name if used_patchset else None, "flags": flags,
            "first": unfixed[0] if unfixed else None, "findings": annotated, "reason": None}


def _annotated(finding: dict, claim: PatchsetClaim | None) -> dict:
    """The parts of a finding a page shows, and what fixes it: a patch first (it changes nothing at
    launch), else the finding's own launch flag."""
    flag = finding.get(LAUNCH_FLAG) or None
    if claim is not None and claim.fixes(finding["id"]):
        fixed_by = claim.name
    else:
        fixed_by = flag
    consumer, provider = finding.get("consumer") or {}, finding.get("provider") or {}
    return {"id": finding["id"], "severity": finding["severity"], "explanation": finding["explanation"],
            "consumer": _where(consumer.get("file"), consumer.get("line")),
            "provider": _where(provider.get("file"), provider.get("start")),
            LAUNCH_FLAG: flag, "fixed_by": fixed_by}


def _where(file: str | None, line: int | None) -> str | None:
    return None if not file else f"{file}:{line}" if line else file
