"""Replace a file in one step: a temporary file beside it, flushed and fsynced, then os.replace.

Readers (and a process killed at any instant) see the old bytes or the new ones, never a mix;
the worst a crash leaves is a temporary file named with TEMP_MARK, which remove_stale_temporaries
clears. Patched sources, the patch manifest, run records and heartbeats all go through here.
"""
import json
import os

TEMP_MARK = ".specrig-tmp-"


def fsync_directory(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: The mode of a file specrig creates on a host: its user's alone (records, heartbeats, manifests).
PRIVATE = 0o600


def write_bytes(path, data, mode=None):
    """Replace `path` with `data` in one step: temporary file beside it, fsync, os.replace, fsync the directory.

    `mode` None: an existing file keeps its mode (a patched source in an environment others use),
    a new one is PRIVATE. The temporary file is created 0600 and given `mode` only once written."""
    directory, name = os.path.split(path)
    directory = directory or "."
    temp = os.path.join(directory, ".%s%s%d" % (name, TEMP_MARK, os.getpid()))
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = PRIVATE
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    fsync_directory(directory)
    return len(data)


def write_json(path, payload, mode=PRIVATE):
    """A record specrig keeps (run.json, status.json, heartbeats, ...): PRIVATE, whatever mode an older
    specrig gave the file it replaces."""
    return write_bytes(path, json.dumps(payload, indent=1, sort_keys=True, default=str).encode(), mode)


def read_json(path, default=None):
    """What write_json wrote, or `default` when the file is not there (or not JSON: a writer from
    before these helpers, or a hand edit)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (FileNotFoundError, ValueError):
        return default


def remove_stale_temporaries(directory):
    """Temporary files a killed writer left behind (they never replaced anything)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        if name.startswith(".") and TEMP_MARK in name:
            os.unlink(os.path.join(directory, name))
            removed.append(os.path.join(directory, name))
    return removed
