"""The PCIe-only topologies of tests/fixtures/nvidia-smi/ (issue 38, point 5): each a real `nvidia-smi topo -m`
printed in a public report, kept with the report's address; one NVLink host beside them (h100nvl3-nv12-sys-*), and
the project's one-GPU device (h100x1-device, printed by benchmarks/gpu/collective_check.py). This
keeps each one there, not empty, and sourced; tests/run/test_gpu_topology.py parses them."""
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
    # PCIe-only unless the folder's name says NVLink (nv12).
    assert bool(re.search(r"\bNV\d+\b", matrix)) == ("-nv" in folder.name), "NVLink only where the name says it"
    # A public report's address, or the project's own device run that printed it.
    assert re.search(r"https://github\.com/[\w.-]+/[\w.-]+/issues/\d+|benchmarks/gpu/collective_check\.py",
                     (folder / "SOURCE.md").read_text())
