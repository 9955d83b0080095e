"""The README stays an entry point (issue 27): at most 300 lines, its two set-up commands within its first
30, every local link it gives pointing at a file that exists; the rest lives in docs/."""
from __future__ import annotations

import re

from support.paths import REPO

README = REPO / "README.md"
MAX_LINES = 300
SETUP = ("bash .ci/main-job", "bash .ci/tests")


def test_the_readme_is_short_and_opens_with_its_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines: move a section to docs/"
    head = "\n".join(lines[:30])
    assert all(command in head for command in SETUP), head


def test_every_local_link_of_the_readme_exists():
    targets = re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", README.read_text())
    missing = [target for target in targets if not (REPO / target).exists()]
    assert not missing, missing
