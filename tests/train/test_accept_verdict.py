"""The acceptance verdict's statistics and the untrained draft's command, on their own (no lab): the numbers are
the lab's measurement of docs/acceptance.md, the command file the one speculators 0.9 wrote there."""
from __future__ import annotations

import pytest

from dataset import command
from run.acceptance import draft, verdict

#: train_command.txt as speculators 0.9.0 wrote it for `python -m speculators train ... --dry-run` on the lab.
TRAIN_COMMAND = """# Timestamp: 2026-12-06T11:48:06.810403+00:00
# Git SHA: unknown
# World size: 1
# speculators: 0.9.0
/home/specrig/venv-spec-0.9/lib/python3.11/site-packages/speculators/__main__.py --verifier-name-or-path \
/home/specrig/models/tiny-llama --data-path /data/prepared --hidden-states-path /data/states \
--target-layer-ids 2 4 7 --save-path /data/draft --from-pretrained=/data/init --seed 7
"""


def measured(accepted, drafts, k=3):
    return verdict.summary({"draft": "/d", "num_drafts": drafts, "num_draft_tokens": drafts * k,
                            "num_accepted_tokens": sum(accepted), "accepted_per_position": accepted,
                            "prompts": 8, "generated_tokens": 256, "k": k})


def test_wilson_bounds():
    assert verdict.wilson(0, 0) == (0.0, 1.0)
    low, high = verdict.wilson(49, 132)
    assert (low, high) == pytest.approx((0.2935, 0.4562), abs=1e-4)
    assert verdict.wilson(0, 248)[0] == 0.0 and round(verdict.wilson(0, 248)[1], 3) == 0.015


def test_a_draft_is_better_only_when_the_bounds_part():
    trained, untrained = measured([49, 36, 36], 132), measured([0, 0, 0], 248)
    assert trained["mean_acceptance_length"] == pytest.approx(1 + 121 / 132, abs=1e-4)
    assert trained["acceptance_per_position"] == [0.3712, 0.2727, 0.2727]
    assert verdict.judge(trained, untrained, compared=True)["better"] is True
    close = measured([2, 0, 0], 60)  # 3% against 0%: 60 drafts cannot tell them apart
    found = verdict.judge(close, measured([0, 0, 0], 60), compared=True)
    assert found["better"] is False and "not clearly better" in found["reason"]
    assert verdict.judge(trained, None, compared=False)["better"] is False
    assert verdict.judge(trained, None, compared=True) is None  # the untrained draft not measured yet
    assert verdict.judge(measured([0, 0, 0], 0), untrained, compared=True)["better"] is False


def test_the_untrained_draft_is_the_training_command_with_dry_run(tmp_path):
    (tmp_path / "train_command.txt").write_text(TRAIN_COMMAND)
    epoch = tmp_path / "0"
    epoch.mkdir()
    args = draft.training_args(str(epoch))  # a checkpoint of an epoch: the command is one directory up
    assert command.option(args, "--hidden-states-path") == "/data/states"
    argv = draft.untrained_argv("/py", args, "/run/untrained")
    assert argv[:4] == ["/py", "-m", "speculators", "train"]
    assert argv[-3:] == ["--dry-run", "--save-path", "/run/untrained"]
    assert "/data/draft" not in argv and not any(word.startswith("--from-pretrained") for word in argv)
    assert argv[argv.index("--target-layer-ids"):argv.index("--target-layer-ids") + 4] == \
        ["--target-layer-ids", "2", "4", "7"]
    assert draft.training_args(str(tmp_path / "nowhere" / "0")) is None
