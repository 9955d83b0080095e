"""Issue 36, point 4, on the GPU: specrig's own `inv train` killed and resumed, then `inv accept` of the trained
draft against an untrained one, on the 8B shape (vLLM 0.26, speculators 0.9). Two phases of device_run.py:

    trainrun   a short extraction of N_TRAIN rows (train_step._short_extraction, of a file holding only the
               data's first N_TRAIN rows, so that the held-out prompts are the data's rows from N_TRAIN on
               whatever prepare-data's sampling), `inv verify-dataset --run RUN --json`, `inv train --run RUN
               --detach --json --epochs TRAIN_EPOCHS --total-seq-len 2048 --checkpoint-minutes
               CHECKPOINT_MINUTES`; `inv status` polled until the trainer has written a checkpoint and taken
               MORE_STEPS steps after it; `kill -9` of the trainer (status `driver_pid`); the supervisor's
               restart seen (an attempt more) and the step it resumed from (status `training.resumed_from`,
               and the log's "Resuming mid-epoch from epoch=E local_step=S global_step=G"); once it has taken
               MORE_STEPS steps, `inv stop` (the trainer saves on SIGTERM) and `inv resume --detach`; waited
               to its end.
    accept     `inv accept --draft DRAFT --untrained auto --prompts DATA --first-row N_TRAIN --num-prompts
               ACCEPT_PROMPTS --max-tokens ACCEPT_TOKENS --json`: the per-position acceptance of both drafts,
               the mean acceptance length, prompts and tokens, the verdict, the seconds. DRAFT is the train
               run's last epoch directory (<save_path>/<E-1>), else checkpoint_best, else the newest
               directory with weights. A draft trained on token-shifted states (the control) is not run: a
               fourth trainer start and a third engine start do not fit the two calls; the results say so.

The calls: `device.sh prep trainrun`, then `device.sh trainrun accept` (BUDGET_S=570 each). `trainrun` is
resumable: each step done is in $SG/results.json, which the next call reads back, so the second call picks up
where the first stopped (most likely waiting for the resumed trainer's last epoch: the trainer runs in its own
session and goes on between the calls). With `accept` after it, its waits leave ACCEPT_RESERVE_S; a trainer
still running then is stopped (`inv stop`, its checkpoint saved) and said so (`finished` false).

**The budget** (estimates from the H200's calls, docs/gpu.md; the card may be an H100). Call 1: prep 10-20 s
(the model built in stage.sh's background), the extraction 175-200 s (the 64-row one took 175 s, nearly all
vLLM's start), verify-dataset (no --full) 15 s, the first trainer start (the 4-step call took 105.7 s, nearly
all start-up) to a checkpoint 60-90 s + 0.4 min, the kill, the supervisor's back-off and restart 70-100 s,
stop 10 s, resume's start 60-90 s: 450-520 s, so the resumed trainer's end usually falls in call 2. Call 2:
the rest of the training (2 epochs of about 80 packed 2048-token batches at an estimated 0.3-0.6 s a step,
each epoch's validation and checkpoint: 60-150 s in all), then `inv accept`: two vLLM engine starts of the 8B
target with a draft (60-120 s each) and 64 prompts x 128 tokens per draft (seconds): 200-300 s.

**Will the draft learn?** The target has random weights (gpu_tools.build_model) and the data is pseudo-words:
the text has no structure to learn. But the draft is trained against the target's own next-token
distribution (the stored last layer's states give the targets: verify-dataset refuses files whose last slot
is not the last layer), given the target's states of layers 2, 16 and 29. In a random pre-norm Llama the
residual stream sums every layer's output, so layer 29's states carry much of layer 32's, and the target's
next token is a deterministic function of what the draft sees: learnable without structure in the text.
The untrained draft (random fc and decoder layer) picks tokens unrelated to the target's: near 0 at position
0. Not known before the run: how far 2 epochs over 128 rows at speculators' default learning rate get, and
whether the target's greedy generation (its own tokens, possibly outside the 8 170 the data uses) stays where
the draft was trained. The results say it with numbers either way.

Environment: TRAINRUN_FRESH=1 (start trainrun over), DRAFT (accept's draft instead of trainrun's), N_TRAIN
(128 here), TRAIN_EPOCHS (2), CHECKPOINT_MINUTES (0.4), TOTAL_SEQ_LEN (2048), MORE_STEPS (1), ACCEPT_PROMPTS
(64), ACCEPT_TOKENS (128), ACCEPT_RESERVE_S (300). Results: `trainrun`, `accept` (issue36_summary.py).
"""
import glob
import itertools
import json
import os
import re
import signal
import time

import harness
import train_step

N_TRAIN = int(os.environ.get("N_TRAIN", "128"))
TRAIN_EPOCHS = int(os.environ.get("TRAIN_EPOCHS", "2"))
CHECKPOINT_MINUTES = os.environ.get("CHECKPOINT_MINUTES", "0.4")
TOTAL_SEQ_LEN = os.environ.get("TOTAL_SEQ_LEN", "2048")
MORE_STEPS = int(os.environ.get("MORE_STEPS", "1"))
ACCEPT_PROMPTS = int(os.environ.get("ACCEPT_PROMPTS", "64"))
ACCEPT_TOKENS = int(os.environ.get("ACCEPT_TOKENS", "128"))
ACCEPT_RESERVE_S = int(os.environ.get("ACCEPT_RESERVE_S", "300"))
#: Seconds between two `inv status` (each is a process of its own, about a second).
POLL_S = 3.0
#: A wait ends with this much of the budget left (harness.budget_left already keeps device.sh's margin).
END_MARGIN_S = 6
#: speculators' trainer on resuming (speculators/train/trainer.py, 0.9.0).
RESUMING = re.compile(r"Resuming mid-epoch from epoch=(\d+) local_step=(\d+) global_step=(\d+)")
RESUMING_EPOCH = re.compile(r"Resuming training on epoch (\d+)")
TOTAL_LOSS = re.compile(r"\btrain/loss=([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))")
KEY = "trainrun"


# -- the run, as `inv status` says it -------------------------------------------------------------------

def run_of(found, run_id):
    """The run object in what `inv status --run ID --json` printed ({"runs": [...]}, a list, or the run)."""
    if isinstance(found, dict) and isinstance(found.get("runs"), list):
        found = found["runs"]
    if isinstance(found, list):
        return next((item for item in found if isinstance(item, dict) and item.get("run_id") == run_id),
                    found[0] if found and isinstance(found[0], dict) else {})
    return found if isinstance(found, dict) else {}


def step_of(point):
    """global_step of a checkpoint or resume point ({"global_step": G, ...}), else None."""
    return point.get("global_step") if isinstance(point, dict) else None


class Watch:
    """`inv status` of one run, each answer kept short in `timeline` ([t, state, attempts, global_step, loss,
    last checkpoint's global_step, resumed_from's global_step, driver_pid]); `last` is the whole run object."""

    def __init__(self, entry, run_id):
        self.entry, self.run_id, self.last = entry, run_id, {}
        entry.setdefault("timeline", [])

    def poll(self):
        done = harness.inv("status", "--host", "local", "--run", self.run_id, "--json", timeout=120)
        self.last = run_of(done["json"] or {}, self.run_id) or self.last
        training = self.last.get("training") or {}
        step, point = progress(self.last)
        self.entry["timeline"].append([now(), self.last.get("state"), len(self.last.get("attempts") or []), step,
                                       training.get("loss"), step_of(point), step_of(training.get("resumed_from")),
                                       driver_pid(self.last)])
        return self.last

    def until(self, holds, timeout, reserve=0):
        """Poll until `holds(run)`; False at `timeout` or with less than `reserve` + END_MARGIN_S of the budget."""
        deadline = time.time() + timeout
        while True:
            run = self.poll()
            if holds(run):
                harness.save()
                return True
            left = harness.budget_left()
            if time.time() > deadline or (left is not None and left < reserve + END_MARGIN_S + POLL_S):
                harness.save()
                return False
            time.sleep(POLL_S)


def now():
    """Epoch seconds: the results span calls, each with its own harness.T0."""
    return round(time.time(), 1)


#: The train run's directory and save path, once launched: where progress() looks when the status is silent.
CONTEXT = {"path": None, "save_path": None}
GLOBAL_STEP = re.compile(r"\bglobal_step=(\d+)")


def disk_checkpoint(save_path):
    """The newest checkpoint on disk: its directory's training_state.json with the most global steps."""
    found = [dict(state, path=name) for name, state in (checkpoints(save_path) or {}).items()
             if isinstance(state, dict) and step_of(state) is not None]
    return max(found, key=step_of) if found else None


def progress(run):
    """(global step, last checkpoint) of the trainer: the status's training, else the log's last
    `global_step=` and the newest training_state.json under the save path."""
    training = run.get("training") or {}
    step, point = training.get("global_step"), training.get("last_checkpoint")
    if step is None:
        steps = GLOBAL_STEP.findall(log_text(CONTEXT["path"])) if CONTEXT["path"] else []
        step = int(steps[-1]) if steps else None
    if point is None and CONTEXT["save_path"]:
        point = disk_checkpoint(CONTEXT["save_path"])
        point = dict(point, source="training_state.json") if point else None
    return step, point


def snapshot(run):
    training = run.get("training") or {}
    step, point = progress(run)
    return {"state": run.get("state"), "attempts": len(run.get("attempts") or []),
            "global_step": step, "epoch": training.get("epoch"),
            "step": training.get("step"), "loss": training.get("loss"),
            "last_checkpoint": point, "resumed_from": training.get("resumed_from"),
            "driver_pid": driver_pid(run), "at": now()}


def log_text(run_path):
    """Everything the run's logs say (driver.log and any other *.log* of the run directory), oldest first."""
    text = []
    for path in sorted(glob.glob(os.path.join(run_path or "", "*.log*")), key=os.path.getmtime):
        try:
            with open(path, errors="replace") as handle:
                text.append(handle.read())
        except OSError:
            continue
    return "\n".join(text)


def resumes_in_log(run_path):
    """Each resume the trainer logged, in order: {"epoch", "local_step", "global_step"} (mid-epoch) or
    {"epoch", "next_epoch": True}."""
    text = log_text(run_path)
    found = [(m.start(), {"epoch": int(m[1]), "local_step": int(m[2]), "global_step": int(m[3])})
             for m in RESUMING.finditer(text)]
    found += [(m.start(), {"epoch": int(m[1]), "next_epoch": True}) for m in RESUMING_EPOCH.finditer(text)]
    return [point for _, point in sorted(found, key=lambda pair: pair[0])]


def stepped_since(run, path, seen, point):
    """Whether the trainer that logged resume line `seen` + 1 has taken MORE_STEPS steps: its log's loss lines
    after that line (the status's global step may still be the killed trainer's), else the status's step."""
    text = log_text(path)
    lines = sorted([m.start() for m in RESUMING.finditer(text)] + [m.start() for m in RESUMING_EPOCH.finditer(text)])
    if TOTAL_LOSS.search(text) and len(lines) > seen:
        return len(TOTAL_LOSS.findall(text[lines[seen]:])) >= MORE_STEPS
    return (progress(run)[0] or 0) >= (step_of(point) or 0) + MORE_STEPS


#: A driver_pid that is one of these is a wrapper: the trainer is the python below it.
WRAPPERS = ("bash", "sh", "env", "timeout", "setsid", "nohup")


def trainer_pid(pid, found):
    """The process to kill: `pid` itself, unless it is a shell or env wrapper with the trainer below it."""
    if not found or found["comm"] not in WRAPPERS:
        return pid, "driver_pid"
    trainers = [row["pid"] for row in found["descendants"] if "speculators" in row["cmd"] or "python" in row["cmd"]]
    return (trainers[0], "the trainer below driver_pid's %s" % found["comm"]) if trainers else (pid, "driver_pid")


# -- trainrun ---------------------------------------------------------------------------------------------

def first_rows(rows):
    """A file of the data's first `rows` rows: what the extraction reads (the rest is the accept's)."""
    path = os.path.join(harness.SG, "data", "train-first-%d.jsonl" % rows)
    with open(harness.DATA) as source, open(path, "w") as out:
        out.writelines(itertools.islice(source, rows))
    return path


def phase_trainrun(spec="trainrun", later=()):
    """The phase (resumable: each step done is in results["trainrun"]); `later`: the call's phases after it."""
    if os.environ.get("TRAINRUN_FRESH") == "1":
        harness.results.pop(KEY, None)
    entry = harness.results.setdefault(KEY, {"n_train": N_TRAIN, "epochs": TRAIN_EPOCHS,
                                             "checkpoint_minutes": CHECKPOINT_MINUTES,
                                             "total_seq_len": TOTAL_SEQ_LEN, "more_steps": MORE_STEPS})
    entry.setdefault("calls", []).append({"started_at": now(), "later": list(later)})
    reserve = ACCEPT_RESERVE_S if any(p.startswith("accept") for p in later) else 0
    harness.record(KEY, entry)
    if entry.get("done"):
        harness.log("trainrun: done in an earlier call (%s)" % entry.get("finished"))
        return
    if (entry.get("extraction") or {}).get("state") != "succeeded":
        if not train_step._short_extraction(harness, entry, rows=N_TRAIN, key=KEY, name="issue36",
                                            data=first_rows(N_TRAIN)):
            return
    run_id = entry["extraction"]["run_id"]
    if (entry.get("verify") or {}).get("exit") != 0:
        verify = harness.inv("verify-dataset", "--host", "local", "--run", run_id, "--json", timeout=600)
        found = verify["json"] or {}
        entry["verify"] = dict({key: verify[key] for key in ("argv", "exit", "seconds", "stderr_tail")},
                               **{key: found.get(key) for key in ("trainable", "counts", "bad", "problems",
                                                                  "refusals", "trainer", "command")})
        harness.record(KEY, entry)
        harness.log("verify-dataset: exit %d, %s" % (verify["exit"], json.dumps(found.get("counts"))))
        if verify["exit"] != 0:
            return
    if not (entry.get("launch") or {}).get("run_id"):
        launched = harness.inv("train", "--host", "local", "--run", run_id, "--detach", "--json",
                               "--epochs", str(TRAIN_EPOCHS), "--total-seq-len", TOTAL_SEQ_LEN,
                               "--checkpoint-minutes", CHECKPOINT_MINUTES, timeout=600)
        info = launched["json"] or {}
        entry["launch"] = {"argv": launched["argv"], "exit": launched["exit"], "seconds": launched["seconds"],
                           "stderr_tail": launched["stderr_tail"], "json": info, "run_id": info.get("run_id"),
                           "path": info.get("path"), "save_path": (info.get("train") or {}).get("save_path"),
                           "at": now()}
        harness.record(KEY, entry)
        harness.log("inv train: exit %d, %s" % (launched["exit"], json.dumps(info)[:600]))
        if not info.get("launched") or not info.get("run_id"):
            return
    CONTEXT.update(path=entry["launch"]["path"], save_path=entry["launch"].get("save_path"))
    watch = Watch(entry, entry["launch"]["run_id"])
    if not kill_and_restart(entry, watch, reserve) or not stop_and_resume(entry, watch, reserve):
        return
    finish(entry, watch, reserve)


def driver_pid(run):
    """The trainer's pid as `inv status` names it (driver_pid; tolerant of a nested driver record)."""
    pid = run.get("driver_pid") or (run.get("driver") or {}).get("pid")
    return int(pid) if pid else None


def resume_point(run, path, seen, stale=None, save_path=None):
    """Where the newest trainer resumed from, once it said so: its log's resume line beyond the first `seen`
    ones (an end-of-epoch resume's line has no step: the status's point, else the step in the epoch before's
    training_state.json), else the status's training.resumed_from when it is not `stale` (an earlier
    attempt's); None before either."""
    logged = resumes_in_log(path)
    point = (run.get("training") or {}).get("resumed_from")
    if len(logged) > seen:
        line = logged[-1]
        if "global_step" in line:
            return line
        if step_of(point) is not None and point != stale:
            return dict(point, logged=line)
        state = harness.read_json(os.path.join(save_path or "", str(line["epoch"] - 1), "training_state.json"))
        return dict(line, global_step=step_of(state), from_training_state=bool(state))
    return point if point and point != stale else None


def kill_and_restart(entry, watch, reserve):
    """The trainer killed once it has a checkpoint and MORE_STEPS steps after it; the restart's resume point."""
    path, save_path = entry["launch"]["path"], entry["launch"].get("save_path")
    if not entry.get("kill"):
        def checkpointed_and_on(run):
            step, point = progress(run)
            return (step_of(point) is not None and (step or 0) >= step_of(point) + MORE_STEPS
                    and driver_pid(run) and run.get("state") not in harness.FINAL)

        if not watch.until(lambda run: checkpointed_and_on(run) or run.get("state") in harness.FINAL, 900, reserve):
            entry["cut"] = "waiting for a checkpoint before the kill"
            return False
        before = snapshot(watch.last)
        if watch.last.get("state") in harness.FINAL:
            entry["kill"] = {"done": False, "why": "the run ended (%s) before a checkpoint and %d steps after it"
                             % (watch.last.get("state"), MORE_STEPS), "before": before}
            harness.record(KEY, entry)
            return True
        killed = harness.process_tree(driver_pid(watch.last))
        pid, which = trainer_pid(driver_pid(watch.last), killed)
        before["resumes_logged"] = len(resumes_in_log(path))
        try:
            os.kill(pid, signal.SIGKILL)
            entry["kill"] = {"done": True, "signal": "SIGKILL", "pid": pid, "which": which, "process": killed,
                             "before": before,
                             "at_epoch": time.time(), "at": now()}
        except ProcessLookupError:
            entry["kill"] = {"done": False, "why": "driver_pid %d was gone" % pid, "before": before}
        harness.record(KEY, entry)
        harness.log("kill -9 of the trainer %s at global step %s, last checkpoint %s" % (
            pid, before["global_step"], json.dumps(before["last_checkpoint"])))
    kill = entry["kill"]
    if kill.get("done") and not kill.get("restart"):
        attempts, seen = kill["before"]["attempts"], kill["before"].get("resumes_logged", 0)
        stale = kill["before"].get("resumed_from")  # the killed trainer's own (None after a fresh start)

        def restarted_and_on(run):
            point = resume_point(run, path, seen, stale=stale, save_path=save_path)
            return (len(run.get("attempts") or []) > attempts and point is not None
                    and stepped_since(run, path, seen, point)) or run.get("state") in harness.FINAL

        reached = watch.until(restarted_and_on, 600, reserve)
        if not reached:
            entry["cut"] = "waiting for the restarted trainer"
            harness.record(KEY, entry)
            return False
        listed = watch.last.get("attempts") or []
        kill["restart"] = dict(snapshot(watch.last), resumed_from=resume_point(watch.last, path, seen, stale,
                                                                                 save_path),
                               status_resumed_from=(watch.last.get("training") or {}).get("resumed_from"),
                               seconds_after_kill=round(time.time() - kill["at_epoch"], 1),
                               killed_attempt=listed[attempts - 1] if len(listed) >= attempts else None,
                               logged_resumes=resumes_in_log(path))
        harness.record(KEY, entry)
        harness.log("after the kill: %s" % json.dumps(kill["restart"])[:800])
    return True


def stop_and_resume(entry, watch, reserve):
    """`inv stop` (the trainer saves a checkpoint on SIGTERM), then `inv resume --detach`."""
    run_id, path = entry["launch"]["run_id"], entry["launch"]["path"]
    if not entry.get("stop"):
        watch.poll()
        before = snapshot(watch.last)
        if before["state"] in harness.FINAL:
            entry["stop"] = {"done": False, "why": "the run had ended (%s)" % before["state"], "before": before}
        else:
            stopped = harness.inv("stop", "--host", "local", "--run", run_id, "--json", timeout=300)
            watch.poll()
            entry["stop"] = {"done": True, "before": before, "argv": stopped["argv"], "exit": stopped["exit"],
                             "seconds": stopped["seconds"], "json": stopped["json"],
                             "stderr_tail": stopped["stderr_tail"], "after": snapshot(watch.last),
                             "checkpoints_on_disk": checkpoints(entry["launch"].get("save_path"))}
        harness.record(KEY, entry)
        harness.log("stop: %s" % json.dumps(entry["stop"])[:800])
    if entry["stop"].get("done") and not entry.get("resume"):
        seen = len(resumes_in_log(path))  # before the resume: its trainer's line is the next one
        resumed = harness.inv("resume", "--host", "local", "--run", run_id, "--detach", "--json", timeout=300)
        entry["resume"] = {"argv": resumed["argv"], "exit": resumed["exit"], "seconds": resumed["seconds"],
                           "json": resumed["json"], "stderr_tail": resumed["stderr_tail"],
                           "attempts_before": len(watch.last.get("attempts") or []),
                           "resumes_logged": seen, "at": now()}
        harness.record(KEY, entry)
        harness.log("resume: exit %d, %s" % (resumed["exit"], json.dumps(resumed["json"])[:400]))
    return True


def checkpoints(save_path):
    """The checkpoint directories under the save path with their training_state.json (what a resume reads)."""
    if not save_path or not os.path.isdir(save_path):
        return None
    return {name: harness.read_json(os.path.join(save_path, name, "training_state.json"))
            for name in sorted(os.listdir(save_path)) if os.path.isdir(os.path.join(save_path, name))}


def finish(entry, watch, reserve):
    """Waited to the run's end (or, with the accept after it and too little left, stopped for it)."""
    resume, path = entry.get("resume") or {}, entry["launch"]["path"]
    stale = ((entry.get("kill") or {}).get("restart") or {}).get("status_resumed_from")

    def note_resume(run):
        if resume and "after" not in resume:  # its own resume line, or a resume point not the restart's
            point = resume_point(run, path, resume["resumes_logged"], stale=stale,
                                 save_path=entry["launch"].get("save_path"))
            if point is not None:
                resume["after"] = dict(snapshot(run), resumed_from=point)
        return run.get("state") in harness.FINAL

    ended = watch.until(note_resume, 3600, reserve)
    run = watch.last
    if not ended:
        if not reserve:
            entry["cut"] = "waiting for the resumed trainer's end"
            harness.record(KEY, entry)
            return
        stopped = harness.inv("stop", "--host", "local", "--run", entry["launch"]["run_id"], "--json", timeout=300)
        entry["stopped_for_accept"] = {"exit": stopped["exit"], "seconds": stopped["seconds"],
                                       "before": snapshot(run)}
        run = watch.poll()
    entry.pop("cut", None)
    text = log_text(run.get("path") or path)
    losses = [train_step._number(value) for value in TOTAL_LOSS.findall(text)]
    entry.update(done=True, finished=run.get("state") == "succeeded", final=snapshot(run),
                 attempts=run.get("attempts"), exit=run.get("exit"), logged_resumes=resumes_in_log(path),
                 losses={"count": len(losses), "first": losses[:5], "last": losses[-5:]},
                 checkpoints_on_disk=checkpoints(entry["launch"].get("save_path")),
                 draft=draft_dir(entry["launch"].get("save_path"), run))
    harness.keep_run_files("issue36-train", path)
    entry["passed"] = passed(entry)
    harness.record(KEY, entry)
    harness.log("trainrun: %s, draft %s, losses %s -> %s; passed %s" % (
        run.get("state"), entry["draft"].get("path"), losses[:1], losses[-1:], entry["passed"]))


def draft_dir(save_path, run):
    """The trained draft: the last epoch's directory, else checkpoint_best, else the newest with weights."""
    save_path = save_path or ((run.get("training") or {}).get("save_path"))
    if not save_path or not os.path.isdir(save_path):
        return {"path": None, "save_path": save_path, "why": "no save path"}
    epochs = sorted((int(name) for name in os.listdir(save_path) if name.isdigit()
                     and os.path.exists(os.path.join(save_path, name, "model.safetensors"))), reverse=True)
    best = os.path.join(save_path, "checkpoint_best")
    best_target = os.path.realpath(best) if os.path.exists(best) else None
    found = sorted(glob.glob(os.path.join(save_path, "*", "model.safetensors")), key=os.path.getmtime)
    chosen, how = ((os.path.join(save_path, str(epochs[0])), "the last epoch's directory") if epochs else
                   (best, "checkpoint_best") if best_target else
                   (os.path.dirname(found[-1]), "the newest directory with weights") if found else (None, "none"))
    state = harness.read_json(os.path.join(chosen, "training_state.json")) if chosen else None
    return {"path": chosen, "how": how, "save_path": save_path, "checkpoint_best": best_target,
            "training_state": state, "entries": sorted(os.listdir(save_path))}


def passed(entry):
    """Finished; killed with a checkpoint before it; the restart resumed at or after that checkpoint; stopped
    and resumed at or after the last checkpoint before the stop; a draft to measure."""
    kill, stop, resume = entry.get("kill") or {}, entry.get("stop") or {}, entry.get("resume") or {}
    before = step_of((kill.get("before") or {}).get("last_checkpoint"))
    after = step_of((kill.get("restart") or {}).get("resumed_from"))
    before_stop = step_of((stop.get("before") or {}).get("last_checkpoint"))
    resumed = step_of((resume.get("after") or {}).get("resumed_from"))
    return bool(entry.get("finished") and kill.get("done") and before is not None and after is not None
                and after >= before and stop.get("done") and stop.get("exit") == 0 and resume.get("exit") == 0
                and resumed is not None and before_stop is not None and resumed >= before_stop
                and (entry.get("draft") or {}).get("path"))


# -- accept ---------------------------------------------------------------------------------------------

def phase_accept(spec="accept"):
    train = harness.results.get(KEY) or {}
    draft = os.environ.get("DRAFT") or (train.get("draft") or {}).get("path")
    first_row = train.get("n_train") or N_TRAIN  # the rows after those the draft was trained on
    entry = {"draft": draft, "prompts": harness.DATA, "first_row": first_row, "num_prompts": ACCEPT_PROMPTS,
             "max_tokens": ACCEPT_TOKENS, "train_finished": train.get("finished"),
             "shifted_control": "not run: a fourth trainer start and a third engine start do not fit the calls"}
    entry["error"] = None if draft else "no trained draft (trainrun: %s)" % (train.get("cut") or "not done")
    harness.record("accept", entry)
    if not draft:
        return
    harness.wait_idle(timeout=60)
    left = harness.budget_left()
    done = harness.inv("accept", "--host", "local", "--draft", draft, "--untrained", "auto", "--prompts",
                       harness.DATA, "--first-row", str(first_row), "--num-prompts", str(ACCEPT_PROMPTS),
                       "--max-tokens", str(ACCEPT_TOKENS), "--json",
                       timeout=int(max(60, (left or 1200) - END_MARGIN_S)))
    entry.update(argv=done["argv"], exit=done["exit"], seconds=done["seconds"], stderr_tail=done["stderr_tail"],
                 json=done["json"])
    harness.record("accept", entry)
    found = done["json"] or {}
    if not found.get("drafts") and found.get("path"):  # a run of kind accept: its end holds the result
        harness.wait_run(found["path"], lambda beat, status: harness.run_state(found["path"]) in harness.FINAL,
                         timeout=max(30, (harness.budget_left() or 600) - END_MARGIN_S))
        status = harness.inv("status", "--host", "local", "--run", found.get("run_id") or "", "--json", timeout=120)
        entry["run"] = run_of(status["json"], found.get("run_id"))
        harness.keep_run_files("issue36-accept", found["path"])
        harness.record("accept", entry)
    harness.log("accept: exit %d in %.0f s: %s" % (done["exit"], done["seconds"], json.dumps(found)[:1500]))
