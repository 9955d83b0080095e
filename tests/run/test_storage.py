"""Where the run's files land (remote/run/storage.py): the mount of a path read from mountinfo fixtures
(this lab machine's, and a cluster node's with NFS, CIFS, FUSE and a path with a space), the flock probe
on this machine's own file system, and the advice a network or FUSE mount gets."""
from __future__ import annotations

import os

import pytest

from run import storage
from support.paths import REPO

MOUNTINFO = REPO / "tests" / "fixtures" / "mountinfo"


def mounts(name: str) -> list[dict]:
    return storage.parse_mountinfo((MOUNTINFO / name).read_text())


@pytest.mark.parametrize("path, point, fstype, kind", [
    ("/shared/out/.specrig-staging", "/shared", "nfs4", "network"),
    ("/shared/old/out", "/shared/old", "nfs", "network"),  # the longest mount point above the path
    ("/shared", "/shared", "nfs4", "network"),
    ("/sharedx/out", "/", "ext4", "local"),  # a prefix of the name is not a parent
    ("/mnt/smb/out", "/mnt/smb", "cifs", "network"),
    ("/home/u/remote/out", "/home/u/remote", "fuse.sshfs", "fuse"),
    ("/data/my disk/out", "/data/my disk", "ext4", "local"),  # \040 in mountinfo
    ("/scratch/out", "/scratch", "tmpfs", "local"),  # mounted over the xfs one: the later mount
    ("/home/u/out", "/", "ext4", "local"),
])
def test_a_path_is_on_the_mount_closest_above_it(path, point, fstype, kind):
    found = storage.mount_of(path, mounts("cluster-node.txt"))
    assert (found["mount_point"], found["fstype"], storage.kind(found["fstype"])) == (point, fstype, kind)


def test_the_mount_names_its_source_and_options():
    found = storage.mount_of("/shared/old/x", mounts("cluster-node.txt"))
    assert storage.describe(found) == "nfs (old.cluster:/export/old on /shared/old)"
    assert "nolock" in found["options"]


def test_a_mountinfo_without_optional_fields_parses():
    found = storage.mount_of("/home/specrig/specrig-work/out", mounts("lab-vm.txt"))
    assert storage.describe(found) == "ext4 (/dev/vda on /)"


def test_flock_works_on_this_machines_file_system_and_leaves_nothing(tmp_path):
    found = storage.locks_check(str(tmp_path / "out" / ".specrig-staging"))
    assert found["ok"] and found["advice"] is None, found
    assert "flock exclusive, then shared, each at once; enforced" in found["detail"]
    assert os.listdir(tmp_path) == []


def test_a_network_mount_is_named_with_advice_even_when_flock_works(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "read_mounts", lambda: [{"mount_point": str(tmp_path), "fstype": "nfs4",
                                                          "source": "storage:/export", "options": "rw"}])
    found = storage.locks_check(str(tmp_path))
    assert found["ok"] and f"nfs4 (storage:/export on {tmp_path})" in found["detail"]
    assert found["advice"] == storage.LOCK_ADVICE["network"] and "never `nolock`" in found["advice"]


def test_a_probe_that_does_not_answer_in_time_is_named_not_waited_for(tmp_path):
    found = storage.flock_probe(str(tmp_path), timeout_s=0.001)
    assert not found["ok"] and found["detail"] == "flock did not answer within 0 s (the lock service hangs)"


def test_a_probe_that_fails_is_named_with_the_advice():
    found = storage.locks_check("/proc/out")  # proc takes no new files, even from root
    assert not found["ok"] and found["detail"] == (
        "/proc/out on proc (proc on /proc): cannot create a file there: ENOENT: No such file or directory")
    assert found["advice"] == storage.LOCK_ADVICE["local"]


def test_a_token_is_written_in_the_nearest_existing_directory_read_and_taken_away(tmp_path):
    written = storage.write_token({"directory": str(tmp_path / "out" / "not-made"), "token": "t0k3n"})
    assert written == {"path": str(tmp_path / ".specrig-shared-token-t0k3n"), "directory": str(tmp_path),
                       "error": None}
    assert storage.read_token({"path": written["path"], "token": "t0k3n"}) == {"seen": "shared"}
    assert storage.read_token({"path": written["path"], "token": "other"}) == {"seen": "another-token"}
    storage.remove_token({"path": written["path"]})
    assert storage.read_token({"path": written["path"], "token": "t0k3n"}) == {"seen": "missing"}
    assert os.listdir(tmp_path) == []
    assert storage.write_token({"directory": "/proc/out", "token": "t"})["error"] == "No such file or directory"
