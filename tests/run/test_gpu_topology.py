"""The GPUs' topology, PCIe path and known-bad settings (remote/gpus/, issue 38 points 2 and 5), against the real
`nvidia-smi topo -m` of tests/fixtures/nvidia-smi/*/ (each from a public report, its SOURCE.md) and the 2x H200
captures of ../shared/fixtures/nvidia-smi/h200x2/."""
from __future__ import annotations

import pytest

from gpus import hazards, pcie, topology
from support.paths import FIXTURES, H200X2, SHARED_FIXTURES

NVSMI = FIXTURES / "nvidia-smi"
TOPOLOGIES = sorted(path.parent for path in NVSMI.glob("*/topo_m.txt"))


def topo(name: str) -> dict:
    return topology.parse_topo((NVSMI / name / "topo_m.txt").read_text())


@pytest.mark.parametrize("folder", TOPOLOGIES, ids=[path.name for path in TOPOLOGIES])
def test_every_real_topology_parses_with_each_pair_once(folder):
    found = topology.parse_topo((folder / "topo_m.txt").read_text())
    count = len(found["gpus"])
    assert found["gpus"] == list(range(count)) and len(found["links"]) == count * (count - 1) // 2
    assert set(found["kinds"]) <= set(topology.PCIE_LINKS) | {"NV12"}
    # The folder's name says what its matrix holds (pcie4-pxb-pix-sys: PXB, PIX and SYS).
    for kind in ("pix", "pxb", "phb", "node", "sys", "nv12"):
        assert (kind in folder.name.split("-")) == (kind.upper() in found["kinds"]), kind
    assert found["pcie_only"] == (count > 1 and "nv12" not in folder.name)  # one GPU has no link at all


def test_the_layouts_parse_alike_tabs_spaces_and_empty_cells():
    # nccl#667: tabs, NUMA column; quda#669: tabs, a NIC column, no NUMA column; rtx5090: an empty cell before
    # GPU NUMA ID; vLLM #47266: spaces.
    assert topo("pcie4-pxb-pix-sys-nccl667")["links"] == {"0-1": "PXB", "0-2": "SYS", "0-3": "SYS", "1-2": "SYS",
                                                          "1-3": "SYS", "2-3": "PIX"}
    assert topo("pcie4-pxb-pix-sys-nccl667")["numa"] == {0: 0, 1: 0, 2: 1, 3: 1}
    eight = topo("pcie8-pix-pxb-sys-quda669")
    assert eight["links"]["4-5"] == "PIX" and eight["links"]["4-6"] == "PXB" and eight["numa"] == {}
    assert topo("rtx5090x2-phb-p2p-gns")["links"] == {"0-1": "PHB"}
    assert topo("l40sx4-node-sys")["numa"] == {0: 0, 1: 0, 2: 1, 3: 1}  # the NIC rows are not GPUs
    assert topology.describe(topo("rtxpro6000x2-phb-vllm47266")) == \
        "2 GPUs, PCIe only: PHB 0-1 (PCIe through the CPU's host bridge)"


def test_nvlink_pairs_and_the_pcie_pairs_beside_them():
    three = topo("h100nvl3-nv12-sys-nccl1608")
    assert three["nvlink"] and not three["pcie_only"] and three["kinds"] == ["NV12", "SYS"]
    pair = topology.among(three, [0, 1])
    assert pair["links"] == {"0-1": "NV12"} and pair["nvlink"]
    assert topology.among(three, [0, 2])["pcie_only"]
    assert topology.describe(three).startswith("3 GPUs, NVLink on 1 of 3 pairs: NV12 0-1; SYS 0-2, 1-2")


def test_p2p_matrix_and_banner():
    assert topology.parse_p2p((NVSMI / "rtx5090x2-phb-p2p-gns" / "topo_p2p_rw.txt").read_text()) == {"0-1": "GNS"}
    assert topology.parse_header((H200X2 / "nvsmi_idle.txt").read_text()) == {"driver": "580.159.04", "cuda": "13.0"}
    with pytest.raises(topology.TopologyUnreadable):
        topology.parse_topo((H200X2 / "nvsmi_idle.txt").read_text())  # a banner is no matrix


def test_the_device_h100s_matrix_parses_through_the_terminal_escapes_nvidia_smi_wrote_into_a_file():
    device = NVSMI / "h100x1-device"
    assert "\x1b[4m" in (device / "topo_m.txt").read_text()
    found = topo("h100x1-device")
    assert found["gpus"] == [0] and found["links"] == {} and found["numa"] == {0: 0} and not found["pcie_only"]
    assert topology.describe(found).startswith("1 GPU")
    assert topology.parse_p2p((device / "topo_p2p_r.txt").read_text()) == {}
    assert topology.parse_header((device / "banner.txt").read_text()) == {"driver": "580.159.04", "cuda": "13.0"}


def test_the_shared_h200_captures_banner():
    shared = SHARED_FIXTURES / "nvidia-smi" / "h200x2"
    if not shared.is_dir():
        pytest.skip("../shared/fixtures is not beside this checkout")
    for name in ("nvsmi_idle.txt", "nvsmi_load.txt"):
        assert topology.parse_header((shared / name).read_text()) == {"driver": "580.159.04", "cuda": "13.0"}


# -- the PCIe path -------------------------------------------------------------------------------------

def test_acs_control_from_lspci_and_from_config_space():
    # lspci -vvv's line as it prints it for a bridge with redirect on (ACSCtl of the ACS capability).
    line = "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n"
    assert pcie.acs_from_lspci(line) == {"SrcValid": True, "TransBlk": False, "ReqRedir": True, "CmpltRedir": True,
                                         "UpstreamFwd": True, "EgressCtrl": False, "DirectTrans": False}
    assert pcie.acs_from_lspci("\tCapabilities: <access denied>\n") is None
    # Config space: AER at 0x100 pointing to ACS at 0x148 with control 0x001d (SV, RR, CR, UF).
    space = bytearray(4096)
    space[0x100:0x104] = (0x0001 | 1 << 16 | 0x148 << 20).to_bytes(4, "little")
    space[0x148:0x14C] = (0x000D | 1 << 16).to_bytes(4, "little")
    space[0x14E:0x150] = (0x001D).to_bytes(2, "little")
    flags = pcie.acs_from_config(bytes(space))
    assert flags["ReqRedir"] and flags["CmpltRedir"] and flags["SrcValid"] and not flags["TransBlk"]
    assert pcie.acs_from_config(bytes(64)) is None  # a user's read: the first 64 bytes
    assert pcie.acs_from_config(bytes(4096)) == {}  # no extended capability


def test_this_machines_pcie_path_reads_without_root_errors():
    found = pcie.read()
    text = pcie.describe(found)
    assert set(text) == {"iommu", "acs"} and found["iommu"]["translated"] in (True, False, None)


def test_sysfs_path_of_a_gpu_behind_two_bridges(tmp_path):
    devices = tmp_path / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:01:00.0" / "0000:02:00.0"
    devices.mkdir(parents=True)
    (devices / "vendor").write_text("0x10de\n")
    (devices / "class").write_text("0x030200\n")
    bus = tmp_path / "bus"
    bus.mkdir()
    (bus / "0000:02:00.0").symlink_to(devices)
    assert pcie.gpu_addresses(str(bus)) == ["0000:02:00.0"]
    assert pcie.upstream("0000:02:00.0", str(bus)) == ["0000:01:00.0", "0000:00:01.0"]


# -- known-bad combinations ----------------------------------------------------------------------------

def path(redirect=None, translated=None):
    bridges = [{"bridge": "0000:00:01.0", "acs": None if redirect is None else {"ReqRedir": redirect},
                "redirect": redirect, "read_from": None}]
    return {"gpus": ["0000:01:00.0", "0000:02:00.0"], "bridges": bridges, "acs_redirect": redirect,
            "iommu": {"units": [], "cmdline": [], "groups": {}, "translated": translated}}


def names(found, ok=False):
    return [c["name"] for c in found if c["ok"] == ok]


def test_acs_redirect_on_the_rtx_pro_6000_pair_is_named_with_its_fix():
    pair = topo("rtxpro6000x2-phb-rtx6kpro15")
    found = hazards.assess(pair, path(redirect=True), {}, ["12.0", "12.0"])
    assert names(found) == ["acs-redirect"]
    bad = found[0]
    assert "NCCL_P2P_DISABLE=1" in bad["advice"] and "--disable-custom-all-reduce" in bad["advice"]
    assert "33041" in bad["source"]
    assert "custom-all-reduce" in names(found, ok=True)
    # With P2P off the same host is fine.
    assert names(hazards.assess(pair, path(redirect=True), {"NCCL_P2P_DISABLE": "1"}, ["12.0"] * 2)) == []


def test_iommu_translation_and_an_unreadable_path():
    pair = topo("rtxpro6000x2-phb-vllm47266")
    assert names(hazards.assess(pair, path(redirect=False, translated=True), {})) == ["iommu"]
    unread = hazards.assess(pair, path(), {})
    assert names(unread) == [] and "p2p-path" in names(unread, ok=True)


def test_nccl_p2p_level_nvl_without_nvlink():
    found = hazards.assess(topo("pcie4-pxb-pix-sys-nccl667"), path(redirect=False, translated=False),
                           {"NCCL_P2P_LEVEL": "NVL"})
    assert names(found) == ["nccl-p2p-level"] and "drop NCCL_P2P_LEVEL" in found[0]["advice"]
    three = topo("h100nvl3-nv12-sys-nccl1608")
    assert names(hazards.assess(topology.among(three, [0, 1]), path(), {"NCCL_P2P_LEVEL": "NVL"})) == []
    assert names(hazards.assess(three, path(), {"NCCL_P2P_LEVEL": "NVL"})) == ["nccl-p2p-level"]


def test_more_than_two_pcie_only_gpus_of_capability_12():
    found = hazards.assess(topo("pcie8-pix-pxb-sys-quda669"), path(redirect=False, translated=False), {},
                           ["12.0"] * 8)
    note = next(c for c in found if c["name"] == "custom-all-reduce")
    assert note["ok"] and "8 PCIe-only GPUs" in note["detail"] and "12.0" in note["detail"]


def test_p2p_refused_by_the_driver_and_one_gpu():
    found = hazards.assess(topo("rtx5090x2-phb-p2p-gns"), path(redirect=False, translated=False), {},
                           p2p={"0-1": "GNS"})
    assert "p2p-access" in names(found, ok=True)
    assert hazards.assess(topology.among(topo("l40sx4-node-sys"), [2]), path(), {}) == []
