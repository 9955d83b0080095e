"""The lab's shared environments, patched: what a test that runs them makes sure of first.

`.ci/tests` runs the suite in two processes at once, and several tests in each run the lab's shared
environments (`~/venv-cpu` of lab-cpu, the lab's fleet and lab-slurm; `~/venv-server-0.32` and
`~/venv-spec-0.9` of lab-server, its 0.8 twin, the server-mode fleet and Slurm tests). No test reverts
them (a test that needs one unpatched takes a private copy: runnable_env.private_clean_copy,
tests/patching/conftest.py), so "patched" is the one state they can be in once a test has run, and
apply-patches on a patched environment writes nothing. Two applies at once would meet the patch
engine's own lock, which refuses the second at once (kind `locked`, as it should for two people); so
the suite's processes take turns here, through a lock of their own.
"""
from __future__ import annotations

import fcntl
import tempfile
from contextlib import contextmanager
from pathlib import Path

from support.lab import inv

#: One lock for every shared environment: an apply takes seconds, and turns are rare.
TURNS = Path(tempfile.gettempdir()) / "specrig-tests-shared-envs.lock"


@contextmanager
def one_at_a_time():
    """Hold the suite's turn at patching a shared environment (across processes)."""
    with open(TURNS, "a") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        yield


def ensure_patched(host: str, *, inventory: Path | None = None) -> None:
    """`inv apply-patches --host host` (every environment of it), in the suite's turn; it must exit 0."""
    with one_at_a_time():
        applied = inv("apply-patches", "--host", host, inventory=inventory, timeout=600)
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
