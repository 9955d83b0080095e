"""Preflight checks that need no host: GPUs (against the real h200x2 nvidia-smi output), the output size."""
from __future__ import annotations

import pytest

from run import preflight
import telemetry
from conftest import H200X2



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
    assert result["ok"] and result["detail"] == "2 visible, 143156 / 143156 MiB free"


def test_gpus_held_by_other_processes_fail_with_their_pids(smi):
    result = preflight.gpu_check(2, *smi("query_gpu_load.csv", "query_apps_load.csv"), None)
    assert not result["ok"]
    assert "GPU 0 by pid 571" in result["detail"] and "GPU 1 by pid 572" in result["detail"]
    assert "CUDA_VISIBLE_DEVICES" in result["advice"]


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


@pytest.mark.parametrize("batch, length, ok", [(8, 1024, True), (4, 2048, True), (8, 2048, False), (1, 8192, True),
                                               (1, 16384, True), (2, 8192, False)])
def test_reorder_hazard(batch, length, ok):
    # speculators 0.3.0 is installed nowhere here: an unknown version counts as affected.
    assert preflight.reorder_hazard(batch, length)["ok"] is ok
