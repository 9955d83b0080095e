"""`inv compat-report`: cells judged from the real analysis of released wheels, the analysis cache, the
task's bad input, and the page as a real browser renders it (Chromium from Debian's packages)."""
from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from specrig.drift import analysis_cache, cells, compat, compat_matrix
from specrig.drift.compat_page import HTML, label, write_pages
from specrig.drift.patchset_claims import claim_for, load_patchsets
from support.lab import inv

#: A pair check-compat finds clean, one a patchset fixes, one in server mode that breaks, one with no mode.
CLEAN, PATCHED, BROKEN, NO_MODE = ("0.3.0", "0.11.0"), ("0.3.0", "0.16.0"), ("0.9.0", "0.16.0"), ("0.5.0", "0.16.0")


def analysis(speculators: str, vllm: str) -> list[dict]:
    """check-compat's findings for the pair (the wheels from the shared cache)."""
    return compat.check_compat(speculators, vllm).findings


def cell(speculators: str, vllm: str) -> dict:
    claim = claim_for(load_patchsets(), speculators=speculators, vllm=vllm)
    return cells.classify(analysis(speculators, vllm), claim)


def test_a_pair_without_drift_works_as_is():
    assert not [f for f in analysis(*CLEAN) if f["severity"] == "drift"]
    assert cell(*CLEAN)["status"] == cells.WORKS


def test_a_pair_the_patchset_covers_works_with_it_named():
    judged = cell(*PATCHED)
    drift = [f for f in judged["findings"] if f["severity"] == "drift"]
    assert drift, "speculators 0.3.0 drifted on vLLM 0.16.0"
    assert judged["status"] == cells.PATCHSET
    assert judged["patchset"] == "speculators-0.3-vllm-0.16-0.17"
    assert {f["fixed_by"] for f in drift} == {judged["patchset"]}


def test_a_pair_nothing_fixes_breaks_on_its_first_finding():
    first_drift = next(f for f in analysis(*BROKEN) if f["severity"] == "drift")
    judged = cell(*BROKEN)
    assert judged["status"] == cells.BREAKS
    assert judged["patchset"] is None
    assert judged["first"]["id"] == first_drift["id"]
    assert label(judged) == f"breaks: {first_drift['id']}"


def test_findings_naming_a_launch_flag_make_the_cell_work_with_that_flag():
    # A finding carrying one (cells.LAUNCH_FLAG) is judged fixed by it; the same findings without one still
    # break (an older analyzer's).
    findings = [f for f in analysis(*BROKEN) if f["severity"] == "drift"]
    flagged = [{**f, cells.LAUNCH_FLAG: "--enable-scale-out"} for f in findings]
    judged = cells.classify(flagged, None)
    assert (judged["status"], judged["flags"]) == (cells.FLAG, ["--enable-scale-out"])
    assert label(judged) == "works with flag --enable-scale-out"
    assert cells.classify(findings, None)["status"] == cells.BREAKS


@pytest.mark.slow
def test_a_start_up_refusal_the_launch_avoids_shows_as_working_with_its_flag():
    """vLLM 0.22.0 refuses chunked prefill (on by default) with the connector: a note, since specrig's launch
    passes --no-enable-chunked-prefill there; the page says the flag a user launching by hand needs."""
    findings = analysis("0.9.0", "0.22.0")
    refusal = next(f for f in findings if f["id"] == "startup-refusal:enable_chunked_prefill")
    assert refusal["severity"] == "note" and refusal[cells.LAUNCH_FLAG] == "--no-enable-chunked-prefill"
    judged = cells.classify(findings, None)
    assert (judged["status"], judged["flags"]) == (cells.FLAG, ["--no-enable-chunked-prefill"]), judged


def test_a_release_without_extraction_mode_is_shown_as_such():
    assert not cells.has_mode(NO_MODE[0])
    assert cells.no_mode_cell(NO_MODE[0])["status"] == cells.NO_MODE


def test_a_refresh_analyzes_only_the_new_release_and_a_changed_analyzer_everything(tmp_path):
    specs, first = ["0.3.0", "0.5.0", "0.9.0"], ["0.11.0", "0.16.0"]
    built = compat_matrix.build(specs, first, cache=tmp_path)
    assert sorted(built["analyzed"]) == ["0.3.0 0.11.0", "0.3.0 0.16.0", "0.9.0 0.11.0", "0.9.0 0.16.0"]
    entries = {p: p.stat().st_mtime_ns for p in (tmp_path / "analyses").iterdir()}

    again = compat_matrix.build(specs, first, cache=tmp_path)
    assert (again["analyzed"], again["cached"]) == ([], 4)
    assert again["cells"] == built["cells"]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "analyses").iterdir()} == entries

    refreshed = compat_matrix.build(specs, [*first, "0.17.0"], cache=tmp_path)
    assert (sorted(refreshed["analyzed"]), refreshed["cached"]) == (["0.3.0 0.17.0", "0.9.0 0.17.0"], 4)

    stale = compat_matrix.build(specs, first, cache=tmp_path, analyzer="another analyzer")
    assert (len(stale["analyzed"]), stale["cached"]) == (4, 0)


def test_the_analyzer_digest_is_its_source():
    assert analysis_cache.analyzer_digest() == analysis_cache.analyzer_digest()
    assert len(analysis_cache.analyzer_digest()) == 64


@pytest.mark.parametrize(("option", "value", "fix"), [
    ("--vllm", "0.99.0", "give versions the index lists"),
    ("--speculators", "0.3.0,0.3.x", "give versions the index lists"),
    ("--out", "/nonexistent/docs", "give an existing directory"),
])
def test_bad_input_is_one_line_naming_it_exit_2(option, value, fix):
    bad = value.split(",")[-1]
    proc = inv("compat-report", option, value)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line, = proc.stderr.strip().splitlines()
    assert repr(bad) in line and fix in line


class _Cells(HTMLParser):
    """The matrix cells of a DOM: (speculators, vllm) -> {"status", "summary", "text"}."""

    def __init__(self):
        super().__init__()
        self.cells, self._open, self._in_summary = {}, None, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "td" and "data-vllm" in attrs:
            self._open = self.cells.setdefault((attrs["data-speculators"], attrs["data-vllm"]),
                                               {"status": attrs["data-status"], "summary": "", "text": ""})
        self._in_summary = self._in_summary or (tag == "summary" and self._open is not None)

    def handle_endtag(self, tag):
        self._in_summary = self._in_summary and tag != "summary"
        if tag == "td":
            self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] += data
            if self._in_summary:
                self._open["summary"] += data


@pytest.mark.slow
def test_the_page_renders_in_chromium_and_its_cells_say_what_the_analysis_says(tmp_path):
    browser = shutil.which("chromium")
    assert browser, "Chromium is missing: .ci/bootstrap installs Debian's chromium"
    matrix = compat_matrix.build(["0.3.0", "0.5.0", "0.9.0"], ["0.11.0", "0.16.0"], cache=tmp_path)
    page = next(p for p in write_pages(matrix, out=tmp_path) if p.name == HTML)
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    parser = _Cells()
    parser.feed(dom)
    assert len(parser.cells) == 6

    clean = parser.cells[CLEAN]
    assert clean["status"] == cells.WORKS
    assert not [f for f in analysis(*CLEAN) if f["severity"] == "drift"]

    patched = parser.cells[PATCHED]
    claim = claim_for(load_patchsets(), speculators=PATCHED[0], vllm=PATCHED[1])
    assert patched["status"] == cells.PATCHSET and claim.name in patched["summary"]
    for finding in analysis(*PATCHED):
        assert finding["id"] in patched["text"]  # the cell opens to every finding

    broken = parser.cells[BROKEN]
    first_drift = next(f for f in analysis(*BROKEN) if f["severity"] == "drift")
    assert broken["status"] == cells.BREAKS and first_drift["id"] in broken["summary"]

    assert parser.cells[NO_MODE]["status"] == cells.NO_MODE
