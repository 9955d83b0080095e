"""Where specrig's own files are, in a source checkout and in an installed copy, and the user's config."""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent


def _data_dir(name: str) -> Path:
    # A wheel carries remote/ and patchsets/ as package data under specrig/_data/; prefer it, so an
    # installed copy never picks up an unrelated `remote` directory that happens to lie in
    # site-packages. A checkout (or editable install) has them beside specrig/.
    packaged = _PACKAGE / "_data" / name
    return packaged if packaged.is_dir() else _CHECKOUT / name


def remote_dir() -> Path:
    return _data_dir("remote")


def patchsets_dir() -> Path:
    return _data_dir("patchsets")


def project_dir() -> Path:
    return _CHECKOUT


def checkout_dir() -> Path | None:
    """The source checkout specrig runs from (`inv` in a clone, an editable install); None when
    it runs from an installed copy (a wheel in site-packages)."""
    is_checkout = (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "remote" / "entry.py").is_file()
    return _CHECKOUT if is_checkout else None


def config_dir() -> Path:
    """The user's specrig settings: $XDG_CONFIG_HOME/specrig, else ~/.config/specrig."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    # The XDG spec says a relative value is invalid and is to be ignored.
    return (Path(base) if os.path.isabs(base) else Path.home() / ".config") / "specrig"
