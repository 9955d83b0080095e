"""The training workload: speculators' trainer, one process (or torchrun's) per attempt, in a session of its own,
its output in driver.log; the supervisor's loop (run/supervisor_loop.py) runs, watches and restarts it (stdlib
only).

Each attempt resumes from the last checkpoint through the trainer's own resume (it loads the newest
<save_path>/<epoch>/, mid-epoch from its training_state.json). Before it starts:

- a checkpoint whose save was cut short (no training_state.json, which the trainer writes last) is set aside as
  <epoch>.incomplete: the trainer would load the newest numbered directory, whole or not;
- a stop's checkpoint (<save_path>/interrupted/, saved on SIGTERM) is adopted: the trainer does not resume
  from it by itself (progress.adopt_interrupted);
- the checkpoint frequency is planned again from the step rate measured so far (plan.checkpoint_plan).

The watch reads the log as it grows (progress.TrainerLog): a new step is progress, and the steps' pace bounds
a stall as samples' pace does; the trainer's start (the draft built, the data loaders, the first step) has the
load bound; a validation or a checkpoint's save, the stall bound. A failed attempt is classified with the
training's own rules (rules.json); out of GPU memory names the --total-seq-len that fits by the error's figures.
"""
import math
import os
import re
import time

from base import atomic
from base.contract import PHASE_CHECKPOINTING, PHASE_STARTING, PHASE_TRAINING, PHASE_VALIDATING
from run import classify
from run.attempt import POLL_S, Watch, child_env, log_since, start_job
from run.training import plan, progress

RULES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules.json")
#: The training's rules, read once for the supervisor's life (run/classify.py's table format).
RULES = classify.load_rules(RULES_FILE)
#: Seconds between looks at the save path's checkpoints.
CHECKPOINTS_EVERY_S = 5.0
VALIDATION = re.compile(r"Validation epoch \d+/\d+ started")
SAVING = re.compile(r"Saving checkpoint to ")
#: torch's out-of-memory message: what was asked for, the GPU's capacity and what was free, and what PyTorch held.
OOM_FIGURES = re.compile(r"Tried\s+to\s+allocate\s+(?P<ask>[\d.]+)\s+(?P<ask_unit>[MG]iB)\.\s+GPU\s+\d+\s+has\s+a\s+total"
                         r"\s+capacity\s+of\s+(?P<total>[\d.]+)\s+(?P<total_unit>[MG]iB)\s+of\s+which\s+(?P<free>[\d.]+)"
                         r"\s+(?P<free_unit>[MG]iB)\s+is\s+free\..*?(?P<held>[\d.]+)\s+(?P<held_unit>[MG]iB)\s+is\s+allocated"
                         r"\s+by\s+PyTorch", re.S)


class Trainer:
    """The workload of a training run (run.json "train", run/training/launch.py)."""
    STARTS = "starting the trainer"
    FINISHED = "the trainer finished"
    SAMPLE_FILE = None

    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.plan = supervisor.record["train"]
        self.save_path = self.plan["save_path"]
        self.log = supervisor.run.file("driver.log")
        self.log_offset = self.read_offset = 0
        self.proc = self.job = None
        self.reader = progress.TrainerLog()
        self.checkpoint_before = None

    def status_fields(self, previous):
        return {"training": previous.get("training"),
                "checkpoint_plan": previous.get("checkpoint_plan") or self.plan["checkpoint"]}

    def disk_use(self):
        # The next checkpoint (a new epoch's directory) must fit: one checkpoint's bytes, always one to come.
        return {"directories": [self.save_path], "file_bytes": self.plan.get("checkpoint_bytes"), "in_flight": 1,
                "remaining": lambda: 1}

    def prepare(self, entry):
        sup = self.supervisor
        self.log_offset = self.read_offset = os.path.getsize(self.log) if os.path.exists(self.log) else 0
        for path in progress.set_aside_incomplete(self.save_path):
            sup.log_marker("%s: a checkpoint whose save was cut short, set aside as %s" % (
                os.path.dirname(path), os.path.basename(path)))
        adopted = None
        if os.path.isdir(os.path.join(self.save_path, progress.INTERRUPTED)):
            # Only a stop's checkpoint needs the log read back, to say where the stopped trainer was: from where
            # this run's status last saw it, then the log's tail (its last steps, up to its end).
            stopped_at = progress.TrainerLog.continuing(sup.status.get("training"))
            stopped_at.feed(log_since(self.log, 0))
            adopted = progress.adopt_interrupted(self.save_path, stopped_at)
        if adopted:
            sup.log_marker("the stop's checkpoint adopted as epoch %(epoch)d, step %(local_step)d (global step "
                           "%(global_step)d): the trainer resumes from it" % adopted)
        self.checkpoint_before = progress.last_checkpoint(self.save_path)
        measured = sup.status.get("training") or {}
        self.reader = progress.TrainerLog()
        self.reader.steps_per_epoch = measured.get("steps_per_epoch")  # an epoch's steps, once one has ended
        checkpoint = plan.checkpoint_plan(
            bound_s=self.plan["checkpoint"]["bound_s"], seq_len=self.plan["total_seq_len"],
            steps_per_epoch=measured.get("steps_per_epoch") or self.plan["steps_per_epoch"],
            step_s=measured.get("step_s"), measured_steps=bool(measured.get("steps_per_epoch")))
        entry["checkpoint_plan"] = checkpoint
        sup.status["checkpoint_plan"] = checkpoint

    def run(self, entry):
        sup = self.supervisor
        words = self.plan["words"] + ["--checkpoint-freq", repr(entry["checkpoint_plan"]["freq"])]
        argv = plan.trainer_argv(python=sup.record["python"], words=words, gpus=self.plan["gpus"])
        self.proc, self.job = start_job(sup, entry, argv, self.log, child_env(**self.plan["env"]))
        return self.watch()

    def watch(self):
        """Follow the trainer until it exits; (exit status, its failure classified, or a stall, or None)."""
        sup = self.supervisor
        # A trainer that ran out of memory may hang rather than exit (seen on an H100: its data loader's workers
        # outlive the error): the idle rule ends it, and the training's rules name the cause.
        clock = Watch(sup, self.log, self.log_offset, processes=self.job.members,
                      classify_log=lambda text: self.classified(0, text))
        phase, looked = None, 0.0
        checkpoint = self.checkpoint_before
        while True:
            exit_status = self.proc.poll()
            pids = {m["pid"] for m in self.job.members()}
            sup.status["job_seen"] = self.job.saved()
            text = self.read_new()
            steps_before = self.reader.global_step
            self.reader.feed(text)
            if time.monotonic() - looked > CHECKPOINTS_EVERY_S or exit_status is not None:
                looked = time.monotonic()
                newest = progress.last_checkpoint(self.save_path)
                if newest != checkpoint:
                    checkpoint = newest
                    clock.progress()
            now = self.phase(phase or PHASE_STARTING, text, stepped=self.reader.global_step != steps_before)
            if now != phase:
                # The phase `inv status` shows, as an extraction's driver writes its own.
                atomic.write_json(sup.run.file("heartbeat.json"), {"phase": now, "pid": self.proc.pid})
            phase = now
            clock.enter(phase)
            if phase == PHASE_TRAINING:
                clock.samples(self.reader.steps_seen)
            sup.status["training"] = dict(self.reader.fields(last_checkpoint=_shown(checkpoint),
                                                             total_steps=self.total_steps()),
                                          steps_per_epoch_planned=self.plan["steps_per_epoch"])
            if exit_status is not None:
                sup.save()
                return exit_status, (self.classified(exit_status) if exit_status else None)
            if sup.stop_requested():
                return None, None
            sup.look(pids)
            ceiling = sup.options["load_timeout_s" if phase == PHASE_STARTING else "stall_timeout_s"]
            stall = clock.check(clock.limit(ceiling), phase, {"phase": phase})
            if stall and (sup.options["stall_restart"] or not stall["retryable"]):
                return None, stall
            time.sleep(POLL_S)

    def total_steps(self):
        """The training's steps in all: the plan's estimate until an epoch has ended and said how many it has."""
        measured = self.reader.steps_per_epoch
        if not measured:
            return self.plan["total_steps"]
        total = measured * self.plan["epochs"]
        return min(total, self.plan["max_steps"]) if self.plan.get("max_steps") else total

    def read_new(self):
        """The log's whole lines written since the last read."""
        try:
            with open(self.log, "rb") as handle:
                handle.seek(self.read_offset)
                data = handle.read()
        except OSError:
            return ""
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        self.read_offset += end
        return data[:end].decode(errors="replace")

    def phase(self, phase, text, *, stepped):
        """The trainer's phase after the log's new `text`: a step trains, a validation or a save is its own."""
        if stepped:
            phase = PHASE_TRAINING
        if VALIDATION.search(text):
            phase = PHASE_VALIDATING
        if SAVING.search(text):
            phase = PHASE_CHECKPOINTING
        return phase

    def classified(self, exit_status, text=None):
        """The failed attempt's failure by the training's rules (its log, or `text`); out of memory with the
        --total-seq-len that fits."""
        text = self.attempt_log() if text is None else text
        failure = classify.classify(text, exit_status, host=self.supervisor.host(), subject="the trainer",
                                    rules=RULES)
        if failure["kind"] == "train-out-of-memory":
            fits = seq_len_that_fits(text, self.plan["total_seq_len"])
            if fits:
                failure["advice"] = ("launch again with --total-seq-len %d (it ran out at %d; by the error's figures "
                                     "%d fits), or train on more GPUs with --gpus" % (fits, self.plan["total_seq_len"],
                                                                                     fits))
                failure["fits_total_seq_len"] = fits
        return failure

    def end(self):
        ended = self.supervisor.end_job(self.proc, self.job)
        newest = progress.last_checkpoint(self.save_path)
        # A failure that repeats without a new checkpoint is not restarted again (supervisor_loop.judge).
        ended["checkpoints_written"] = int(newest is not None and newest != self.checkpoint_before)
        ended["last_checkpoint"] = _shown(newest)
        return ended

    def attempt_log(self):
        return log_since(self.log, self.log_offset)

    def ran_low(self):
        # The save the disk cut short is set aside before the next attempt (prepare): nothing to do now.
        pass

    def finish(self, outcome):
        best = os.path.join(self.save_path, "checkpoint_best")
        newest = progress.last_checkpoint(self.save_path)
        outcome["draft"] = os.path.realpath(best) if os.path.isdir(best) else newest and newest["path"]
        return outcome


def _shown(checkpoint):
    """A checkpoint as status.json shows it (its time as an ISO string)."""
    if checkpoint is None:
        return None
    return dict(checkpoint, at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(checkpoint["at"])))


def _mib(value, unit):
    return float(value) * (1024 if unit == "GiB" else 1)


def seq_len_that_fits(log_text, seq_len):
    """The --total-seq-len under `seq_len` that the out-of-memory error's figures leave room for, or None
    without them. What PyTorch held plus what it asked for is taken to scale with the tokens of a step, and
    held plus free is what it may have; the allocation that failed is not a step's last (the fused loss's
    logits come later), so half of that share, as a power of two: on one H200 the 8B shape's draft ran out
    at 8192 (119.64 GiB held, 24 GiB asked, 12.90 GiB free) and this gives 2048, which trained."""
    figures = list(OOM_FIGURES.finditer(log_text))
    if not figures:
        return None
    found = figures[-1]
    ask, held = _mib(found["ask"], found["ask_unit"]), _mib(found["held"], found["held_unit"])
    free = _mib(found["free"], found["free_unit"])
    if held + ask <= 0:
        return None
    room = seq_len * (held + free) / (held + ask) / 2
    fits = 2 ** int(math.floor(math.log2(room))) if room >= 1 else 0
    return fits if 0 < fits < seq_len else None
