"""A training's plan (run.json "train"), made from the dataset's verdict and the launch's options, and the
checkpoint frequency each attempt of it runs with (stdlib only).

The trainer's command is the one `inv verify-dataset` wrote (dataset/verify.py's verdict file, beside the
states), with the launch's options after it: --epochs, --max-steps, --total-seq-len, --save-path, and a
--log-dir in the run. speculators parses flags last-wins, so an option given here replaces the command's.

**The checkpoint frequency.** speculators saves a checkpoint every `--checkpoint-freq` of an epoch (a
fraction below 1: every round(steps_per_epoch x freq) steps). A crash loses the steps since the last one, so
the interval is chosen as the steps taken in `bound_s` (`inv train --checkpoint-minutes`, default 15):
`bound_s / step_s`. The step's seconds are the run's own, measured by an earlier attempt (the median of its
last steps, status.json "training"), or before any, PLANNING_TOKENS_PER_S per GPU: a slow rate, so that the
first attempt checkpoints more often than it needs (fewer steps between two) rather than less. Every attempt
plans it again.
"""
import json
import math
import os

#: The step rate a first attempt plans with, in tokens per second per GPU: below what a draft trains at on a
#: data-center GPU (the 8B shape's, at 2048 tokens a step on one H200: about 6,800; docs/training.md), so that
#: the first attempt's checkpoints come early, not late.
PLANNING_TOKENS_PER_S = 2000.0
#: speculators' default --total-seq-len (its TrainConfig), the tokens packed into one step per GPU.
DEFAULT_SEQ_LEN = 8192
DEFAULT_EPOCHS = 20
#: speculators' default share of the rows it trains on (--train-data-ratio); the rest validate.
TRAIN_RATIO = 0.9
#: Bytes a checkpoint holds per parameter of the draft: its weights in bf16 (2), and for each trained one the
#: optimizer's two moments, saved in bf16 (4) (speculators/train/checkpointer.py SingleGPUCheckpointer).
WEIGHT_BYTES, MOMENT_BYTES = 2, 4
#: The trainer's own environment: rich's log handler wraps a record at the terminal's width, and pads each line
#: to it, so the log is given a width that holds most records on a few lines without padding them far.
TRAINER_ENV = {"COLUMNS": "240"}


def words_and_env(command):
    """The verdict's command split into ({NAME: VALUE} of its leading `env`, the trainer's words)."""
    words, env = list(command), {}
    if words and words[0] == "env":
        words.pop(0)
        while words and "=" in words[0] and not words[0].startswith("-"):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
    return env, words


def trainer_argv(*, python, words, gpus):
    """The argv that runs the trainer's words (["speculators", "train", ...]) on `python`, by module rather than
    by console script (an environment installed with `pip --target` has its scripts elsewhere): speculators'
    own command, or torchrun's (torch.distributed.run) over the host's GPUs with speculators.train, which takes
    the same flags."""
    args = words[2:] if words[:2] == ["speculators", "train"] else words
    if gpus > 1:
        return [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus), "-m",
                "speculators.train"] + args
    return [python, "-m", "speculators", "train"] + args


def steps_per_epoch(*, tokens, seq_len, gpus):
    """The optimizer steps of one epoch, estimated: the training share of the tokens packed seq_len to a step,
    the steps spread over the GPUs (data parallel)."""
    return max(1, math.ceil(tokens * TRAIN_RATIO / seq_len / max(1, gpus)))


def checkpoint_plan(*, bound_s, steps_per_epoch, step_s=None, seq_len, measured_steps=False):
    """{"freq" (speculators' --checkpoint-freq), "every_steps", "bound_s", "step_s", "basis"}: a checkpoint every
    `bound_s` of steps, at the measured `step_s` (basis "measured") or the planning rate (basis "planned")."""
    basis = "measured" if step_s else "planned"
    step_s = step_s or seq_len / PLANNING_TOKENS_PER_S
    every = max(1, int(bound_s // step_s))
    if every >= steps_per_epoch:
        # Whole epochs: speculators takes an integer above 1 as a count of epochs.
        epochs = max(1, every // steps_per_epoch)
        return {"freq": float(epochs), "every_steps": epochs * steps_per_epoch, "bound_s": bound_s,
                "step_s": round(step_s, 4), "basis": basis, "steps_per_epoch": steps_per_epoch,
                "steps_per_epoch_known": measured_steps}
    freq = every / steps_per_epoch
    return {"freq": round(freq, 6), "every_steps": every, "bound_s": bound_s, "step_s": round(step_s, 4),
            "basis": basis, "steps_per_epoch": steps_per_epoch, "steps_per_epoch_known": measured_steps}


def draft_parameters(model_dir, *, draft_vocab=None):
    """(all, trained) parameters of speculators' EAGLE-3 draft for the verifier in `model_dir`, from its
    config.json: one decoder layer over 2 x hidden inputs, the fc over the 3 target layers, the draft's lm_head,
    and the verifier's embeddings and lm_head it holds frozen. None when the config cannot be read."""
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    config = config.get("text_config") or config
    try:
        hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        intermediate = int(config.get("intermediate_size") or 4 * hidden)
    except (KeyError, TypeError, ValueError):
        return None
    draft_vocab = draft_vocab or vocab
    layer = 2 * hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * intermediate
    trained = 3 * hidden * hidden + layer + draft_vocab * hidden
    return trained + 2 * vocab * hidden, trained


def checkpoint_bytes(model_dir, *, draft_vocab=None):
    """A checkpoint's bytes, estimated from the draft's parameters (WEIGHT_BYTES, MOMENT_BYTES); None unknown."""
    counted = draft_parameters(model_dir, draft_vocab=draft_vocab)
    if counted is None:
        return None
    total, trained = counted
    return total * WEIGHT_BYTES + trained * MOMENT_BYTES
