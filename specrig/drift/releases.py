"""The released versions of a package, from the package index's JSON API (PyPI's `/pypi/<name>/json`).

Released means: not a pre-release or dev release, not yanked, and with a wheel to analyze (check-compat
reads wheels only). One request per package; nothing is downloaded here.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from specrig.contract import InvalidVersion, Version
from specrig.errors import CouldNotCheck

INDEX_URL = "https://pypi.org/pypi/{name}/json"
INDEX_TIMEOUT_S = 60


def released_versions(name: str, *, since: str) -> list[str]:
    """The versions of `name` from `since` on, oldest first."""
    floor = Version(since)
    found = []
    for version, files in _releases(name).items():
        try:
            parsed = Version(version)
        except InvalidVersion:
            continue  # a legacy version string no installer would pick
        wheels = [f for f in files if f.get("packagetype") == "bdist_wheel" and not f.get("yanked")]
        if wheels and not parsed.is_prerelease and parsed >= floor:
            found.append(version)
    return sorted(found, key=Version)


def _releases(name: str) -> dict[str, list[dict]]:
    url = INDEX_URL.format(name=name)
    try:
        with urllib.request.urlopen(url, timeout=INDEX_TIMEOUT_S) as answer:
            return json.load(answer)["releases"]
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        raise CouldNotCheck(f"cannot list the releases of {name} from {url}: {exc}",
                            hint="check the network: the versions are checked against the index") from None
