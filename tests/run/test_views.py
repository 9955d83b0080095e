"""The views' shared vocabulary: a style for every run state the host names, sizes in IEC units."""
from __future__ import annotations

import pytest
from rich.console import Console

from base.contract import ACTIVE_STATES, DISK_LOW, FAILED, FINAL_STATES, LOST
from specrig.inventory import Host
from specrig.run import node_view, view, view_parts
from specrig.run.view import STATE_STYLE
from specrig.ui import human_bytes


@pytest.mark.parametrize("state", [*ACTIVE_STATES, *FINAL_STATES, LOST])
def test_every_run_state_has_a_style(state):
    # A state renamed or added in remote/base/contract.py without a style here would show plain.
    assert STATE_STYLE.get(state), f"run state {state!r} has no style in specrig/run/view.py"


def test_the_styles_name_no_state_the_host_does_not():
    assert set(STATE_STYLE) == {*ACTIVE_STATES, *FINAL_STATES, LOST}


@pytest.mark.parametrize(("size", "shown"), [(None, "-"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"),
                                             (1536, "1.5 KiB"), (63_900_000_000, "59.5 GiB"),
                                             (5 * 2**50, "5.0 PiB")])
def test_sizes_are_in_iec_units(size, shown):
    assert human_bytes(size) == shown


def test_extract_says_which_flags_the_server_gets(monkeypatch):
    console = Console(record=True, width=200, file=open("/dev/null", "w"), highlight=False)
    monkeypatch.setattr(view, "console", console)
    because = "vllm 0.22.0 refuses enable_chunked_prefill with ExampleHiddenStatesConnector (vllm/config/vllm.py:738)"
    view.show_extract({"run_id": "r1", "path": "/w/r1", "preflight": None,
                       "startup_flags": [{"flag": "--no-enable-chunked-prefill", "because": because}]},
                      host=Host(name="gpu"), as_json=False, follow=None)
    assert f"the server gets --no-enable-chunked-prefill: {because}" in console.export_text()


def test_layers_other_than_trainings_default_are_one_line_a_choice_or_a_warning():
    same = {"ids": [2, 16, 29, 32], "training_default": [2, 16, 29, 32]}
    other = {"ids": [3, 16, 29, 32], "training_default": [2, 16, 29, 32]}
    # In process: no plan.
    assert view_parts.layers_note(same, None) is None and view_parts.layers_note(None, None) is None
    chosen = view_parts.layers_note(other, "--layers")
    assert "as --layers asks" in chosen and "[2, 16, 29, 32]" in chosen and "warning" not in chosen
    warned = view_parts.layers_note(other, "hosts.yaml: hosts.gpu1.extract.layers")
    assert warned.startswith("[yellow]warning:[/] layers [3, 16, 29, 32] (hosts.yaml: hosts.gpu1.extract.layers)")
    assert "pass --layers to choose them" in warned and "\n" not in warned


def _printed(monkeypatch) -> Console:
    console = Console(record=True, width=300, file=open("/dev/null", "w"), highlight=False)
    for module in (view, view_parts, node_view):
        monkeypatch.setattr(module, "console", console)
    return console


def test_the_layers_line_is_said_once_per_launch_on_one_host_a_shard_and_a_multi_node_job(monkeypatch):
    other = {"ids": [1, 2, 3], "training_default": [2, 2, 1, 4]}
    console = _printed(monkeypatch)
    view.show_extract({"run_id": "r1", "path": "/w/r1", "preflight": None, "layers": other,
                       "layers_source": "--layers"}, host=Host(name="gpu"), as_json=False, follow=None)
    view_parts.show_layers_note({"run_id": "r2", "layers": other, "layers_source": "--layers"}, host="lab-2")
    node_view.show_job_launched("nodes-1", {"lab-1": {"master_addr": "10.0.0.1"}, "lab-2": {}},
                                {"lab-1": {"layers": other, "layers_source": "hosts.yaml: hosts.lab-1.extract.layers"},
                                 "lab-2": {"layers": other, "layers_source": None}}, "dp 2", as_json=False)
    lines = console.export_text().splitlines()
    assert lines[0] == "layers [1, 2, 3], as --layers asks; speculators' training defaults to [2, 2, 1, 4]: train " \
                       "with these ids (specrig-layers.json beside the files records them)"
    assert lines[2] == "lab-2: " + lines[0]
    assert lines[3].startswith("multi-node job nodes-1: dp 2; head lab-1") and len(lines) == 5, lines
    assert lines[4].startswith("warning: layers [1, 2, 3] (hosts.yaml: hosts.lab-1.extract.layers) differ")


def test_no_layers_line_where_the_ids_are_trainings_default_or_there_is_no_plan(monkeypatch):
    console = _printed(monkeypatch)
    view_parts.show_layers_note({"layers": {"ids": [2, 2, 1, 4], "training_default": [2, 2, 1, 4]},
                                 "layers_source": "--layers"}, host="lab-1")
    view_parts.show_layers_note({"layers": None, "layers_source": None}, host="lab-2")  # in-process: no plan
    assert console.export_text() == ""


def test_a_disk_low_failure_says_its_kind_once_in_plain_words(monkeypatch):
    failure = {"kind": DISK_LOW, "rule": None, "explain": "disk low: 1.9 MiB free on /out, need about 16.0 MiB",
               "advice": "free space there", "retryable": False, "restarted": False}
    console = _printed(monkeypatch)
    console.print(view.describe_failure(failure))
    assert console.export_text().splitlines()[0] == "disk low: 1.9 MiB free on /out, need about 16.0 MiB"
    # Refused before any attempt: the run's failure is shown all the same.
    view.show_run({"run_id": "r1", "state": FAILED, "attempts": [], "last_failure": failure})
    assert "failure   disk low: 1.9 MiB free on /out, need about 16.0 MiB" in console.export_text()


def test_a_server_mode_run_says_how_long_from_health_to_its_first_file(monkeypatch):
    console = _printed(monkeypatch)
    view.show_run({"run_id": "r1", "state": "running", "attempts": [], "heartbeat": {
        "phase": "generating", "startup": {"health": 10.0, "first_file": 13.25, "health_to_first_file_s": 3.25,
                                           "prepare": "cached"}}})
    assert "start-up  first file 3.2 s after /health, prepare-data cached" in console.export_text()
