"""`--host local`: the same bundle and entry.py as over SSH, run in a subprocess, no SSH.

As over SSH, what it writes is the user's alone: the cache's directories 0700, the call file (which
holds hosts.yaml `env:`) created 0600 before a byte is written; entry.py sets the call's umask."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

from specrig.errors import RemotePythonError, RemoteTimeout
from specrig.inventory import Host
from specrig.transport.base import CACHE, DEADLINE_GRACE_S, Remote
from specrig.transport.bundle import Bundle


class LocalRemote(Remote):
    """`--host local`: the same bundle and entry.py as over SSH, run in a subprocess, no SSH."""

    def __init__(self, host: Host, bundle: Bundle):
        super().__init__(host)
        self.bundle = bundle
        self.cache = Path.home() / CACHE
        self.bundle_path = self.cache / "bundles" / bundle.digest
        self.uploaded = False

    def _private_directory(self, path: Path) -> Path:
        """`path` (under the cache) made, or kept, 0700, with the cache itself: older specrig left them 0755."""
        for directory in (self.cache, path):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if directory.stat().st_mode & 0o077:
                directory.chmod(0o700)
        return path

    def _unpack_bundle(self) -> None:
        self._private_directory(self.bundle_path.parent)
        if (self.bundle_path / ".complete").exists():
            return
        staging = self.bundle_path.parent / f".incoming-{uuid.uuid4().hex}"
        staging.mkdir(mode=0o700)
        with tarfile.open(fileobj=io.BytesIO(self.bundle.tar_bytes), mode="r:gz") as tar:
            tar.extractall(staging, filter="data")
        try:
            staging.rename(self.bundle_path)
        except OSError:  # another process unpacked the same bundle first
            shutil.rmtree(staging, ignore_errors=True)
        self.uploaded = True

    def _run(self, body: bytes, timeout: float | None, python: str) -> tuple[int, str, str]:
        self._unpack_bundle()
        call_file = self._private_directory(self.cache / "calls") / f"{uuid.uuid4().hex}.json"
        # 0600 from its creation (O_EXCL: a fresh file, never one put there before), then the bytes.
        with os.fdopen(os.open(call_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
            handle.write(body)
        self.exec_count += 1
        try:
            # A new session: the deadline kills the call's process group, never us.
            argv = [os.path.expanduser(python), str(self.bundle_path / "remote" / "entry.py"), str(call_file)]
            proc = subprocess.run(argv,
                                  stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout + DEADLINE_GRACE_S if timeout else None, start_new_session=True)
        except FileNotFoundError:
            raise RemotePythonError(f"local python {python!r} not found") from None
        except subprocess.TimeoutExpired:
            raise RemoteTimeout(f"local: call exceeded {timeout:.0f} s") from None
        finally:
            call_file.unlink(missing_ok=True)
        return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
