"""The analyzer's resolution and signature rules on small synthetic packages (cases as data)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from drift.analyzer import analyze
from support.paths import FIXTURES

CASES = yaml.safe_load((FIXTURES / "drift" / "cases.yaml").read_text())


def materialize(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name, tmp_path):
    case = CASES[name]
    provider = materialize(tmp_path / "provider", case["provider"])
    consumer = materialize(tmp_path / "consumer", case["consumer"])
    model = {"path": "model", "config": case["model_config"]} if "model_config" in case else None
    report = analyze(consumers=[{"root": str(consumer), "package": "cons"}],
                     provider={"root": str(provider), "package": "prov"}, model=model)
    assert sorted(f["id"] for f in report["findings"]) == sorted(case["expect"])


def test_maybe_symbol_is_a_note_not_drift(tmp_path):
    case = CASES["module-getattr-may-exist"]
    report = analyze(consumers=[{"root": str(materialize(tmp_path / "c", case["consumer"])), "package": "cons"}],
                     provider={"root": str(materialize(tmp_path / "p", case["provider"])), "package": "prov"})
    assert report["counts"] == {"drift": 0, "note": 1, "speed": 0}
    assert "__getattr__" in report["findings"][0]["explanation"]
