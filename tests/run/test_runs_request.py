"""`inv extract`'s settings: the command line over hosts.yaml's `extract:`, mapped to the driver's names."""
from __future__ import annotations

import pytest

from base.contract import IN_PROCESS, SERVER
from specrig.errors import UsageError
from specrig.inventory import load_inventory
from specrig.run.settings import build_request, parse_layers
from support.paths import REPO


def test_the_example_host_alone_is_the_whole_command():
    host = load_inventory(REPO / "hosts.yaml").host("blackwell01")
    request = build_request(host, {})
    assert request.driver_args == {
        "model": "/data/models/Kimi-K2.5", "dataset": "/data/datasets/sharegpt.jsonl",
        "output_dir": "/data/eagle3/kimi-k25-hidden", "tensor_parallel_size": 8, "layer_ids": [2, 30, 58, 60],
        "batch_size": 2, "max_length": 4096}
    assert request.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    # The example stays clear of speculators' batch-reordering corruption: batch x len <= max(8192, len).
    assert request.driver_args["batch_size"] * request.driver_args["max_length"] <= 8192


def test_the_command_line_wins_and_is_converted(make_inventory):
    path = make_inventory({"hosts": {"h": {"extract": {"model": "/m", "data": "/d.jsonl", "out": "/o", "tp": 2,
                                                       "max_restarts": 5, "stall_restart": True}}}})
    request = build_request(load_inventory(path).host("h"), {"tp": "4", "layers": "3, 7", "max_samples": "100"})
    assert request.driver_args["tensor_parallel_size"] == 4
    assert request.driver_args["layer_ids"] == [3, 7] and request.driver_args["max_samples"] == 100
    assert request.options == {"max_restarts": 5, "stall_restart": True}


def test_storage_comes_from_the_command_line_or_hosts_yaml(make_inventory):
    host = load_inventory(make_inventory({"hosts": {"h": {"extract": {"model": "/m", "data": "/d", "out": "/o",
                                                                      "storage": "fp8"}}}})).host("h")
    assert build_request(host, {}).driver_args["storage"] == "fp8"
    assert build_request(host, {"storage": "bf16"}).driver_args["storage"] == "bf16"
    assert build_request(host, {"storage": "bf16"}).sources["storage"] == "--storage"


def test_enforce_eager_comes_from_the_command_line_or_hosts_yaml(make_inventory):
    host = load_inventory(make_inventory({"hosts": {"h": {"extract": {"model": "/m", "data": "/d", "out": "/o",
                                                                      "enforce_eager": True}}}})).host("h")
    assert build_request(host, {}).driver_args["enforce_eager"] is True
    plain = load_inventory(make_inventory({"hosts": {"h": {"extract": {"model": "/m", "data": "/d", "out": "/o"}}}}))
    assert "enforce_eager" not in build_request(plain.host("h"), {}).driver_args  # the host's default: compiled
    assert build_request(plain.host("h"), {"enforce_eager": True}).sources["enforce_eager"] == "--enforce-eager"


@pytest.mark.parametrize("extract, given, message", [
    ({"model": "/m", "data": "/d", "out": "/o", "gpus_per_node": 8}, {}, "hosts.h.extract.gpus_per_node: unknown key"),
    ({"model": "/m", "data": "/d", "out": "/o", "tp": "eight"}, {}, "hosts.h.extract.tp 'eight': expected int"),
    ({"model": "/m", "data": "/d", "out": "/o", "stall_restart": "yes"}, {}, "stall_restart 'yes': expected true or false"),
    ({"model": "/m", "data": "/d"}, {}, "no --out given and hosts.yaml has no hosts.h.extract.out"),
    ({"model": "/m", "data": "/d", "out": "/o"}, {"batch_size": "-1"}, "--batch-size '-1': expected a positive number"),
    ({"model": "/m", "data": "/d", "out": "/o"}, {"writer_threads": "0"}, "--writer-threads '0': expected a positive number"),
    ({"model": "/m", "data": "/d", "out": "/o", "max_num_batched_tokens": "lots"}, {},
     "hosts.h.extract.max_num_batched_tokens 'lots': expected int"),
    ({"model": "/m", "data": "/d", "out": "/o"}, {"storage": "fp16"}, "--storage 'fp16': expected one of bf16, fp8"),
    ({"model": "/m", "data": "/d", "out": "/o"}, {"clients": "0"}, "--clients '0': expected a positive number"),
    ({"model": "/m", "data": "/d", "out": "/o", "concurrency": 2}, {"clients": "4"},
     "--clients 4: more client processes than requests in flight (2)"),
    ({"model": "/m", "data": "/d", "out": "/o", "enforce_eager": "yes"}, {},
     "hosts.h.extract.enforce_eager 'yes': expected true or false"),
    ({"model": "/m", "data": "/d", "out": "/o", "storage": "FP8"}, {},
     "hosts.yaml: hosts.h.extract.storage 'FP8': expected one of bf16, fp8"),
])
def test_bad_settings_name_where_they_came_from(make_inventory, extract, given, message):
    host = load_inventory(make_inventory({"hosts": {"h": {"extract": extract}}})).host("h")
    with pytest.raises(UsageError) as raised:
        build_request(host, given)
    assert message in raised.value.one_line()


@pytest.mark.parametrize("text", ["", "a,b", "-1", "2,,x"])
def test_bad_layers_are_refused(text):
    with pytest.raises(UsageError, match="--layers"):
        parse_layers(text)


@pytest.mark.parametrize("extract, given, mode, message", [
    ({"port": 8001}, {}, IN_PROCESS, "hosts.yaml: hosts.h.extract.port 8001: port applies to server mode "
                                     "(speculators >= 0.8), and h takes speculators <= 0.4's in-process extraction"),
    ({}, {"allow_skipped": True}, IN_PROCESS, "--allow-skipped True: allow_skipped applies to server mode"),
    ({}, {"writer_threads": "8"}, IN_PROCESS, "--writer-threads 8: writer_threads applies to server mode"),
    ({}, {"storage": "fp8"}, IN_PROCESS, "--storage 'fp8': storage applies to server mode (speculators >= 0.8), "
                                         "and h takes speculators <= 0.4's in-process extraction"),
    ({"enforce_eager": True}, {}, IN_PROCESS, "hosts.yaml: hosts.h.extract.enforce_eager True: enforce_eager "
                                              "applies to server mode"),
    ({}, {"batch_size": "4"}, SERVER, "--batch-size 4: batch_size applies to speculators <= 0.4's in-process "
                                      "extraction, and h takes server mode (speculators >= 0.8)"),
])
def test_a_setting_of_the_other_extraction_mode_is_refused_by_name(make_inventory, extract, given, mode, message):
    host = load_inventory(make_inventory({"hosts": {"h": {"extract": {"model": "/m", "data": "/d", "out": "/o",
                                                                      **extract}}}})).host("h")
    request = build_request(host, given)
    with pytest.raises(UsageError) as raised:
        request.for_mode(mode, host)
    assert message in raised.value.one_line()
    own = SERVER if mode == IN_PROCESS else IN_PROCESS
    assert request.for_mode(own, host) is request  # in its own mode the same request passes


def test_collective_safe_turns_p2p_off_in_the_env_and_custom_all_reduce_off_in_vllm(make_inventory):
    """--collective-safe (issue 38): vLLM #33041's workaround, both halves; from hosts.yaml too."""
    host = load_inventory(make_inventory({"hosts": {"h": {"env": {"NCCL_DEBUG": "WARN"}, "extract": {
        "model": "/m", "data": "/d", "out": "/o", "collective_safe": True}}}})).host("h")
    request = build_request(host, {})
    assert request.driver_args["collective_safe"] is True
    assert request.env == {"NCCL_DEBUG": "WARN", "NCCL_P2P_DISABLE": "1"}
    plain = load_inventory(make_inventory({"hosts": {"h": {"extract": {"model": "/m", "data": "/d",
                                                                       "out": "/o"}}}})).host("h")
    assert "NCCL_P2P_DISABLE" not in build_request(plain, {}).env
    assert build_request(plain, {"collective_safe": True}).sources["collective_safe"] == "--collective-safe"
