"""Preflight checks that need no host: GPUs (against the real h200x2 nvidia-smi output), torch's build
against the GPUs' compute capability, the output size."""
from __future__ import annotations

import json
import sys

import pytest

from base import telemetry
from run import preflight
from support.paths import H200X2, REPO

CAPS = REPO / "tests" / "fixtures" / "nvidia-smi" / "compute-cap"
H200X2_TP = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200x2-tp"


@pytest.fixture(autouse=True)
def no_local_cmdlines(monkeypatch):
    """The fixtures' pids are another machine's: this one's /proc must not name them."""
    monkeypatch.setattr(preflight.procs, "cmdline", lambda pid: "")


@pytest.fixture(scope="module")
def smi():

    def read(gpus_file, apps_file=None):
        seen = {"available": True, "reason": None,
                "gpus": telemetry.parse_csv((H200X2 / gpus_file).read_text(), telemetry.GPU_FIELDS)}
        apps = telemetry.parse_csv((H200X2 / apps_file).read_text(), telemetry.APP_FIELDS) if apps_file else []
        return seen, apps

    return read


def test_two_idle_gpus_take_tensor_parallel_two(smi):
    result = preflight.gpu_check(2, *smi("query_gpu_idle.csv"), None)
    assert result["ok"] and result["detail"] == "2 visible, 143156 MiB free on each"


def test_gpus_held_by_other_processes_fail_with_their_pids(smi):
    result = preflight.gpu_check(2, *smi("query_gpu_load.csv", "query_apps_load.csv"), None)
    assert not result["ok"]
    assert "GPU 0 by pid 571 (python3, 29578 MiB)" in result["detail"]
    assert "GPU 1 by pid 572 (python3, 29578 MiB)" in result["detail"]
    assert "CUDA_VISIBLE_DEVICES" in result["advice"]


def test_the_process_is_named_by_its_command_line_where_it_runs_what_nvidia_smi_names(monkeypatch):
    app = {"pid": 965, "process_name": "/opt/torch/.venv/bin/python3", "memory_used_mib": 9706.0}
    monkeypatch.setattr(preflight.procs, "cmdline", lambda pid: "/opt/torch/.venv/bin/python3 /w/nccl_job.py --hold 1 4")
    assert preflight._process(app) == "pid 965 (python3 nccl_job.py --hold 1 4, 9706 MiB)"
    monkeypatch.setattr(preflight.procs, "cmdline", lambda pid: "/usr/sbin/sshd -D")  # another pid namespace's
    assert preflight._process(app) == "pid 965 (python3, 9706 MiB)"


def test_a_reordered_cuda_visible_devices_makes_cuda0_the_first_named_gpu(smi):
    seen, apps = smi("query_gpu_load.csv", "query_apps_load.csv")
    apps = [a for a in apps if a["pid"] == 572]  # only GPU 1 in use
    result = preflight.gpu_check(1, seen, apps, "1,0")
    assert not result["ok"] and "cuda:0 is GPU 1, cuda:1 is GPU 0" in result["detail"]
    assert "GPU 1 by pid 572" in result["detail"]
    assert preflight.gpu_check(1, seen, apps, "0,1")["ok"]


@pytest.mark.parametrize("visible, indices", [
    (None, [0, 1]), ("", []), ("1", [1]), ("1,0", [1, 0]), ("0,7,1", [0]), ("1,1", [1]), ("-1", []),
    ("GPU-b1291625", [1]), ("GPU-b1291625-235c-3726-1ce1-9a92dc66d98b,0", [1, 0]), ("GPU-", []),
])
def test_visible_gpus_follow_cuda(smi, visible, indices):
    """As CUDA reads CUDA_VISIBLE_DEVICES: indices or (unique prefixes of) UUIDs, up to the first entry
    that names no GPU, or one named already."""
    seen, _ = smi("query_gpu_idle.csv")
    assert [g["index"] for g in telemetry.visible_gpus(seen["gpus"], visible)] == indices


def test_only_the_gpus_the_job_will_use_must_be_free(smi):
    seen, apps = smi("query_gpu_load.csv", "query_apps_load.csv")
    apps = [a for a in apps if a["pid"] == 572]  # only GPU 1 in use
    assert preflight.gpu_check(1, seen, apps, None)["ok"]  # tp 1 takes GPU 0
    assert not preflight.gpu_check(1, seen, apps, "1")["ok"]  # CUDA_VISIBLE_DEVICES=1 makes it GPU 1


def test_too_few_visible_gpus_for_the_tensor_parallel_size(smi):
    seen, apps = smi("query_gpu_idle.csv")
    result = preflight.gpu_check(4, seen, apps, None)
    assert not result["ok"] and "needs 4 GPUs" in result["advice"]
    uuid = seen["gpus"][1]["uuid"]
    result = preflight.gpu_check(2, seen, apps, uuid)
    assert not result["ok"] and "shows 1" in result["advice"]


def test_no_nvidia_smi_passes_only_a_single_process_run():
    absent = {"available": False, "gpus": [], "reason": "nvidia-smi not found on PATH"}
    assert preflight.gpu_check(1, absent, [], None)["ok"]
    assert not preflight.gpu_check(8, absent, [], None)["ok"]


def test_output_size_is_layers_times_hidden_times_dtype_bytes_per_token():
    kimi = {"architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": {"hidden_size": 7168, "num_hidden_layers": 61, "torch_dtype": "bfloat16"}}
    estimate = preflight.output_estimate(kimi, {"layer_ids": [2, 30, 58, 60]}, [1000, 3000])
    assert estimate["bytes_per_token"] == 57344  # 4 x 7168 x 2, as the issue computes it
    assert estimate["bytes"] == 57344 * 4000


SAMPLES = [100, 200, 300, 400, 500, 600, 700]  # tokens of each sample, in dataset order


@pytest.mark.parametrize("server, index, taken", [
    (True, 0, [100, 200, 300]), (True, 1, [400, 500]), (True, 2, [600, 700]),  # speculators' chunks: 3, 2, 2
    (False, 0, [100, 400, 700]), (False, 1, [200, 500]), (False, 2, [300, 600]),  # in process: i % 3 == k
])
def test_a_shard_is_sized_by_the_samples_it_takes(server, index, taken):
    assert preflight.share(SAMPLES, {"shard_index": index, "shard_count": 3}, server=server) == taken
    assert preflight.share(SAMPLES, {}, server=server) == SAMPLES


def test_the_disk_budget_is_the_shares_tokens_in_the_storage_bytes_per_value(tmp_path):
    from base import contract

    tiny = {"hidden_size": 128, "num_hidden_layers": 8}
    driver = {"layer_ids": [2, 4, 5, 8], "shard_index": 1, "shard_count": 3}
    share = preflight.share(SAMPLES, driver, server=True)
    bf16 = preflight.output_estimate(tiny, driver, share, storage=contract.BF16)
    fp8 = preflight.output_estimate(tiny, driver, share, storage=contract.FP8)
    assert (bf16["bytes"], fp8["bytes"]) == (4 * 128 * 2 * 900, (4 * 128 + contract.FP8_SCALE_BYTES) * 900)
    found = preflight.disk(str(tmp_path / "out"), dict(bf16, bytes=10 ** 18))  # more than any disk
    assert not found["ok"] and found["detail"].endswith(
        f" free at {tmp_path}; shard 2 of 3 (2 samples, 1024 B/token x 900 tokens) needs about 977.0 PiB")
    assert found["advice"].startswith("free ") and f"at {tmp_path}, or choose an --out with room" in found["advice"]


@pytest.mark.parametrize("batch, length, ok", [(8, 1024, True), (4, 2048, True), (8, 2048, False), (1, 8192, True),
                                               (1, 16384, True), (2, 8192, False)])
def test_reorder_hazard(batch, length, ok):
    # speculators 0.3.0 is installed nowhere here: an unknown version counts as affected.
    assert preflight.reorder_hazard(batch, length)["ok"] is ok


# -- torch-arch: torch's build against the GPUs' compute capability ------------------------------------

def caps_of(path):
    return {"available": True, "reason": None, "gpus": telemetry.parse_csv(path.read_text(), telemetry.CAP_FIELDS)}


def build_of(name):
    return json.loads((CAPS / name).read_text())


def test_a_cu126_torch_on_b200_fails_at_the_first_kernel():
    caps = caps_of(CAPS / "b200x8_compute_cap.csv")
    result = preflight.torch_arch_check(build_of("torch-2.11.0+cu126.json"), caps, caps["gpus"])
    assert not result["ok"]
    assert result["detail"] == (
        "torch 2.11.0+cu126 (CUDA 12.6) has kernels for sm_50, sm_60, sm_70, sm_75, sm_80, sm_86, sm_90 but "
        "GPUs 0-7 (NVIDIA B200) are sm_100: it fails at the first kernel with 'no kernel image is available'")
    assert result["advice"].startswith("install a torch build for CUDA 12.8+ (cu128)")


def test_one_gpu_is_named_alone():
    caps = caps_of(CAPS / "b200x8_compute_cap.csv")
    result = preflight.torch_arch_check(build_of("torch-2.11.0+cu126.json"), caps, caps["gpus"][:1])
    assert "but GPU 0 (NVIDIA B200) is sm_100: it fails" in result["detail"]


@pytest.mark.parametrize("build", ["torch-2.11.0+cu130_h200x2.json", "torch-2.14.1+cu130_cpu-host.json"])
def test_cu130_builds_run_on_b200_and_on_the_h200s_they_were_read_on(build):
    b200 = caps_of(CAPS / "b200x8_compute_cap.csv")
    assert preflight.torch_arch_check(build_of(build), b200, b200["gpus"])["ok"]
    h200 = caps_of(H200X2_TP / "query_compute_cap.csv")
    result = preflight.torch_arch_check(build_of(build), h200, h200["gpus"])
    assert result["ok"] and result["detail"].endswith("; GPUs 0, 1 (NVIDIA H200) are sm_90")


def test_cu126_runs_on_h200():
    h200 = caps_of(H200X2_TP / "query_compute_cap.csv")
    assert preflight.torch_arch_check(build_of("torch-2.11.0+cu126.json"), h200, h200["gpus"])["ok"]


def test_a_cpu_only_or_missing_torch_on_a_gpu_host_fails():
    caps = caps_of(CAPS / "b200x8_compute_cap.csv")
    cpu = dict(build_of("torch-2.14.1+cu130_cpu-host.json"), version="2.14.1+cpu", cuda=None, arch_list=[])
    result = preflight.torch_arch_check(cpu, caps, caps["gpus"])
    assert not result["ok"] and "torch 2.14.1+cpu is a CPU-only build" in result["detail"]
    assert "cu128" in result["advice"]
    missing = {"installed": False, "version": None, "cuda": None, "hip": None, "arch_list": [],
               "cuda_initialized": False, "error": "ModuleNotFoundError: No module named 'torch'"}
    result = preflight.torch_arch_check(missing, caps, caps["gpus"])
    assert not result["ok"] and result["detail"].startswith("torch is not installed in this environment")


def test_no_gpus_or_no_capability_passes():
    absent = {"available": False, "gpus": [], "reason": "nvidia-smi failed: Field \"compute_cap\" is not a valid field"}
    assert preflight.torch_arch_check(None, absent, [])["ok"]
    caps = caps_of(CAPS / "b200x8_compute_cap.csv")
    assert preflight.torch_arch_check(None, caps, [])["ok"]  # CUDA_VISIBLE_DEVICES hides them all


@pytest.mark.parametrize("arch, capability, runs", [
    ("sm_90", (9, 0), True), ("sm_80", (8, 6), True), ("sm_86", (8, 0), False), ("sm_90", (10, 0), False),
    ("sm_100", (10, 3), True), ("sm_120", (12, 1), True), ("sm_90a", (9, 0), True), ("sm_100a", (10, 3), False),
    ("compute_90", (10, 0), True), ("compute_120", (9, 0), False), ("compute_100a", (10, 3), False),
    ("sm_100f", (10, 3), True), ("sm_75", (7, 0), False),
])
def test_which_code_runs_on_which_gpu(arch, capability, runs):
    assert preflight.arch_runs_on(arch, capability) is runs


def test_ptx_of_an_older_arch_runs_but_is_named():
    caps = caps_of(CAPS / "b200x8_compute_cap.csv")
    build = dict(build_of("torch-2.11.0+cu126.json"), arch_list=["sm_80", "sm_90", "compute_90"])
    result = preflight.torch_arch_check(build, caps, caps["gpus"][:2])
    assert result["ok"] and "and PTX for compute_90" in result["detail"]
    assert "GPU 0, 1 only through PTX" in result["detail"]


def test_the_helper_reads_this_python_without_torch(monkeypatch):
    """remote/run/torch_arch.py in a process of its own: here torch is not installed (or is: then it reads it)."""
    build = preflight.torch_build(sys.executable, timeout=120)
    assert build["error"] is None or build["installed"] is False
    assert build["cuda_initialized"] is False
    try:
        import torch  # noqa: F401
    except ImportError:
        assert build["installed"] is False and "torch" in build["error"]


def test_no_nvidia_smi_passes_without_running_the_helper(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(preflight, "torch_build", lambda *a, **k: pytest.fail("the helper ran"))
    result = preflight.torch_arch(8)
    assert result["ok"] and result["detail"] == "no NVIDIA GPUs: nothing to match torch's build against"
