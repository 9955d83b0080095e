"""Installed distributions, read from their metadata: nothing is imported."""
import os
from importlib import metadata


def distribution(name):
    """Version and install location of `name`, or None when it is not installed.

    `root` is the directory holding the package's top-level import directories
    (site-packages), `files` the paths the RECORD lists.
    """
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    root = str(dist.locate_file(""))
    files = [str(f) for f in (dist.files or [])]
    return {"name": dist.metadata["Name"], "version": dist.version, "root": os.path.abspath(root), "files": files}


def versions(names):
    """{name: version or None} for each name."""
    result = {}
    for name in names:
        found = distribution(name)
        result[name] = found["version"] if found else None
    return result
