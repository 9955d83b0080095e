"""GPU telemetry parsing against real nvidia-smi output of a 2x H200 host (idle and under load)."""
from __future__ import annotations

import pytest

from base import telemetry
from support.paths import H200X2

#: The fields, in order, that query_gpu_after_nounits.csv was produced with (it has no header).
WIDE_QUERY = ("index", "name", "uuid", "pci.bus_id", "driver_version", "memory.used", "memory.total", "memory.free",
              "utilization.gpu", "utilization.memory", "temperature.gpu", "power.draw", "power.limit",
              "clocks.current.sm", "pstate")
UUIDS = ["GPU-95e8d11f-2676-217a-8d4e-19bda498d26d", "GPU-b1291625-235c-3726-1ce1-9a92dc66d98b"]


@pytest.fixture(scope="module")
def fixtures():
    return H200X2


def gpus_of(fixtures, name, **kwargs):
    return telemetry.parse_csv((fixtures / name).read_text(), telemetry.GPU_FIELDS, **kwargs)


def test_idle_reads_both_gpus_with_nothing_used(fixtures):
    rows = gpus_of(fixtures, "query_gpu_idle.csv")
    assert [g["index"] for g in rows] == [0, 1]
    assert [g["uuid"] for g in rows] == UUIDS
    assert all(g["name"] == "NVIDIA H200" for g in rows)
    assert all(g["memory_used_mib"] == 0 and g["memory_total_mib"] == 143771 for g in rows)
    assert all(g["memory_free_mib"] == 143156 and g["utilization_pct"] == 0 for g in rows)
    assert [g["power_w"] for g in rows] == [117.23, 124.07]
    assert [g["temperature_c"] for g in rows] == [33, 33]


def test_load_reads_memory_utilization_temperature_power(fixtures):
    rows = gpus_of(fixtures, "query_gpu_load.csv")
    assert [(g["memory_used_mib"], g["memory_free_mib"]) for g in rows] == [(29587, 113570), (29587, 113570)]
    assert [g["utilization_pct"] for g in rows] == [95, 95]
    assert [g["temperature_c"] for g in rows] == [54, 55]
    assert [g["power_w"] for g in rows] == [688.17, 691.11]


def test_headerless_nounits_output_is_read_by_its_query_order(fixtures):
    rows = gpus_of(fixtures, "query_gpu_after_nounits.csv", columns=WIDE_QUERY)
    assert [g["uuid"] for g in rows] == UUIDS
    assert [g["utilization_pct"] for g in rows] == [31, 43]
    assert [g["power_w"] for g in rows] == [127.53, 136.75]
    assert all(g["memory_total_mib"] == 143771 and g["memory_used_mib"] == 0 for g in rows)


def test_headerless_output_without_its_query_order_is_refused_when_columns_lack_a_field(fixtures):
    with pytest.raises(ValueError, match="memory.free"):
        gpus_of(fixtures, "query_gpu_after_nounits.csv", columns=("index", "name"))


def test_compute_apps_are_attached_to_their_gpu(fixtures):
    apps = telemetry.parse_csv((fixtures / "query_apps_load.csv").read_text(), telemetry.APP_FIELDS)
    assert apps == [
        {"pid": 571, "process_name": "python3", "gpu_uuid": UUIDS[0], "memory_used_mib": 29578},
        {"pid": 572, "process_name": "python3", "gpu_uuid": UUIDS[1], "memory_used_mib": 29578},
    ]
    per_gpu = telemetry.with_processes(gpus_of(fixtures, "query_gpu_load.csv"), apps)
    assert [[p["pid"] for p in g["processes"]] for g in per_gpu] == [[571], [572]]
    idle = telemetry.with_processes(gpus_of(fixtures, "query_gpu_idle.csv"), [])
    assert all(g["processes"] == [] for g in idle)


def test_the_human_table_agrees_with_the_csv(fixtures):
    """nvidia-smi's own table of the same moment shows the same memory per GPU and the same processes."""
    table = (fixtures / "nvsmi_load.txt").read_text()
    rows = gpus_of(fixtures, "query_gpu_load.csv")
    for gpu in rows:
        assert f"{gpu['memory_used_mib']:.0f}MiB / {gpu['memory_total_mib']:.0f}MiB" in table
    assert "571      C   python3" in table and "572      C   python3" in table


# -- the tensor-parallel check's capture (tests/programs/gpu_check_tp.py on 2x H200, 2026-11-30) --------

TP = H200X2.parent / "h200x2-tp"
TP_UUIDS = ["GPU-ebb0d8ad-354c-0c85-414f-67689156434e", "GPU-7251c3cc-143b-27a0-9151-7bdbbf954522"]


def test_compute_capability_is_read_apart_from_the_other_fields():
    rows = telemetry.parse_csv((TP / "query_compute_cap.csv").read_text(), telemetry.CAP_FIELDS)
    assert rows == [{"index": 0, "uuid": TP_UUIDS[0], "name": "NVIDIA H200", "compute_cap": "9.0"},
                    {"index": 1, "uuid": TP_UUIDS[1], "name": "NVIDIA H200", "compute_cap": "9.0"}]
    # Not one of GPU_FIELDS: nvidia-smi of drivers older than 510 refuses the field, and the whole query.
    assert "compute_cap" not in [query for query, _, _ in telemetry.GPU_FIELDS]


def test_two_nccl_workers_under_load():
    gpus = telemetry.parse_csv((TP / "query_gpu_load.csv").read_text(), telemetry.GPU_FIELDS)
    apps = telemetry.parse_csv((TP / "query_apps_load.csv").read_text(), telemetry.APP_FIELDS)
    assert [(g["memory_used_mib"], g["utilization_pct"], g["power_w"]) for g in gpus] == [
        (9715, 91, 247.23), (9715, 92, 248.42)]
    per_gpu = telemetry.with_processes(gpus, apps)
    assert [[(p["pid"], p["memory_used_mib"]) for p in g["processes"]] for g in per_gpu] == [[(965, 9706)],
                                                                                            [(966, 9706)]]
    table = (TP / "nvsmi_load.txt").read_text()
    assert "9715MiB / 143771MiB" in table and "965      C   /opt/torch/.venv/bin/python3" in table
