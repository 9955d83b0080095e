"""benchmarks/gpu's harness modules loaded for a test on a scratch SG, nothing on a GPU or a port: the one
way tests/run/test_gpu_harness.py and tests/run/test_train_accept_results.py get them."""
from __future__ import annotations

import contextlib
import importlib
import sys
import types

#: The modules that read harness.py's settings at import (its own, and those above it).
HARNESS_MODULES = ("harness", "arm_inputs", "arm_runs", "arm_phase", "warm_phase", "states_phase", "prep_phase",
                   "extract_phase", "train_accept_phase", "device_run")


@contextlib.contextmanager
def harness_modules(tmp_path, monkeypatch):
    """Each harness module as an attribute (.harness, .arm_phase, ...), imported anew on SG=tmp_path/sg, its
    results empty, its waits for an idle GPU and a free port answered at once; dropped again afterwards."""
    monkeypatch.setenv("SG", str(tmp_path / "sg"))
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("BUDGET_S", raising=False)
    for name in HARNESS_MODULES:
        sys.modules.pop(name, None)
    importlib.import_module("device_run")
    modules = types.SimpleNamespace(**{name: sys.modules[name] for name in HARNESS_MODULES})
    monkeypatch.setattr(modules.harness, "wait_idle", lambda timeout=60: 0)
    monkeypatch.setattr(modules.harness, "wait_port_free", lambda port=None, timeout=60: 0)
    try:
        yield modules
    finally:
        for name in HARNESS_MODULES:
            sys.modules.pop(name, None)
