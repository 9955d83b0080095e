"""What the host keeps about our patches: manifest, original bytes, lock; and how files are written.

Layout (patchsets/README.md, "On the host"), per environment (sys.prefix):

    <sys.prefix>/.specrig/patches/         (or ~/.cache/specrig/patches/<env-hash>/ if the prefix is read-only)
        manifest.json    {"format": 1, "files": {KEY: entry}, "intent": null | {...}}
        backups/<sha256> the original bytes of a patched file
        lock             flock'ed while applying or reverting; holds who holds it

A file is never half written: new bytes go to a temporary file in the same
directory, flushed and fsynced, then os.replace'd over the old one. The
manifest cannot change in the same step as a target file, so every change is
announced first (an *intent*: each file's sha256 before and after), then made,
then committed. Whoever next reads the manifest resolves a leftover intent from
the files themselves: a file whose bytes are the intended ones was written.
"""
import errno
import fcntl
import hashlib
import json
import os
import socket
import sys
import time

from base import atomic
from base.failure import RemoteFailure

FORMAT = 1


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def file_sha256(path):
    """The file's sha256, or None when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return sha256(handle.read())
    except FileNotFoundError:
        return None


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def state_dir():
    prefix = os.path.abspath(sys.prefix)
    if os.access(prefix, os.W_OK):
        return os.path.join(prefix, ".specrig", "patches")
    return os.path.join(os.path.expanduser("~/.cache/specrig/patches"), sha256(prefix.encode())[:16])




class Store:
    def __init__(self, directory=None):
        self.directory = directory or state_dir()
        self.manifest_path = os.path.join(self.directory, "manifest.json")
        self.backups = os.path.join(self.directory, "backups")
        self.lock_path = os.path.join(self.directory, "lock")
        self._lock_fd = None

    # ---- manifest ---------------------------------------------------------------------------

    def read_raw(self):
        try:
            with open(self.manifest_path, encoding="utf-8") as handle:
                manifest = json.load(handle)
        except FileNotFoundError:
            return {"format": FORMAT, "files": {}, "intent": None}
        if manifest.get("format") != FORMAT:
            raise RemoteFailure("bad-manifest", "%s has format %r; this specrig reads format %d"
                                    % (self.manifest_path, manifest.get("format"), FORMAT))
        return manifest

    def read(self):
        """The manifest with any leftover intent resolved in memory (nothing written): what is true now."""
        return resolve_intent(self.read_raw())[0]

    def write(self, manifest):
        os.makedirs(self.directory, exist_ok=True)
        data = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        return atomic.write_bytes(self.manifest_path, data, mode=0o644)

    def recover(self):
        """Under the lock: commit or drop a killed run's intent, per file, from the files' bytes."""
        raw = self.read_raw()
        if not raw.get("intent"):
            return []
        manifest, outcomes = resolve_intent(raw)
        for item in raw["intent"]["files"].values():
            atomic.remove_stale_temporaries(os.path.dirname(item["file"]))
        self.write(manifest)
        return outcomes

    # ---- backups ----------------------------------------------------------------------------

    def keep_original(self, data):
        """Store the original bytes (content-addressed) and return their name relative to the store."""
        digest = sha256(data)
        path = os.path.join(self.backups, digest)
        if file_sha256(path) != digest:
            os.makedirs(self.backups, exist_ok=True)
            atomic.write_bytes(path, data, mode=0o444)
        return os.path.join("backups", digest)

    def original(self, entry):
        """The backup's bytes, checked against the sha256 recorded when it was taken."""
        path = os.path.join(self.directory, entry["backup"])
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            raise RemoteFailure("backup-missing", "the backup of %s (%s) is gone; the original cannot be "
                                    "restored (reinstall the package instead)" % (entry["file"], path)) from None
        if sha256(data) != entry["original_sha256"]:
            raise RemoteFailure("backup-corrupt", "the backup %s of %s does not have the recorded sha256 %s; "
                                    "refusing to restore it" % (path, entry["file"], entry["original_sha256"]))
        return data

    def drop_unreferenced_backups(self, manifest):
        wanted = {entry["backup"] for entry in manifest["files"].values()}
        for name in os.listdir(self.backups) if os.path.isdir(self.backups) else []:
            if os.path.join("backups", name) not in wanted and atomic.TEMP_MARK not in name:
                os.unlink(os.path.join(self.backups, name))

    # ---- lock -------------------------------------------------------------------------------

    def lock(self, action):
        """Take this environment's lock or fail at once (kind `locked`), naming the holder."""
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = self.holder()
            raise RemoteFailure(
                "locked", "another specrig client is changing the patches of %s (%s); try again when it has "
                "finished" % (sys.prefix, _describe_holder(holder)), holder=holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "action": action,
                                 "since": now()}).encode())
        self._lock_fd = fd

    def holder(self):
        try:
            with open(self.lock_path, encoding="utf-8") as handle:
                return json.loads(handle.read() or "null")
        except (OSError, ValueError):
            return None

    def unlock(self):
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _describe_holder(holder):
    if not holder:
        return "holder unknown"
    return "%s by pid %s on %s since %s" % (holder.get("action"), holder.get("pid"), holder.get("host"),
                                            holder.get("since"))


def resolve_intent(manifest):
    """(manifest without intent, outcomes): each intended file change is kept if the file has the new bytes."""
    intent = manifest.get("intent")
    resolved = {"format": FORMAT, "files": dict(manifest["files"]), "intent": None}
    outcomes = []
    for key, item in sorted((intent or {}).get("files", {}).items()):
        current = file_sha256(item["file"])
        if current == item["to_sha256"]:
            if item["entry"] is None:
                resolved["files"].pop(key, None)
            else:
                resolved["files"][key] = item["entry"]
            outcomes.append({"file": item["file"], "outcome": "completed"})
        else:
            outcomes.append({"file": item["file"], "outcome": "not written" if current == item["from_sha256"]
                             else "changed by someone else"})
    return resolved, outcomes
