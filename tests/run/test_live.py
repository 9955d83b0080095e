"""What the live view shows for a run's status (the h200x2 nvidia-smi output as its GPUs)."""
from __future__ import annotations

from rich.console import Console

from base import telemetry
from base.contract import FAILED, RUNNING
from specrig.run.live import render, samples_bar
from support.paths import H200X2


def shown(run: dict, tail: str = "") -> str:
    progress, bar = samples_bar()
    console = Console(record=True, width=120)
    console.print(render(run, tail, progress, bar))
    return console.export_text()


def test_phase_progress_rate_eta_gpus_and_log_lines():
    gpus = telemetry.parse_csv((H200X2 / "query_gpu_load.csv").read_text(), telemetry.GPU_FIELDS)
    run = {"run_id": "20261129-180000-abcd", "state": RUNNING, "attempts": [{}],
           "heartbeat": {"phase": "extracting", "samples_done": 1200, "samples_total": 20000,
                         "tokens_per_s": 51234.5, "eta_s": 3725},
           "gpus": {"available": True, "gpus": gpus}}
    text = shown(run, "INFO extracting batch 150\nINFO wrote data_1199.pt")
    assert RUNNING in text and "phase extracting" in text
    assert "1200/20000" in text and "51234 tokens/s" in text and "ETA 1h02m" in text
    assert "29587/143771 MiB" in text and "95 %" in text and "688 W" in text and "55 °C" in text
    assert "wrote data_1199.pt" in text
    assert "Ctrl-C detaches (the run goes on)" in text


def test_a_failure_shows_its_kind_callee_and_advice():
    failure = {"kind": "api-drift", "explain": "SchedulerConfig now requires is_encoder_decoder",
               "callee": "SchedulerConfig", "caller": "speculators/x.py:194 in f", "evidence": "ValidationError",
               "advice": "run `inv apply-patches --host h`", "retryable": False}
    text = shown({"run_id": "r", "state": FAILED, "attempts": [{}], "heartbeat": {"phase": FAILED},
                  "last_failure": failure})
    assert "api-drift" in text and "callee: SchedulerConfig" in text and "inv apply-patches --host h" in text
    assert "not restarted: it would repeat" in text


def test_server_mode_shows_samples_per_second_and_the_servers_state_at_80_columns():
    """Server mode's heartbeat (written by its supervisor): samples/s, not tokens/s, and the server."""
    run = {"run_id": "20261130-120018-ghhd", "state": RUNNING, "attempts": [{}, {}],
           "heartbeat": {"phase": "generating", "samples_done": 53, "samples_total": 189, "samples_per_s": 4.94,
                         "tokens_per_s": None, "eta_s": 27.5, "server": "ready"}}
    progress, bar = samples_bar()
    console = Console(record=True, width=80)
    console.print(render(run, "", progress, bar))
    text = console.export_text()
    assert "phase generating" in text and "attempt 2" in text and "server ready" in text
    assert "53/189" in text and "4.94 samples/s" in text and "ETA 0m27s" in text
    assert max(len(line) for line in text.splitlines()) <= 80
