"""What speculators' trainer has done, read from its log and its checkpoints (stdlib only).

The log (the run's driver.log, every attempt) is read as it grows, from where the last read stopped:

- a metric record, one per optimizer step, through rich's logging handler as `key=value` pairs
  (speculators/train/logger.py FormatDictFilter; the trainer's `train`, `profile`, `epoch`, `lr` and
  `global_step`, flattened: "train/loss_0=1.637, train/full_acc_0=0.00e+00, ..., profile/step_ms=153.2,
  profile/tokens_per_s=1.3e+04, ..., epoch=0, lr=1.00e-03, global_step=3"); rich may wrap a record over
  lines, never inside a pair, and `global_step` ends a step's record;
- "Training epoch 2/20 started": the epochs; "... completed": the steps an epoch has (its last step's local
  step; speculators 0.9's bar is tqdm.rich's, which draws nothing into a file);
- "Resuming mid-epoch from epoch=E local_step=S global_step=G." / "Resuming training on epoch E.": where a
  restarted trainer went on from (speculators/train/trainer.py setup_trainer).

A checkpoint is a directory <save_path>/<epoch>/ whose training_state.json (epoch, local_step, global_step;
local_step 0: the epoch's end) the trainer writes after the weights and the optimizer's state; a stop's
checkpoint is <save_path>/interrupted/, which the trainer does not resume from by itself (adopt_interrupted).
"""
import json
import os
import re
import shutil
import statistics

#: A `key=value` pair of a metric record. Keys are paths ("train/loss_0", "profile/memory_mb/fwd").
PAIR = re.compile(r"(?<![\w/])([A-Za-z_][\w/]*)=([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)|'[^']*')")
EPOCHS = re.compile(r"Training epoch (\d+)/(\d+) started")
COMPLETED = re.compile(r"Training epoch (\d+)/(\d+) completed")
RESUMED_MID = re.compile(r"Resuming mid-epoch from epoch=(\d+) local_step=(\d+) global_step=(\d+)")
RESUMED_EPOCH = re.compile(r"Resuming training on epoch (\d+)\.")
#: The trainer's own accuracy figures, position by position: full (every earlier position right too) and cond.
ACCURACY = re.compile(r"train/((?:full|cond)_acc_\d+)$")
INTERRUPTED = "interrupted"
STATE_FILE = "training_state.json"
#: Steps whose times the step rate is the median of.
RATE_WINDOW = 50


class TrainerLog:
    """The trainer's progress, from its log read piece by piece (`feed`); `fields()` is status.json's
    "training"."""

    def __init__(self):
        self.pending = {}
        self.step_ms = []
        self.last = {}
        self.epoch = self.epochs = self.local_step = self.steps_per_epoch = None
        self.global_step = None
        self.resumed_from = None
        #: The global step at which the current epoch's first step was taken: the local step of a later record.
        self.epoch_start = None
        self.steps_seen = 0

    @classmethod
    def continuing(cls, shown):
        """A reader that goes on from where status.json's "training" (`shown`) saw the trainer: its epoch, and the
        step that epoch began at. A log read from its tail alone (run/attempt.py log_since) may not reach back to
        the epoch's first step, from which a record's local step is counted."""
        log = cls()
        if shown and shown.get("epoch") is not None and shown.get("step") and shown.get("global_step") is not None:
            log.epoch, log.epoch_start = shown["epoch"], shown["global_step"] - shown["step"]
        return log

    def feed(self, text):
        """Read a new piece of the log (whole lines: the caller keeps a partial last line for the next)."""
        for line in re.split(r"[\r\n]+", text):
            self._line(line)

    def _line(self, line):
        found = EPOCHS.search(line)
        if found:
            self.epochs = int(found.group(2))
        found = RESUMED_MID.search(line)
        if found:
            epoch, local, step = (int(value) for value in found.groups())
            self.resumed_from = {"epoch": epoch, "local_step": local, "global_step": step}
            self.epoch, self.epoch_start = epoch, step - local
        found = RESUMED_EPOCH.search(line)
        if found:
            self.resumed_from = {"epoch": int(found.group(1)), "local_step": 0, "global_step": None}
        if COMPLETED.search(line) and self.local_step:
            self.steps_per_epoch = self.local_step
        for key, value in PAIR.findall(line):
            self.pending[key] = value
            if key == "global_step":
                self._record(self.pending)
                self.pending = {}
            elif key == "epoch" and any(name.startswith("val/") for name in self.pending):
                self.last.update({name: value for name, value in self.pending.items() if name.startswith("val/")})
                self.pending = {}

    def _record(self, pairs):
        """One step's record: the step it was (global_step counts from 0, so step global_step + 1 is done)."""
        if not any(name.startswith("train/") for name in pairs):
            return
        step = int(float(pairs["global_step"]))
        epoch = int(float(pairs.get("epoch", self.epoch or 0)))
        if epoch != self.epoch or self.epoch_start is None:
            self.epoch, self.epoch_start = epoch, step
        self.global_step = step + 1
        self.local_step = step - self.epoch_start + 1
        self.steps_seen += 1
        self.last.update({name: value for name, value in pairs.items() if name.startswith(("train/", "profile/"))})
        if "profile/step_ms" in pairs:
            self.step_ms = (self.step_ms + [_number(pairs["profile/step_ms"])])[-RATE_WINDOW:]

    def step_s(self):
        """The median seconds of a step over the last steps, or None before one was timed."""
        return statistics.median(self.step_ms) / 1000 if self.step_ms else None

    def fields(self, *, last_checkpoint=None, total_steps=None):
        """status.json's "training": where the trainer is, its figures and its last checkpoint; the ETA from
        the step rate and `total_steps` (the run's steps in all) when both are known."""
        step_s = self.step_s()
        eta = None
        if step_s and total_steps and self.global_step is not None:
            eta = round(max(0, total_steps - self.global_step) * step_s)
        memory = [_number(value) for key, value in self.last.items() if key.startswith("profile/memory_mb/")]
        return {
            "epoch": self.epoch, "epochs": self.epochs, "step": self.local_step,
            "steps_per_epoch": self.steps_per_epoch, "global_step": self.global_step, "total_steps": total_steps,
            "loss": _number(self.last.get("train/loss")), "val_loss": _number(self.last.get("val/loss_epoch")),
            "accuracy": {found.group(1): _number(value) for key, value in sorted(self.last.items())
                         for found in [ACCURACY.match(key)] if found},
            "tokens_per_s": _number(self.last.get("profile/tokens_per_s")),
            "step_s": round(step_s, 4) if step_s else None, "eta_s": eta,
            "memory_mib": round(max(memory)) if memory else None,
            "last_checkpoint": last_checkpoint, "resumed_from": self.resumed_from,
        }


def _number(value):
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def checkpoints(save_path):
    """The trainer's whole checkpoints under `save_path`, oldest progress first: {"epoch", "local_step",
    "global_step", "path", "at" (its state file's mtime)} each. A directory without its state file is a save
    cut short, or the epoch's end written by a trainer before training_state.json: the latter counts, at its
    config.json's time."""
    found = []
    try:
        names = os.listdir(save_path)
    except OSError:
        return []
    for name in names:
        path = os.path.join(save_path, name)
        if not name.isdigit() or os.path.islink(path) or not os.path.isdir(path):
            continue
        state = _state(path)
        if state is None:
            continue
        found.append(dict(state, path=path))
    return sorted(found, key=lambda c: (c["epoch"], c["local_step"] == 0, c["local_step"]))


def _state(path):
    try:
        with open(os.path.join(path, STATE_FILE), encoding="utf-8") as handle:
            state = json.load(handle)
        at = os.path.getmtime(os.path.join(path, STATE_FILE))
    except (OSError, ValueError):
        return None
    return {"epoch": int(state.get("epoch", 0)), "local_step": int(state.get("local_step", 0)),
            "global_step": state.get("global_step"), "at": at}


def last_checkpoint(save_path):
    found = checkpoints(save_path)
    return found[-1] if found else None


def adopt_interrupted(save_path, log):
    """A stop's checkpoint (<save_path>/interrupted/, saved on SIGTERM) made the one the trainer resumes from:
    moved to its epoch's directory with the training_state.json the trainer did not write for it, from where
    the log (`log`, a TrainerLog of the attempt that was stopped) says it was. Kept as it is when the log does
    not say, or when a numbered checkpoint is as far along; that one wins and the interrupted one is removed.
    The adopted checkpoint, or None."""
    interrupted = os.path.join(save_path, INTERRUPTED)
    if not os.path.isdir(interrupted) or log.global_step is None or log.epoch is None:
        return None
    newest = last_checkpoint(save_path)
    if newest is not None and (newest["global_step"] or 0) >= log.global_step:
        shutil.rmtree(interrupted, ignore_errors=True)
        return None
    target = os.path.join(save_path, str(log.epoch))
    aside = target + ".replaced"
    if os.path.isdir(target):
        os.rename(target, aside)
    os.rename(interrupted, target)
    state = {"epoch": log.epoch, "local_step": log.local_step, "global_step": log.global_step}
    with open(os.path.join(target, STATE_FILE), "w", encoding="utf-8") as handle:
        json.dump(state, handle)
    shutil.rmtree(aside, ignore_errors=True)
    return dict(state, path=target)


def set_aside_incomplete(save_path):
    """Checkpoint directories whose save was cut short (no training_state.json, written last), renamed to
    <epoch>.incomplete so that the trainer, which resumes from the newest numbered directory whole or not,
    passes over them; the new paths."""
    moved = []
    try:
        names = os.listdir(save_path)
    except OSError:
        return moved
    for name in names:
        path = os.path.join(save_path, name)
        if name.isdigit() and os.path.isdir(path) and not os.path.islink(path) and _state(path) is None:
            target = path + ".incomplete"
            shutil.rmtree(target, ignore_errors=True)
            os.rename(path, target)
            moved.append(target)
    return moved
