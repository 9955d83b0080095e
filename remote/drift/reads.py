"""What a verify call looked at on the host's disk, recorded while it runs and checked again later.

The analysis, the metadata lookups (importlib.metadata, pkgmeta) and the model's config all go
through a few functions of `os` and `open`; while a `Recorder` is active those are wrapped, so that
every path asked about is remembered with what was found there:
- a file opened: its stat (size, mtime_ns, inode, ctime_ns) and the sha256 of its bytes;
- a path whose existence or type was asked (os.stat, os.lstat, a failed open): present or not, and
  of which type (a module that did not exist may be installed later);
- a directory listed (os.listdir, os.scandir, os.walk): its stat and the sha256 of its entries
  (a distribution installed or removed changes a listing of site-packages).

`changed(recorded)` says whether any of that is no longer so. A file whose stat is the same is taken
as unchanged, unless it was changed within RACY_NS of the recording (a write in the same clock tick
keeps the mtime: git's "racily clean" files); where the stat differs, the bytes are hashed and
compared, so a file rewritten with the same bytes (a patch applied and reverted) still matches.
ctime is part of the stat: a write that restores size and mtime (cp -p, touch -d) moves it.

The wrapping is process-wide and for the call's duration only: a call is one process, one thread.
Python's own imports do not go through these functions; the analyzer's code is in the cache key.
"""
import builtins
import io
import os
import stat as stat_module
import time

#: A file or directory changed this close to the recording is hashed again on every check.
RACY_NS = 2 * 10 ** 9
HASH_CHUNK = 1 << 20
ABSENT = "absent"


def _signature(found):
    return [found.st_size, found.st_mtime_ns, found.st_ino, found.st_ctime_ns]


def _kind(found):
    return stat_module.S_IFMT(found.st_mode)


def _fd_digest(fd):
    """sha256 of an open file's bytes, read with pread: the caller's offset does not move."""
    import hashlib  # here: a check that finds every stat as it was hashes nothing

    digest, offset = hashlib.sha256(), 0
    while True:
        chunk = os.pread(fd, HASH_CHUNK, offset)
        if not chunk:
            return digest.hexdigest()
        digest.update(chunk)
        offset += len(chunk)


def _file_digest(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return _fd_digest(fd)
    finally:
        os.close(fd)


def _listing_digest(path):
    """sha256 of a directory's entries, each with its type (a file replaced by a directory differs)."""
    import hashlib

    entries = []
    with _real["scandir"](path) as scan:
        for entry in scan:
            try:
                kind = "d" if entry.is_dir(follow_symlinks=False) else "l" if entry.is_symlink() else "f"
            except OSError:
                kind = "?"
            entries.append(entry.name + "\0" + kind)
    return hashlib.sha256("\n".join(sorted(entries)).encode("utf-8", "surrogateescape")).hexdigest()


_real = {"stat": os.stat, "lstat": os.lstat, "listdir": os.listdir, "scandir": os.scandir, "open": builtins.open}


def _stat_or_none(path):
    if isinstance(path, int):
        return None
    try:
        return _real["stat"](path)
    except OSError:
        return None


class Recorder:
    """`with Recorder() as recorder:` wraps os.stat, os.lstat, os.listdir, os.scandir and open;
    `recorder.recorded()` afterwards is the JSON-able record, None when the call saw one file two ways."""

    def __init__(self):
        self.files = {}
        self.probes = {}
        #: Paths asked about without following a symlink (os.lstat).
        self.link_probes = {}
        self.listings = {}
        #: A file read twice with different bytes: no answer of this call may be kept.
        self.unstable = False
        self.started_ns = time.time_ns()

    def _probe(self, path, found, *, follow=True):
        if isinstance(path, int):
            return  # a file descriptor: its file was recorded when opened
        probes = self.probes if follow else self.link_probes
        path = os.path.abspath(os.fsdecode(path))
        if path not in probes:
            probes[path] = ABSENT if found is None else _kind(found)

    def _opened(self, path, handle):
        fd = handle.fileno()
        found = os.fstat(fd)
        entry = {"stat": _signature(found), "sha256": _fd_digest(fd), "racy": self._racy(found)}
        path = os.path.abspath(os.fsdecode(path))
        if self.files.setdefault(path, entry)["sha256"] != entry["sha256"]:
            self.unstable = True

    def _listed(self, path):
        path = os.path.abspath(os.fsdecode(path))
        if path not in self.listings:
            found = _real["stat"](path)
            self.listings[path] = {"stat": _signature(found), "sha256": _listing_digest(path),
                                   "racy": self._racy(found)}

    def _racy(self, found):
        return found.st_ctime_ns >= self.started_ns - RACY_NS

    def __enter__(self):
        recorder = self

        def probing(name, follows):
            """os.stat (`follows`: as its follow_symlinks says) or os.lstat, each answer or failure recorded."""
            def call(path, *args, **kwargs):
                follow = follows and kwargs.get("follow_symlinks", True)
                try:
                    found = _real[name](path, *args, **kwargs)
                except OSError:
                    recorder._probe(path, None, follow=follow)
                    raise
                recorder._probe(path, found, follow=follow)
                return found
            return call

        def listing(name):
            """os.listdir or os.scandir, the directory's listing recorded (a descriptor's is not: no path)."""
            def call(path=".", *args, **kwargs):
                answer = _real[name](path, *args, **kwargs)
                if not isinstance(path, int):
                    recorder._listed(path)
                return answer
            return call

        stat, lstat = probing("stat", True), probing("lstat", False)
        listdir, scandir = listing("listdir"), listing("scandir")

        def open_(file, mode="r", *args, **kwargs):
            try:
                handle = _real["open"](file, mode, *args, **kwargs)
            except OSError:
                recorder._probe(file, _stat_or_none(file))  # missing, or a directory
                raise
            if not isinstance(file, int):
                if any(flag in mode for flag in "wax+"):
                    handle.close()
                    raise RuntimeError("a recorded call opened %s for writing" % file)
                recorder._opened(file, handle)
            return handle

        os.stat, os.lstat, os.listdir, os.scandir = stat, lstat, listdir, scandir
        builtins.open = io.open = open_
        return self

    def __exit__(self, *exc):
        os.stat, os.lstat, os.listdir, os.scandir = (_real["stat"], _real["lstat"], _real["listdir"],
                                                     _real["scandir"])
        builtins.open = io.open = _real["open"]
        return False

    def recorded(self):
        """{"files": {path: {stat, sha256, racy}}, "probes": {path: kind}, "listings": {path: {stat,
        sha256, racy}}}, or None when the call saw a file with two contents."""
        if self.unstable:
            return None
        return {"files": dict(sorted(self.files.items())), "probes": dict(sorted(self.probes.items())),
                "link_probes": dict(sorted(self.link_probes.items())),
                "listings": dict(sorted(self.listings.items()))}


def changed(recorded):
    """The first path recorded that is no longer as it was (a short reason), or None: nothing changed.
    Where only a stat moved and the bytes are the same, `recorded` is updated in place (refreshed
    becomes True) so that the next check need not hash them again."""
    for group, stat in (("probes", _real["stat"]), ("link_probes", _real["lstat"])):
        for path, kind in recorded[group].items():
            try:
                now = _kind(stat(path))
            except OSError:
                now = ABSENT
            if now != kind:
                return "%s: %s, was %s" % (path, _kind_word(now), _kind_word(kind))
    for group, digest_of in (("files", _file_digest), ("listings", _listing_digest)):
        for path, entry in recorded[group].items():
            try:
                now = _real["stat"](path)
            except OSError:
                return "%s: gone" % path
            if _signature(now) == entry["stat"] and not entry["racy"]:
                continue
            try:
                if digest_of(path) != entry["sha256"]:
                    return "%s: changed" % path
            except OSError:
                return "%s: unreadable" % path
            entry["stat"], entry["racy"] = _signature(now), now.st_ctime_ns >= time.time_ns() - RACY_NS
            recorded["refreshed"] = True
    return None


def _kind_word(kind):
    if kind == ABSENT:
        return "absent"
    return {stat_module.S_IFDIR: "a directory", stat_module.S_IFREG: "a file",
            stat_module.S_IFLNK: "a symlink"}.get(kind, "another kind of file")
