"""verify's answers kept in the user's workdir, <workdir>/verify-cache/ (0700, files 0600).

A repeat of verify on a host where nothing it depends on changed is answered from here, without
the analysis. A wrong answer is worse than none, so an entry is found by everything the call
could not see itself, and then checked against everything it saw:
- the key (the entry's file name): the call's arguments, the analyzer's own code (the bundle's
  digest; a checkout's remote/ hashed), this interpreter (path, version, sys.path), the working
  directory and the environment variables (HF_HOME names another hub cache, PYTHONPATH other
  packages), less the few that change at every login (VOLATILE_ENV);
- in the entry, what the analysis read (drift/reads.py): every file opened (the packages' source,
  their metadata and RECORD, the model's config.json), every path whose existence it asked about
  and every directory it listed. A package installed, upgraded or removed changes a listing of
  site-packages; specrig's apply and revert, and a hand edit that leaves RECORD as it was, change
  a file's stat and then its bytes.
An answer is kept only when the call saw every file with one content.
"""
import json
import os
import sys
import zlib

from base import atomic

CACHE = "verify-cache"
#: Bumped when what an entry holds changes meaning: older entries are then never read.
FORMAT = 1
#: Entries kept; the oldest go first (one per key: a new bundle or other arguments start a new one).
KEEP = 32
PRIVATE_DIR = 0o700
#: Set anew by each SSH login (or by the shell) and read by nothing the analysis does.
VOLATILE_ENV = frozenset(("SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "_", "SHLVL", "OLDPWD",
                          "PWD", "XDG_SESSION_ID", "MOTD_SHOWN"))
#: The verify arguments that do not decide the answer (where it is kept, whether to use the cache).
NOT_IN_KEY = ("workdir", "no_cache")


def cache_root(workdir):
    return os.path.join(os.path.expanduser(workdir), CACHE)


def analyzer_digest():
    """The analyzer's code: the digest of the bundle it runs from (its .complete holds it), else, in
    a checkout (`--host local` from a clone, the benchmarks), the sha256 of remote/'s files."""
    remote = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(os.path.dirname(remote), ".complete"), encoding="ascii") as handle:
            return "bundle:" + handle.read().strip()
    except OSError:
        pass
    import hashlib

    digest = hashlib.sha256()
    for directory, subdirectories, names in os.walk(remote):
        subdirectories[:] = sorted(name for name in subdirectories if name != "__pycache__")
        for name in sorted(names):
            if not name.endswith(".pyc"):
                path = os.path.join(directory, name)
                with open(path, "rb") as handle:
                    digest.update(os.path.relpath(path, remote).encode() + b"\0" + handle.read() + b"\0")
    return "tree:" + digest.hexdigest()


def _interpreter(python):
    """Where an interpreter named in the call (server_python) resolves to now: a changed symlink or
    PATH is another environment."""
    python = os.path.expanduser(python)
    if os.sep not in python:
        for directory in os.environ.get("PATH", "").split(os.pathsep):
            candidate = os.path.join(directory, python)
            if os.access(candidate, os.X_OK):
                return os.path.realpath(candidate)
        return None
    return os.path.realpath(python)


def identity(args):
    """Everything the call cannot check on disk that decides its answer, as one string (the entry
    holds it and is used only when it is equal)."""
    found = {
        "format": FORMAT,
        "analyzer": analyzer_digest(),
        "args": {name: value for name, value in args.items() if name not in NOT_IN_KEY},
        "server_python": _interpreter(args["server_python"]) if args.get("server_python") else None,
        "python": [sys.executable, sys.version, sys.path],
        "cwd": os.getcwd(),
        "env": {name: value for name, value in os.environ.items() if name not in VOLATILE_ENV},
    }
    return json.dumps(found, sort_keys=True)


def _entry_path(workdir, identity):
    """The entry's file, named by two checksums of the identity: no hashlib to import (OpenSSL: a
    tenth of a hit's time), and the entry's own copy of the identity decides, not the name."""
    data = identity.encode("utf-8", "surrogateescape")
    return os.path.join(cache_root(workdir), "%08x%08x.json" % (zlib.crc32(data), zlib.adler32(data)))


def lookup(workdir, identity):
    """(report, None) from a valid entry, or (None, why there was none)."""
    from drift import reads

    path = _entry_path(workdir, identity)
    try:
        with open(path, encoding="utf-8") as handle:
            entry = json.load(handle)
    except FileNotFoundError:
        return None, "no answer kept for this code, environment and arguments"
    except (OSError, ValueError) as exc:
        return None, "the kept answer is unreadable: %s" % exc
    if entry.get("format") != FORMAT or entry.get("identity") != identity:
        return None, "no answer kept for this code, environment and arguments"
    changed = reads.changed(entry["recorded"])
    if changed:
        return None, changed
    if entry["recorded"].pop("refreshed", False):
        _write(path, entry)  # stats moved, bytes did not: the next check hashes nothing
    return entry["report"], None


def store(workdir, identity, recorded, report):
    """Keep `report` for `identity` with what the analysis read; the oldest entries beyond KEEP go."""
    root = cache_root(workdir)
    _write(_entry_path(workdir, identity), {"format": FORMAT, "identity": identity, "recorded": recorded,
                                            "report": report})
    entries = sorted((entry for entry in os.scandir(root) if entry.name.endswith(".json")),
                     key=lambda entry: entry.stat().st_mtime_ns)
    for old in entries[:-KEEP]:
        try:
            os.unlink(old.path)
        except OSError:
            pass  # another call removed it first


def _write(path, entry):
    root = os.path.dirname(path)
    os.makedirs(root, mode=PRIVATE_DIR, exist_ok=True)
    if os.stat(root).st_mode & 0o077:
        os.chmod(root, PRIVATE_DIR)  # made before by someone's wider umask: the answers name the user's paths
    atomic.write_bytes(path, json.dumps(entry).encode(), mode=atomic.PRIVATE)
