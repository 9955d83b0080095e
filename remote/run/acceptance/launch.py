"""The `accept.launch` remote command: an acceptance measurement started as a supervised run (stdlib only).

    accept.launch  {"workdir", "host", "draft", "untrained": "auto"|"none"|dir, "model": str|null,
                    "prompts": path|null, "first_row": int|null, "num_prompts", "max_tokens", "k", "tp",
                    "env", "options", "server_python": path|null, "slurm": {...}|null}

Every argument is checked before anything is written (RemoteFailure bad-argument, one line naming the value
and the fix); then run/launching.launch_kind makes the run, its plan in run.json["accept"]. The draft's
directory is the run's claimed output: no two active measurements of one draft (their engines would share
the GPUs). What the run writes goes in its own directory: acceptance/<draft>.json, untrained/.
"""
import os
import sys

from base import hfcache, pkgmeta, rundir
from base.contract import ACCEPT_DEFAULTS, KIND_ACCEPT
from base.failure import RemoteFailure
from run import launching
from run.acceptance import draft as checkpoint
from run.acceptance.measure import MAKING

UNTRAINED_CHOICES = ("auto", "none")
#: Seconds to ask the measuring python whether it has vLLM (without importing it).
FIND_VLLM_TIMEOUT_S = 60
#: The shape a draft's config fixes: an untrained draft compared with it must share these.
SHAPE_KEYS = ("draft_vocab_size", "eagle_aux_hidden_state_layer_ids")
LAYER_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "vocab_size")


def launch(args):
    workdir = rundir.workdir_of(args)
    launching.job_environment(args.get("env"))  # the model's snapshot is looked up with HF_HOME, a token
    sizes = {name: launching.whole_number(args, name, minimum=1, default=default)
             for name, default in ACCEPT_DEFAULTS.items()}
    first_row = launching.whole_number(args, "first_row", minimum=0)
    draft = directory(args.get("draft"), "--draft")
    config = checkpoint.read_config(draft)
    train_args = checkpoint.training_args(draft)
    untrained = untrained_source(args.get("untrained") or "auto", draft, config, train_args)
    model = args.get("model") or checkpoint.verifier_of(config)
    if not model:
        raise RemoteFailure("bad-argument", "--draft %r names no verifier in its config.json: pass --model" % draft)
    model = hfcache.resolve(model, os.environ)
    if args.get("prompts"):
        prompts = os.path.abspath(os.path.expanduser(args["prompts"]))
        if not os.path.isfile(prompts):
            raise RemoteFailure("bad-argument", "--prompts %r is no file on this host: name a jsonl of "
                                                "conversations" % args["prompts"])
        first_row = first_row or 0
    else:
        prompts, held_out = checkpoint.held_out_prompts(workdir, train_args)
        first_row = held_out if first_row is None else first_row
    rows = count_rows(prompts, first_row + 1)
    if rows <= first_row:
        raise RemoteFailure("bad-argument", "--first-row %r: %s has %d rows; pass a smaller --first-row or "
                                            "another --prompts" % (first_row, prompts, rows))
    measure_python = args.get("server_python") or sys.executable
    check_vllm(os.path.expanduser(measure_python))

    def plan(run):
        return {"draft": draft, "model": model.path, "model_id": model.repo_id, "prompts": prompts,
                "first_row": first_row, "measure_python": os.path.expanduser(measure_python),
                "speculators_python": sys.executable, "results": run.file("acceptance"),
                "untrained": dict(untrained, **untrained_made(untrained, run, train_args)), **sizes}

    return launching.launch_kind(args, kind=KIND_ACCEPT, out=draft, plan=plan)


def directory(value, option):
    if not value:
        raise RemoteFailure("bad-argument", "no %s given: name a draft checkpoint directory on the host" % option)
    path = os.path.realpath(os.path.expanduser(value))
    if not os.path.isdir(path):
        raise RemoteFailure("bad-argument", "%s %r is no directory on this host: name a checkpoint directory of "
                                            "`speculators train`" % (option, value))
    return path


def untrained_source(value, draft, config, train_args):
    """The untrained draft's source: {"source": "auto"|"none"|"dir", "path"}; "auto" needs the draft's training
    command, a directory must hold a draft of the same shape."""
    if value == "none":
        return {"source": "none", "path": None}
    if value == "auto":
        if train_args is None:
            raise RemoteFailure("bad-argument", "--untrained auto: neither %s nor the directory above holds %s, "
                                                "the command to make the untrained draft from; pass --untrained DIR "
                                                "(a `speculators train --dry-run` checkpoint) or --untrained none"
                                % (draft, checkpoint.TRAIN_COMMAND))
        return {"source": "auto", "path": None}
    path = directory(value, "--untrained")
    other = checkpoint.read_config(path, "--untrained")
    if shape(other) != shape(config):
        raise RemoteFailure("bad-argument", "--untrained %r is not of the draft's shape (%r against %r): make it "
                                            "with the draft's training command and --dry-run, or pass "
                                            "--untrained auto" % (value, shape(other), shape(config)))
    return {"source": "dir", "path": path}


def shape(config):
    layer = config.get("transformer_layer_config") or {}
    return [config.get(key) for key in SHAPE_KEYS] + [layer.get(key) for key in LAYER_SHAPE_KEYS]


def untrained_made(untrained, run, train_args):
    """Where an "auto" untrained draft goes (the run's untrained/) and the command that makes it, in
    untrained.making/ (measure.py renames it once whole)."""
    if untrained["source"] != "auto":
        return {"argv": None}
    path = run.file("untrained")
    return {"path": path, "argv": checkpoint.untrained_argv(sys.executable, train_args, path + MAKING)}


def count_rows(path, enough):
    """The file's non-empty lines, counted up to `enough`."""
    rows = 0
    with open(path, "rb") as handle:
        for line in handle:
            rows += bool(line.strip())
            if rows >= enough:
                break
    return rows


def check_vllm(python):
    """bad-argument unless `python` (the host's server_python, else python) has vLLM installed: the measurement
    runs vLLM there. Read from the package metadata by base/pkgmeta.py run with that python, as a server
    mode's plan reads it."""
    try:
        other = pkgmeta.other_environment(python, ["vllm"], FIND_VLLM_TIMEOUT_S)
    except pkgmeta.EnvironmentUnreadable as exc:
        raise RemoteFailure("bad-argument", "python %r cannot be run (%s): set server_python in hosts.yaml to the "
                                            "python that has vLLM" % (python, exc)) from None
    if not (other or pkgmeta.environment(["vllm"]))["installed"]["vllm"]:
        raise RemoteFailure("bad-argument", "python %r has no vLLM: the measurement serves the target with vLLM; "
                                            "set server_python in hosts.yaml to the python that has it" % python)
