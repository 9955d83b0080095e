"""YAML read by specrig (hosts.yaml, patchset.yaml): a syntax error is one line naming file and line."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from specrig.errors import UsageError

#: libyaml's loader where PyYAML was built with it: the same safe types, ten times faster than the
#: pure-Python one (every patchset.yaml is read into each new bundle).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str | bytes, *, path: Path, error: type[UsageError] = UsageError,
               hint: str | None = None) -> Any:
    try:
        return yaml.load(text, Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise error(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}", hint=hint) from None
