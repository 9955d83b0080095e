"""The training workload's reading of speculators' trainer, on real output: the metric records and the
out-of-memory error of the H200 run (benchmarks/gpu/results/train-h200-2026-12-03.json), the log lines of
speculators 0.9's trainer.py; and its checkpoints' directories as that trainer leaves them."""
from __future__ import annotations

import json
import os

from dataset import command
from run import classify
from run.training import plan, progress
from run.training.workload import RULES_FILE, seq_len_that_fits
from support.paths import REPO

H200 = json.loads((REPO / "benchmarks/gpu/results/train-h200-2026-12-03.json").read_text())["train"]


def test_the_metric_records_of_a_real_run_give_step_loss_accuracy_and_rate():
    log = progress.TrainerLog()
    # The results kept each record's first 500 characters: its whole pairs, then the end every record has (the
    # step's time, its epoch, its step). rich wraps a record over lines between its pairs.
    records = []
    for step, line in enumerate(H200["training"]["metric_lines"][:4]):
        whole = line[:line.rindex(", ")].replace(", profile/", ",\n      profile/")
        records.append(f"{whole}, profile/step_ms=300.0, profile/tokens_per_s=6.7e+03, epoch=0, lr=1.00e-03, "
                       f"global_step={step}")
    log.feed("Training epoch 1/1 started\n" + "\n".join(records) + "\n")
    fields = log.fields(total_steps=8)
    assert log.steps_seen == 4 and fields["global_step"] == 4 and fields["epochs"] == 1
    assert fields["loss"] == H200["training"]["losses"][15] and fields["accuracy"]["full_acc_0"] == 0.0
    assert fields["step_s"] == 0.3 and fields["eta_s"] == round(4 * 0.3) and fields["tokens_per_s"] == 6700.0


def test_a_mid_epoch_resume_places_the_step_within_its_epoch_and_its_end_counts_the_epochs_steps():
    log = progress.TrainerLog()
    log.feed("Resuming mid-epoch from epoch=2 local_step=30 global_step=110.\n"
             "train/loss=4.1, epoch=2, lr=1e-3, global_step=110\n")
    assert log.resumed_from == {"epoch": 2, "local_step": 30, "global_step": 110}
    assert (log.epoch, log.local_step, log.steps_per_epoch, log.global_step) == (2, 31, None, 111)
    log.feed("train/loss=4.0, epoch=2, lr=1e-3, global_step=111\nTraining epoch 3/5 completed\n")
    assert (log.local_step, log.steps_per_epoch, log.global_step) == (32, 32, 112)


def test_the_oom_of_the_h200_run_names_the_length_that_trained_there():
    error = H200["attempts"][1]["error"]
    assert seq_len_that_fits(error, 8192) == 2048
    assert seq_len_that_fits("RuntimeError: something else", 8192) is None


def test_a_stop_checkpoint_is_adopted_at_its_step_and_a_cut_save_is_set_aside(tmp_path):
    save = tmp_path / "draft"
    (save / "0").mkdir(parents=True)
    (save / "0" / progress.STATE_FILE).write_text(json.dumps({"epoch": 0, "local_step": 20, "global_step": 20}))
    (save / "1").mkdir()  # a save cut short: weights, no training_state.json
    (save / progress.INTERRUPTED).mkdir()
    (save / progress.INTERRUPTED / "model.safetensors").write_bytes(b"weights")
    assert progress.set_aside_incomplete(str(save)) == [str(save / "1") + ".incomplete"]
    log = progress.TrainerLog()
    log.feed("train/loss=4.0, epoch=0, global_step=0\ntrain/loss=3.9, epoch=0, global_step=33\n")
    adopted = progress.adopt_interrupted(str(save), log)
    assert adopted["global_step"] == 34 and not (save / progress.INTERRUPTED).exists()
    assert (save / "0" / "model.safetensors").exists()
    assert progress.last_checkpoint(str(save))["global_step"] == 34
    assert sorted(os.listdir(save)) == ["0", "1.incomplete"]


def test_the_checkpoint_interval_is_the_steps_of_the_bound_at_the_measured_rate():
    planned = plan.checkpoint_plan(bound_s=900, steps_per_epoch=10000, seq_len=8192)
    assert planned["basis"] == "planned" and planned["every_steps"] == int(900 // (8192 / plan.PLANNING_TOKENS_PER_S))
    measured = plan.checkpoint_plan(bound_s=900, steps_per_epoch=10000, seq_len=8192, step_s=0.3)
    assert (measured["every_steps"], measured["freq"], measured["basis"]) == (3000, 0.3, "measured")
    whole = plan.checkpoint_plan(bound_s=900, steps_per_epoch=100, seq_len=8192, step_s=0.3)
    assert whole["freq"] == 30.0 and whole["every_steps"] == 3000
    env, words = plan.words_and_env(["env", "TORCHDYNAMO_DISABLE=1", "speculators", "train", "--epochs", "3"])
    assert env == {"TORCHDYNAMO_DISABLE": "1"} and command.option(words, "--epochs") == "3"
    argv = plan.trainer_argv(python="/v/bin/python", words=words, gpus=8)
    assert argv[:8] == ["/v/bin/python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8", "-m",
                        "speculators.train"]
    assert plan.trainer_argv(python="/v/bin/python", words=words, gpus=1)[:4] == ["/v/bin/python", "-m",
                                                                                "speculators", "train"]


def test_the_h200_runs_real_failures_are_named_with_their_fix_and_not_restarted():
    """Each attempt's last line as the H200 run kept it (torch 2.11, speculators 0.9), within a log's traceback."""
    rules = classify.load_rules(RULES_FILE)
    compiled, eager = (H200["attempts"][0]["error"], H200["attempts"][1]["error"])
    for error, kind, fix in ((compiled, "torch-compile", "--no-compile"), (eager, "train-out-of-memory",
                                                                           "--total-seq-len")):
        log = f"Traceback (most recent call last):\n  File \"trainer.py\", line 1, in run\n{error}\n"
        failure = classify.classify(log, 1, subject="the trainer", rules=rules)
        assert failure["kind"] == kind and not failure["retryable"] and fix in failure["advice"], failure
    killed = classify.classify("", -9, subject="the trainer", rules=rules)
    assert killed["kind"] == "killed" and killed["retryable"] and "last checkpoint" in killed["advice"], killed


def test_the_h100s_out_of_memory_that_hung_is_named_with_the_length_that_trained_there():
    """The trainer printed its out-of-memory error and hung (tests/fixtures/training/README.md): the stall's log,
    classified by the training's rules, is that error, not a stall; its figures (rich wrapped them over lines)
    name 2048, at which the same H100 trained at 0.29 s a step."""
    text = (REPO / "tests/fixtures/training/h100-oom-then-hung.log").read_text()
    failure = classify.classify(text, 0, subject="the trainer", rules=classify.load_rules(RULES_FILE))
    assert failure["kind"] == "train-out-of-memory" and not failure["retryable"], failure
    assert seq_len_that_fits(text, 8192) == 2048


def test_inv_status_shows_the_h100_trainings_progress_in_80_columns(capsys):
    """The real status of the H100's training run (tests/fixtures/training/README.md), as `inv status --run` shows it."""
    from specrig.run.view import show_run
    from specrig.ui import console

    status = json.loads((REPO / "tests/fixtures/training/h100-train-status.json").read_text())
    width = console.width
    console.width = 80
    try:
        show_run(dict(status, run_id="20261206-123932-6c74", kind="train"))
    finally:
        console.width = width
    shown = capsys.readouterr().out
    assert max(len(line.rstrip()) for line in shown.splitlines()) <= 80, shown
    flat = " ".join(shown.split())
    for said in ("epoch 2/3", "94/1713 in all", "loss 3.726", "acc@1 0.00", "2,350 tok/s", "16.8 GiB",
                 "last checkpoint: epoch 1, its end", "a checkpoint every 83 steps", "0.29 s/step",
                 "killed (train-killed-sigkill)"):
        assert said in flat, (said, shown)
    assert "samples" not in shown


def test_a_stop_deep_into_an_epoch_is_placed_from_the_status_where_the_logs_tail_begins_mid_epoch():
    """The log's tail holds the epoch's last steps only: where the epoch began comes from the run's status."""
    log = progress.TrainerLog.continuing({"epoch": 1, "step": 500, "global_step": 1400})
    log.feed("".join(f"train/loss=3.0, epoch=1, lr=1e-3, global_step={step}\n" for step in range(1405, 1410)))
    assert (log.epoch, log.local_step, log.global_step) == (1, 510, 1410)
