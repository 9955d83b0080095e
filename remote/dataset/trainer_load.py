"""The trainer's own loading code over an extraction output's rows: a program started by path.

    <python> remote/dataset/trainer_load.py <args.json>

Started by `dataset.verify` (remote/dataset/verify.py) with the host's `python`, the environment whose
speculators will train: its job is to import torch, safetensors, datasets and speculators, which the calls
of remote/ never do. args.json:

    {"format": "safetensors"|"pt", "hidden_states_path": dir, "data_path": dir|null, "storage": "bf16"|"fp8",
     "rows": [i, ...] (every row the output must hold), "load": [i, ...] (the rows loaded whole),
     "slots": n (layer slots a file holds), "hidden_size": h|null, "max_len": n}

What it does, per speculators release:

- 0.8 and later (`speculators.train.data.ArrowDataset`): the prepared dataset is loaded as the trainer loads
  it; every row's `token_ids` (safetensors' own reader, the states left unread) is compared with the row's
  `input_ids`, which the trainer only warns about before dropping the sample. The rows of `load` go through
  the dataset class itself, with `on_missing="raise"` and the transfer the files need (`FP8Transfer` for
  fp8 storage: the `--hidden-states-backend fp8` the command will name), then through `CollateFn` with the
  eagle3 `shift_batch`, each alone: a row that fails there fails the training's first batch holding it.
  The loaded states are checked finite (the trainer never checks cached files).
- 0.3 and 0.4 (`Eagle3SampleFileDataset`, `create_collate_fn`): every data_{i}.pt of `rows` is mapped
  (torch.load, mmap) and its shapes read; the rows of `load` go through the dataset class and the collate.

Prints one JSON line: {"trainer": {"version", "dataset_class"}, "bad": {row: reason}, "tokens": n,
"loaded": n, "data_rows": n|null}. Exit 2 on bad arguments, 0 otherwise (what it found is the answer).
"""
import json
import os
import sys

# Started by path: sys.path[0] is remote/dataset/, whose modules (verify.py, command.py) must shadow nothing
# the trainer imports.
del sys.path[0]


def _speculators_version():
    try:
        from importlib.metadata import version

        return version("speculators")
    except Exception:  # no metadata: the version is only shown
        return None


def _reason(exc):
    return "%s: %s" % (type(exc).__name__, " ".join(str(exc).split())[:300])


def _finite_problem(sample, keys):
    import torch

    for key in keys:
        tensor = sample.get(key)
        if tensor is None or not tensor.is_floating_point():
            continue
        finite = torch.isfinite(tensor.float())
        if not bool(finite.all()):
            bad = (~finite).nonzero()
            return "%d NaN/Inf values in %s, first at token %d" % (bad.shape[0], key, int(bad[0][0]))
    return None


def _shape_problem(sample, slots, hidden_size):
    """The trainer's sample: hidden_states [T, (slots - 1) x H], verifier_last_hidden_states [T, H]."""
    states, last = sample["hidden_states"], sample["verifier_last_hidden_states"]
    if hidden_size and last.shape[-1] != hidden_size:
        return "verifier_last_hidden_states has hidden size %d, the plan %d" % (last.shape[-1], hidden_size)
    width = last.shape[-1] * (slots - 1)
    if states.shape[-1] != width:
        return "hidden_states is %d wide: %d layer(s) of %d, where the plan has %d target layers" % (
            states.shape[-1], states.shape[-1] // max(1, last.shape[-1]), last.shape[-1], slots - 1)
    return None


def check_arrow(args):
    """speculators >= 0.8: ArrowDataset and CollateFn, as `speculators train` builds them."""
    from pathlib import Path

    import torch
    from datasets import load_from_disk
    from hs_connectors.transfer import FileTransfer, FP8Transfer
    from safetensors import safe_open
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset, CollateFn

    data = load_from_disk(args["data_path"]).with_format("torch")
    bad, tokens = {}, 0
    path = args["hidden_states_path"]
    for row in args["rows"]:
        name = os.path.join(path, "hs_%d.safetensors" % row)
        if row >= len(data):
            bad[row] = "row %d is not in the prepared dataset (%d rows): no input ids to train with" % (row, len(data))
            continue
        try:
            with safe_open(name, framework="pt") as handle:
                token_ids = handle.get_tensor("token_ids")
        except Exception as exc:  # any failure to read is the finding
            bad[row] = "token_ids unreadable: %s" % _reason(exc)
            continue
        input_ids = data[row]["input_ids"]
        tokens += int(input_ids.shape[0])
        if not torch.equal(token_ids.to(torch.long), input_ids.to(torch.long)):
            bad[row] = _token_difference(token_ids, input_ids)
    transfer_class = FP8Transfer if args["storage"] == "fp8" else FileTransfer
    dataset = ArrowDataset(max_len=args["max_len"], datapath=args["data_path"], on_missing="raise",
                           train_ratio=1.0, transfer=transfer_class(Path(path)))
    collate = CollateFn(args["max_len"], args["hidden_size"] or 1, num_target_layers=args["slots"] - 1,
                        preprocess=shift_batch)
    loaded = 0
    for row in args["load"]:
        if row in bad or row >= len(dataset):
            continue
        problem = _load_through(dataset, collate, row, args)
        loaded += 1
        if problem:
            bad[row] = problem
    return {"bad": bad, "tokens": tokens, "loaded": loaded, "data_rows": len(data)}


def _token_difference(token_ids, input_ids):
    if token_ids.shape != input_ids.shape:
        return "token ids differ from the row's input ids: %d tokens in the file, %d in the row" % (
            token_ids.shape[0], input_ids.shape[0])
    differ = (token_ids.to(input_ids.dtype) != input_ids).nonzero()
    return "token ids differ from the row's input ids at %d of %d positions, first at token %d" % (
        differ.shape[0], input_ids.shape[0], int(differ[0][0]))


def _load_through(dataset, collate, row, args):
    """The trainer's path for one row: the dataset's __getitem__, the checks, then the collate."""
    from speculators.train.recovery import SampleUnavailable

    try:
        sample = dataset[row]
    except Exception as exc:  # what the trainer's worker would raise
        return "the trainer's dataset fails on it: %s" % _reason(exc)
    if isinstance(sample, SampleUnavailable):
        return "the trainer drops it: %s" % (sample.reason or "sample unavailable")
    problem = (_finite_problem(sample, ("hidden_states", "verifier_last_hidden_states"))
               or _shape_problem(sample, args["slots"], args["hidden_size"]))
    if problem:
        return problem
    try:
        collate([sample])
    except Exception as exc:  # the first batch holding it fails so
        return "the trainer's collate fails on it: %s" % _reason(exc)
    return None


def check_pt(args):
    """speculators 0.3-0.4: Eagle3SampleFileDataset and create_collate_fn, as scripts/train.py builds them."""
    import torch
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn

    bad, tokens, paths = {}, 0, {}
    for row in args["rows"]:
        name = os.path.join(args["hidden_states_path"], "data_%d.pt" % row)
        try:
            sample = torch.load(name, mmap=True, weights_only=True, map_location="cpu")
        except Exception as exc:  # a file cut short, not a torch file
            bad[row] = "does not load: %s" % _reason(exc)
            continue
        problem = _pt_shape_problem(sample, args["slots"], args["hidden_size"])
        if problem:
            bad[row] = problem
            continue
        tokens += int(sample["input_ids"].shape[0])
        paths[row] = name
    collate = create_collate_fn(args["max_len"])
    loaded = 0
    for row in args["load"]:
        if row not in paths:
            continue
        loaded += 1
        try:
            dataset = Eagle3SampleFileDataset(max_len=args["max_len"], file_list=[paths[row]])
            sample = dataset[0]
        except Exception as exc:  # what the trainer's worker would raise
            bad[row] = "the trainer's dataset fails on it: %s" % _reason(exc)
            continue
        problem = (_finite_problem(sample, ("hidden_states", "verifier_last_hidden_states"))
                   or _shape_problem(sample, args["slots"], args["hidden_size"]))
        if problem:
            bad[row] = problem
            continue
        try:
            collate([sample])
        except Exception as exc:  # the first batch holding it fails so
            bad[row] = "the trainer's collate fails on it: %s" % _reason(exc)
    return {"bad": bad, "tokens": tokens, "loaded": loaded, "data_rows": None}


def _pt_shape_problem(sample, slots, hidden_size):
    if not isinstance(sample, dict) or not {"input_ids", "hidden_states", "loss_mask"} <= set(sample):
        return "not a sample: input_ids, hidden_states and loss_mask expected"
    states, length = sample["hidden_states"], sample["input_ids"].shape[0]
    if not isinstance(states, list) or len(states) != slots:
        return "%s layer slot(s), the plan has %d" % (len(states) if isinstance(states, list) else "no", slots)
    for slot, state in enumerate(states):
        if state.dim() != 2 or state.shape[0] != length:
            return "layer slot %d is %s, expected [%d, hidden]" % (slot, list(state.shape), length)
        if hidden_size and state.shape[1] != hidden_size:
            return "layer slot %d has hidden size %d, the plan %d" % (slot, state.shape[1], hidden_size)
    if sample["loss_mask"].shape[0] != length:
        return "loss_mask has %d tokens, input_ids %d" % (sample["loss_mask"].shape[0], length)
    return None


def main(argv):
    if len(argv) != 1:
        sys.stderr.write("usage: trainer_load.py <args.json>\n")
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        args = json.load(handle)
    if args.get("format") not in ("safetensors", "pt"):
        sys.stderr.write("trainer_load: format %r: expected safetensors or pt\n" % args.get("format"))
        return 2
    import warnings

    warnings.simplefilter("ignore")  # the trainer's warnings are turned into reasons here
    found = check_arrow(args) if args["format"] == "safetensors" else check_pt(args)
    found["bad"] = dict((str(row), reason) for row, reason in sorted(found["bad"].items()))
    found["trainer"] = {"version": _speculators_version(),
                        "dataset_class": "ArrowDataset" if args["format"] == "safetensors" else "Eagle3SampleFileDataset"}
    sys.stdout.write(json.dumps(found) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
