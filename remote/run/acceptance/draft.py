"""A draft checkpoint of speculators' trainer, read as an acceptance measurement needs it (stdlib only).

speculators 0.9's `speculators train` saves <save_path>/<epoch>/ and <save_path>/checkpoint_best/ (each a
config.json and model.safetensors that vLLM loads), and writes run.yaml and train_command.txt in <save_path>
(cfg.save). `--dry-run` saves the initialised draft in <save_path> itself, beside those two files. So the
command that trained a draft is in its directory or the one above; the same command with `--dry-run`
makes the untrained draft of the same shape (same seed: the weights the training started from).
"""
import json
import os
import shlex

from base import rundir
from base.failure import RemoteFailure
from dataset import command

TRAIN_COMMAND = "train_command.txt"
#: Options of the training command that name where it writes or what it starts from, not the draft's shape.
DROPPED_WITH_VALUE = ("--save-path", "--from-pretrained")
DROPPED_FLAGS = ("--dry-run",)


def read_config(draft, option="--draft"):
    """The draft's config.json; bad-argument (naming the `option` that gave it) unless it is an EAGLE-3
    checkpoint vLLM can load."""
    path = os.path.join(draft, "config.json")
    try:
        with open(path) as handle:
            config = json.load(handle)
    except FileNotFoundError:
        raise RemoteFailure("bad-argument", "%s %r holds no config.json: name a checkpoint directory of "
                            "`speculators train` (<save_path>/<epoch> or <save_path>/checkpoint_best)"
                            % (option, draft)) from None
    except (OSError, ValueError) as exc:
        raise RemoteFailure("bad-argument", "%s %r: config.json unreadable (%s); name a whole checkpoint"
                            % (option, draft, exc)) from None
    algorithm = (config.get("speculators_config") or {}).get("algorithm") or config.get("speculators_model_type")
    if algorithm != "eagle3":
        raise RemoteFailure("bad-argument", "%s %r is no EAGLE-3 draft (its config.json names algorithm %r): name "
                            "a checkpoint of `speculators train`" % (option, draft, algorithm))
    if not any(name.endswith(".safetensors") for name in os.listdir(draft)):
        raise RemoteFailure("bad-argument", "%s %r holds no *.safetensors weights: name a whole checkpoint"
                            % (option, draft))
    return config


def verifier_of(config):
    """The target the draft was made for (its config's speculators_config.verifier), or None."""
    return ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")


def training_args(draft):
    """The arguments of the command that made the draft (train_command.txt in the draft's directory or the
    one above, its program and a leading `train` dropped), or None where neither holds one."""
    for directory in (draft, os.path.dirname(draft.rstrip("/"))):
        try:
            with open(os.path.join(directory, TRAIN_COMMAND)) as handle:
                lines = [line.strip() for line in handle if line.strip() and not line.lstrip().startswith("#")]
        except OSError:
            continue
        if not lines:
            continue
        words = shlex.split(lines[-1])[1:]
        return words[1:] if words[:1] == ["train"] else words
    return None


def untrained_argv(python, args, save_path):
    """`speculators train` with the draft's own arguments and `--dry-run --save-path save_path`: the untrained
    draft of the same shape, on `python` (the host's speculators)."""
    kept, skip = [], False
    for word in args:
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in DROPPED_WITH_VALUE:
            skip = "=" not in word
            continue
        if name in DROPPED_FLAGS:
            continue
        kept.append(word)
    return [python, "-m", "speculators", "train"] + kept + ["--dry-run", "--save-path", save_path]


def held_out_prompts(workdir, args):
    """(dataset file, its first row the training did not use) of the extraction whose output the draft was
    trained on (the command's --hidden-states-path, a run of this workdir); bad-argument naming why not, and
    the fix (--prompts)."""
    states = command.option(args or [], "--hidden-states-path")
    if not states:
        raise RemoteFailure("bad-argument", "no --prompts given and the draft's training command names no "
                            "--hidden-states-path: pass --prompts FILE (a jsonl of conversations on the host)")
    states = os.path.realpath(os.path.expanduser(states))
    runs = [run for run in rundir.all_runs(workdir)
            if run.record.get("out") and os.path.realpath(os.path.expanduser(run.record["out"])) == states]
    if not runs:
        raise RemoteFailure("bad-argument", "no --prompts given and no run of %s wrote %s, the states the draft "
                            "trained on: pass --prompts FILE" % (workdir, states))
    driver_args = runs[-1].record.get("driver_args") or {}
    dataset, used = driver_args.get("dataset"), driver_args.get("max_samples")
    if not dataset or not os.path.isfile(dataset):
        raise RemoteFailure("bad-argument", "no --prompts given and the extraction's dataset %r is no file here: "
                            "pass --prompts FILE" % dataset)
    if not used:
        raise RemoteFailure("bad-argument", "no --prompts given and the extraction (run %s) used every row of %s: "
                            "pass --prompts FILE with rows the draft did not see" % (runs[-1].run_id, dataset))
    return dataset, int(used)
