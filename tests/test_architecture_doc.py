"""docs/ARCHITECTURE.md against the tree: every product module is listed, every module path it names exists,
and no module is longer than the doc's rule allows.

A product module is any .py file under specrig/ or remote/ except those in __pycache__; `__init__.py`
files count too (each package's line says what its folder holds), so none is left out. Each has its
own line under "Every module" ("- `path` — what it does"), once.

The doc's one notation for a module is its path from the repository's root, in backticks:
`remote/run/launching.py`, never `run/launching.py` or `launching.py`. So every .py path the doc names
in backticks outside fenced blocks (one that does not continue a longer path such as
`<bundle>/remote/entry.py`) must be a file of the checkout: a module that moved fails here, and so
does a path written relative to specrig/ or remote/ (`run/runs.py`), which is not a file at the root.
"""

import re

from support.paths import REPO

DOC = REPO / "docs" / "ARCHITECTURE.md"
ROOTS = ("specrig", "remote")

#: Fenced blocks (a layout sketch, an example) are not where modules are named: left out first.
FENCED = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
#: Inline code spans; a span may run over a line break.
CODE_SPAN = re.compile(r"`([^`]+)`")
#: A .py path inside a span that does not continue a longer one (`<run>/code/run/supervisor.py` is a
#: host path, not the checkout's).
PY_PATH = re.compile(r"(?<![\w./<>-])([\w][\w./-]*\.py)\b")


def product_modules() -> set:
    return {path.relative_to(REPO).as_posix()
            for root in ROOTS for path in (REPO / root).rglob("*.py")
            if "__pycache__" not in path.parts}


def named_paths() -> set:
    text = FENCED.sub("", DOC.read_text(encoding="utf-8"))
    return {found for span in CODE_SPAN.findall(text) for found in PY_PATH.findall(span)}


def test_every_product_module_is_listed():
    missing = sorted(product_modules() - named_paths())
    assert not missing, f"modules missing from docs/ARCHITECTURE.md (add a line each): {missing}"


def test_every_product_module_has_its_own_line():
    text = DOC.read_text(encoding="utf-8")
    lines = re.findall(r"^- `((?:specrig|remote)/[^`]+\.py)` — ", text, re.MULTILINE)
    twice = sorted({path for path in lines if lines.count(path) > 1})
    assert not twice, f"modules with more than one line in 'Every module': {twice}"
    assert not sorted(product_modules() - set(lines)), (
        "modules named in docs/ARCHITECTURE.md without their line under 'Every module' "
        f"(- `path` — what it does): {sorted(product_modules() - set(lines))}")


def test_every_module_path_the_doc_names_exists():
    gone = sorted(path for path in named_paths() if not (REPO / path).is_file())
    assert not gone, ("docs/ARCHITECTURE.md names .py paths that are not files of the checkout "
                      f"(moved, removed, or not written from the repository's root): {gone}")


def test_the_doc_names_modules_of_both_sides():
    named = named_paths()
    assert {path.split("/")[0] for path in named if path.split("/")[0] in ROOTS} == set(ROOTS)


def test_modules_of_one_name_are_each_named_under_same_name_same_role():
    """No two product modules share a file name unless ARCHITECTURE.md's "Same name, same role" names
    every one of them (the same role on two sides, or a piece of data and its view)."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Same name, same role"):text.index("## One shape for every task")]
    explained = {found for span in CODE_SPAN.findall(section) for found in PY_PATH.findall(span)}
    by_name: dict = {}
    for path in product_modules():
        if not path.endswith("/__init__.py"):
            by_name.setdefault(path.rsplit("/", 1)[1], set()).add(path)
    unexplained = sorted(path for paths in by_name.values() if len(paths) > 1 for path in paths - explained)
    assert not unexplained, f"modules sharing a file name, not under 'Same name, same role': {unexplained}"


#: A module does one job; one past this has grown a second (issue 27), and is split where its jobs part.
MAX_MODULE_LINES = 500


def test_no_product_module_is_over_the_line_limit():
    over = {path: lines for path in product_modules()
            if (lines := len((REPO / path).read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not over, f"over {MAX_MODULE_LINES} lines, split each where its jobs part: {over}"
