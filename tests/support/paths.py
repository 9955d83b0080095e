"""Where things are, for every test: the checkout, the tests' data and programs."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
#: Data the tests read: captured logs, nvidia-smi output, drift cases, old runs.
FIXTURES = TESTS / "fixtures"
#: Programs the tests run (on the lab's venvs, or as stand-in jobs).
PROGRAMS = TESTS / "programs"
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
#: Real nvidia-smi output of a 2x H200 machine, idle and under load: copied from
#: ../shared/fixtures so that a clone anywhere (CI) runs the telemetry tests; test_fixtures_sync
#: keeps the copy equal to the original where that is present.
H200X2 = FIXTURES / "nvidia-smi" / "h200x2"
