"""The content-addressed bundle of files every remote call runs from.

remote/ and patchsets/ travel as one tar; its name is the sha256 of the
paths and bytes inside, so a host keeps one copy per version of our code and
an unchanged bundle is never sent twice. patchset.yaml files travel as JSON:
the host's Python may lack PyYAML.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import tarfile
import threading
from pathlib import Path

from specrig.paths import patchsets_dir, remote_dir
from specrig.yamlfile import parse_yaml

SKIP_PARTS = {"__pycache__", ".pytest_cache"}


def _paths(top: Path) -> list[str]:
    """The files under `top` that a bundle takes, sorted: neither caches nor compiled Python. With
    os.walk and plain strings, a tenth of what pathlib's rglob and sorted Paths cost (the change
    check below runs it on every host of a fleet task)."""
    found = []
    for directory, subdirectories, names in os.walk(top):
        subdirectories[:] = [name for name in subdirectories if name not in SKIP_PARTS]
        found += (os.path.join(directory, name) for name in names if not name.endswith(".pyc"))
    return sorted(found)


def bundle_files(remote: Path, patchsets: Path) -> list[tuple[str, bytes]]:
    """(name in the bundle, bytes) of every file of a remote/ and a patchsets/ directory."""
    files = []
    for top, arcroot in ((remote, "remote"), (patchsets, "patchsets")):
        for path in map(Path, _paths(top)):
            arcname = f"{arcroot}/{path.relative_to(top).as_posix()}"
            data = path.read_bytes()
            if path.name == "patchset.yaml":
                arcname = arcname[: -len(".yaml")] + ".json"
                patchset = parse_yaml(data, path=path, hint="fix the file; see patchsets/README.md")
                data = json.dumps(patchset, indent=1, sort_keys=True, default=str).encode()
            files.append((arcname, data))
    return files


class Bundle:
    """The bundle's files, digest and tar bytes."""

    def __init__(self, files: list[tuple[str, bytes]]):
        self.files = files
        digest = hashlib.sha256()
        for name, data in files:
            digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
        self.digest = digest.hexdigest()

    @functools.cached_property
    def tar_bytes(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
            for name, data in self.files + [(".complete", self.digest.encode())]:
                info = tarfile.TarInfo(name)
                # 0600: root's tar keeps an archive's modes whatever the umask (every other user's
                # applies `umask 077`, ssh.PRIVATE); the bundle's directories come out 0700.
                info.size, info.mode, info.mtime = len(data), 0o600, 0
                tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()


#: The hosts of a fleet task ask for the bundle at once, each from its own thread: one builds it,
#: the others wait for it (lru_cache alone would let all of them build it side by side).
_BUILDING = threading.Lock()


def current_bundle() -> Bundle:
    """The bundle of the code as it is now: built again only when a file changed (by path, size and
    mtime), so the hosts of one task share it instead of each hashing every file again."""
    signature = _signature(remote_dir(), patchsets_dir())
    with _BUILDING:
        return _bundle_of(signature)


def _signature(*tops: Path) -> tuple:
    """(path, size, mtime) of every file a bundle takes."""
    return tuple((path, stat.st_size, stat.st_mtime_ns) for top in tops for path in _paths(top)
                 for stat in (os.stat(path),))


@functools.lru_cache(maxsize=1)
def _bundle_of(signature: tuple) -> Bundle:
    return Bundle(bundle_files(remote_dir(), patchsets_dir()))
