"""The `train.launch` remote command: speculators' trainer started as a supervised run on a verified dataset
(stdlib only).

    train.launch  {"workdir", "host", "run": id|null, "out": dir|null, "gpus": n|null, "epochs": n|null,
                   "max_steps": n|null, "total_seq_len": n|null, "checkpoint_minutes": m, "save_path": dir|null,
                   "no_compile": bool, "collective_safe": bool, "skip_preflight": bool, "env", "options", "slurm"}

The states are an extraction's output: `run` names the run that wrote them, `out` the directory (the one
`inv verify-dataset` checked: a job array's merged directory is its own). Refused in one line each, with
nothing written (kind "train-refused", the checks in the failure):

- states `inv verify-dataset` has not passed: no verdict beside them, a verdict of NOT trainable, or
  states changed since it (dataset/verify.py VERDICT_FILE and its fingerprint);
- a save path that already holds another training's checkpoints (the trainer would resume it: `inv resume`
  that run instead), that cannot be written, or whose disk cannot hold the checkpoints the training keeps
  (one per epoch; plan.checkpoint_bytes);
- without --skip-preflight: no accelerator that this python's torch can use, or fewer than --gpus
  (accelerator.py): speculators 0.9's trainer needs one, and finds it missing only after building the draft.
  On a Slurm login node, which has no GPU of its own, the job's `slurm.gres` must ask for --gpus of them.
"""
import json
import os
import subprocess
import sys

from base import atomic, rundir
from base.contract import KIND_TRAIN, TRAIN_CHECKPOINT_MINUTES
from base.failure import RemoteFailure
from base.units import human_bytes
from dataset import command
from dataset import verify as dataset_verify
from run import disk_watch, launching
from run.storage import existing_parent
from run.training import plan, progress
from slurm import cluster

#: Seconds the accelerator probe may take (torch's import, a CUDA context on each GPU).
PROBE_TIMEOUT_S = 120
#: Grace between SIGTERM and SIGKILL of a training: the trainer saves a checkpoint on SIGTERM, which for a
#: large draft takes more than an extraction's default grace (the user's extract.grace_s, if larger, wins).
TRAIN_GRACE_S = 300.0


def launch(args):
    gpus = launching.whole_number(args, "gpus", minimum=1, default=1)
    max_steps = launching.whole_number(args, "max_steps", minimum=1)
    minutes = args.get("checkpoint_minutes")
    if not isinstance(minutes, (int, float)) or isinstance(minutes, bool) or minutes <= 0:
        raise RemoteFailure("bad-argument", "--checkpoint-minutes %r: give the minutes of work a crash may lose, "
                                            "above 0 (default %g)" % (minutes, TRAIN_CHECKPOINT_MINUTES))
    states = _states(args)
    verdict = _verdict(states, host=args.get("host") or "HOST")
    env, words = plan.words_and_env(verdict["command"])
    if args.get("no_compile"):
        env["TORCHDYNAMO_DISABLE"] = "1"
    if args.get("collective_safe"):
        env["NCCL_P2P_DISABLE"] = "1"
    seq_len = launching.whole_number(args, "total_seq_len", minimum=1,
                                     default=int(command.option(words, "--total-seq-len", plan.DEFAULT_SEQ_LEN)))
    epochs = launching.whole_number(args, "epochs", minimum=1,
                                    default=int(command.option(words, "--epochs", plan.DEFAULT_EPOCHS)))
    save_path = os.path.abspath(os.path.expanduser(args.get("save_path") or command.option(words, "--save-path")))
    model = command.option(words, "--verifier-name-or-path")
    draft_vocab = command.option(words, "--draft-vocab-size")
    checks = [_save_path_check(save_path)]
    rows, per_row = verdict["counts"]["rows"], verdict.get("tokens_per_row") or plan.DEFAULT_SEQ_LEN
    steps = plan.steps_per_epoch(tokens=rows * per_row, seq_len=seq_len, gpus=gpus)
    total_steps = min(steps * epochs, max_steps) if max_steps else steps * epochs
    ckpt_bytes = plan.checkpoint_bytes(model, draft_vocab=int(draft_vocab) if draft_vocab else None)
    kept = max(1, min(epochs, -(-total_steps // steps)))
    if not args.get("skip_preflight"):
        checks.append(_room_check(save_path, ckpt_bytes, kept))
        checks.append(_gres_check(args["slurm"], gpus) if args.get("slurm") else _accelerator_check(gpus))
    failed = [check for check in checks if not check["ok"]]
    if failed:
        raise RemoteFailure("train-refused", "; ".join(check["detail"] for check in failed), checks=checks)
    options = dict(args.get("options") or {})
    options["grace_s"] = max(options.get("grace_s") or 0, TRAIN_GRACE_S)
    words = words + ["--epochs", str(epochs), "--total-seq-len", str(seq_len), "--save-path", save_path]
    if max_steps:
        words += ["--max-steps", str(max_steps)]
    checkpoint = plan.checkpoint_plan(bound_s=minutes * 60.0, steps_per_epoch=steps, seq_len=seq_len)

    def training(run):
        return {"words": words + ["--log-dir", run.file("trainer-logs")], "env": dict(env, **plan.TRAINER_ENV),
                "gpus": gpus, "save_path": save_path, "hidden_states_path": states, "model": model,
                "epochs": epochs, "max_steps": max_steps, "total_seq_len": seq_len, "total_steps": total_steps,
                "steps_per_epoch": steps, "checkpoint": checkpoint, "checkpoint_bytes": ckpt_bytes,
                "checkpoints_kept": kept, "dataset": {key: verdict.get(key) for key in ("verified_at", "counts")}}

    launched = launching.launch_kind(dict(args, options=options), kind=KIND_TRAIN, out=save_path, plan=training)
    return dict(launched, preflight=checks)


def _states(args):
    """The directory of the states to train on: `out`, or the output of the run `run` names."""
    if bool(args.get("run")) == bool(args.get("out")):
        raise RemoteFailure("bad-argument", "name the states to train on: --run ID (the extraction's run) or "
                                            "--out DIR (the directory `inv verify-dataset` checked), one of them")
    if args.get("out"):
        states = os.path.abspath(os.path.expanduser(args["out"]))
        if not os.path.isdir(states):
            raise RemoteFailure("bad-argument", "--out %r is no directory on this host: name the states "
                                                "`inv verify-dataset` checked" % args["out"])
        return states
    workdir = rundir.workdir_of(args)
    run = rundir.find_run(workdir, args["run"])
    return os.path.abspath(os.path.expanduser(run.record["out"]))


def _verdict(states, *, host):
    """The verdict `inv verify-dataset` left beside the states, when it holds: trainable, and the states as they
    were then; else train-refused, naming why and the command that fixes it (on `host`, as hosts.yaml names it)."""
    verify = "`inv verify-dataset --host %s --out %s`" % (host, states)
    verdict = atomic.read_json(os.path.join(states, dataset_verify.VERDICT_FILE))
    if not verdict:
        raise RemoteFailure("train-refused", "%s has not passed verify-dataset (no %s there): run %s first"
                            % (states, dataset_verify.VERDICT_FILE, verify))
    verified = verdict.get("hidden_states_path")
    if verified and os.path.realpath(verified) != os.path.realpath(states):
        raise RemoteFailure("train-refused", "%s has not passed verify-dataset: the verdict there is %s's (a copy?): "
                            "run %s" % (states, verified, verify))
    if not verdict.get("trainable") or not verdict.get("command"):
        raise RemoteFailure("train-refused", "verify-dataset found %s NOT trainable (%d bad rows; %s): fix it, then "
                            "run %s again" % (states, verdict.get("bad_rows") or 0,
                                              "; ".join(verdict.get("problems") or []) or "see its report", verify))
    now = dataset_verify.fingerprint(states)
    then = verdict.get("fingerprint")
    if now != then:
        raise RemoteFailure("train-refused", "%s changed since verify-dataset passed it at %s (%s): run %s again"
                            % (states, verdict.get("verified_at"), _change(then or {}, now or {}), verify))
    return verdict


def _change(then, now):
    """How the states changed between two fingerprints, in words."""
    if (then.get("files"), then.get("bytes")) == (now.get("files"), now.get("bytes")):
        return "as many files and bytes, but written again since"
    return "%s files of %s then, %s files of %s now" % (then.get("files"), human_bytes(then.get("bytes") or 0),
                                                      now.get("files"), human_bytes(now.get("bytes") or 0))


def _save_path_check(save_path):
    """The save path holds no earlier training's checkpoints, and this user can make and write it."""
    checkpoint = progress.last_checkpoint(save_path)
    if checkpoint or os.path.isdir(os.path.join(save_path, progress.INTERRUPTED)):
        where = "epoch %(epoch)d, step %(local_step)d" % checkpoint if checkpoint else "a stop's checkpoint"
        return {"name": "save path", "ok": False,
                "detail": "%s already holds an earlier training's checkpoints (%s), which the trainer would resume: "
                          "`inv resume` that training's run, or pass another --save-path" % (save_path, where)}
    existing = existing_parent(save_path)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        return {"name": "save path", "ok": False,
                "detail": "cannot write %s: %s is not a directory this user can write; pass a --save-path it can"
                          % (save_path, existing)}
    return {"name": "save path", "ok": True, "detail": "%s (writable)" % save_path}


def _room_check(save_path, ckpt_bytes, kept):
    """The disk under the save path holds the checkpoints the training keeps (one per epoch)."""
    existing = existing_parent(save_path)
    free = disk_watch.free_bytes(existing)
    if ckpt_bytes is None:
        return {"name": "room", "ok": True, "detail": "%s free; a checkpoint's size is unknown (no config.json of "
                                                      "the verifier)" % human_bytes(free)}
    need = ckpt_bytes * kept
    ok = free >= need
    detail = "%s free at %s; %d checkpoint(s) of about %s each need %s" % (
        human_bytes(free), existing, kept, human_bytes(ckpt_bytes), human_bytes(need))
    if not ok:
        detail += ": free space there, lower --epochs, or pass a --save-path on a larger disk"
    return {"name": "room", "ok": ok, "detail": detail}


def _gres_check(slurm, gpus):
    """A training on a Slurm cluster asks its job for the GPUs it trains on (`slurm.gres`): the login node, where
    this runs, has none of its own to ask torch about."""
    gres = slurm.get("gres") or ""
    count = cluster.gpus_in(gres)
    if count < gpus:
        return {"name": "accelerator", "ok": False,
                "detail": "slurm.gres %r asks the job for %d GPU(s), and the trainer needs %d: set `gres: gpu:%d` "
                          "under slurm: of the host in hosts.yaml" % (gres, count, gpus, gpus)}
    return {"name": "accelerator", "ok": True, "detail": "the job asks for %s (slurm.gres); training on %d"
                                                         % (gres, gpus)}


def _accelerator_check(gpus):
    """This python's torch sees an accelerator, with `gpus` devices at least."""
    probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accelerator.py")
    try:
        done = subprocess.run([sys.executable, probe], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return {"name": "accelerator", "ok": False,
                "detail": "could not ask torch for an accelerator (%s): check `python` of the host in hosts.yaml"
                          % exc}
    if not found.get("torch"):
        return {"name": "accelerator", "ok": False, "detail": "no torch in %s (%s): point `python` in hosts.yaml at "
                                                             "the environment that trains" % (sys.executable,
                                                                                              found.get("error"))}
    if not found.get("accelerator"):
        return {"name": "accelerator", "ok": False,
                "detail": "no GPU the trainer can use: torch %s sees no accelerator, and speculators' trainer needs "
                          "one; train on a host with GPUs" % found["torch"]}
    if found["count"] < gpus:
        return {"name": "accelerator", "ok": False,
                "detail": "--gpus %d: torch %s sees %d %s device(s); lower --gpus" % (
                    gpus, found["torch"], found["count"], found["accelerator"])}
    names = sorted({device["name"] for device in found["devices"]})
    return {"name": "accelerator", "ok": True, "detail": "%d x %s (torch %s); training on %d" % (
        found["count"], ", ".join(names), found["torch"], gpus)}
