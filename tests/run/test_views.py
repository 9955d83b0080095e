"""The views' shared vocabulary: a style for every run state the host names, sizes in IEC units."""
from __future__ import annotations

import pytest
from rich.console import Console

from specrig.contract import ACTIVE_STATES, FINAL_STATES, LOST
from specrig.inventory import Host
from specrig.run import view
from specrig.run.view import STATE_STYLE
from specrig.ui import human_bytes


@pytest.mark.parametrize("state", [*ACTIVE_STATES, *FINAL_STATES, LOST])
def test_every_run_state_has_a_style(state):
    # A state renamed or added in remote/contract.py without a style here would show plain.
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
    assert view.layers_note(same, None) is None and view.layers_note(None, None) is None  # in-process: no plan
    chosen = view.layers_note(other, "--layers")
    assert "as --layers asks" in chosen and "[2, 16, 29, 32]" in chosen and "warning" not in chosen
    warned = view.layers_note(other, "hosts.yaml: hosts.gpu1.extract.layers")
    assert warned.startswith("[yellow]warning:[/] layers [3, 16, 29, 32] (hosts.yaml: hosts.gpu1.extract.layers)")
    assert "pass --layers to choose them" in warned and "\n" not in warned
