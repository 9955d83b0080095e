"""Where specrig's own files are, in a source checkout and in an installed copy."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def _data_dir(name: str) -> Path:
    # A checkout (or editable install) has remote/ and patchsets/ beside specrig/;
    # a wheel carries them as package data under specrig/_data/.
    beside = _CHECKOUT / name
    if beside.is_dir():
        return beside
    return Path(str(resources.files("specrig") / "_data" / name))


def remote_dir() -> Path:
    return _data_dir("remote")


def patchsets_dir() -> Path:
    return _data_dir("patchsets")


def project_dir() -> Path:
    return _CHECKOUT
