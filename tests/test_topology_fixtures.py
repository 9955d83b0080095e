"""The PCIe-only topologies of tests/fixtures/nvidia-smi/ (issue 38, point 5): each a real `nvidia-smi topo -m`
printed in a public report, kept with the report's address. Nothing parses them yet; this keeps each one there,
not empty, and sourced."""
from __future__ import annotations

import re

import pytest

from support.paths import FIXTURES

TOPOLOGIES = sorted(path.parent for path in (FIXTURES / "nvidia-smi").glob("*/topo_m.txt"))


def test_there_are_pcie_only_topologies_of_rtx_pro_6000_hosts():
    assert len(TOPOLOGIES) >= 6 and sum("rtxpro6000" in path.name for path in TOPOLOGIES) >= 2


@pytest.mark.parametrize("folder", TOPOLOGIES, ids=[path.name for path in TOPOLOGIES])
def test_each_topology_is_a_gpu_matrix_with_its_source(folder):
    matrix = (folder / "topo_m.txt").read_text()
    assert re.search(r"^GPU0\s+X\s", matrix, re.MULTILINE), "no GPU0 row with X on its diagonal"
    assert not re.search(r"\bNV\d+\b", matrix), "PCIe-only: no NVLink in the matrix"
    assert re.search(r"https://github\.com/[\w.-]+/[\w.-]+/issues/\d+", (folder / "SOURCE.md").read_text())
