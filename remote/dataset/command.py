"""The training command that fits a verified output, and what a trainer would refuse (stdlib only).

Which trainer reads what, from its own code:

- speculators 0.8 and later, `speculators train` (speculators.train.cli, 0.9.0): `--data-path` is the
  prepared dataset (Arrow, with input_ids, loss_mask, seq_len), `--hidden-states-path` the folder of
  hs_{row}.safetensors; `--target-layer-ids` are the auxiliary layers, the files' slots but the last (the
  verifier's last layer); fp8 files decode right only with `--hidden-states-backend fp8` (the default
  `file` backend casts them without their scales: wrong values, no error); a missing file is generated
  on demand against a vLLM endpoint unless `--on-missing` says otherwise. A draft vocabulary needs
  d2t-{n}.npy/t2d-{n}.npy in the data path, or token_freq.pt there with `--draft-vocab-size`.
- speculators 0.3 and 0.4, the repository's scripts/train.py: `--data-path` is searched recursively
  for every file ending in "pt", each taken for a sample (a stray token_freq.pt too); its draft's fc
  takes 3 x hidden (speculators/models/eagle3/core.py), so the files hold 4 slots; 0.3.0 loads
  `--d2t-path`/`--t2d-path` (default d2t.npy, t2d.npy in the working directory) unconditionally.
"""
import os

from base import versions

SAFETENSORS, PT = "safetensors", "pt"
#: The two trainer families: `speculators train` over Arrow rows, scripts/train.py over *.pt samples.
ARROW_TRAINER, SCRIPT_TRAINER = "speculators train", "scripts/train.py"
#: scripts/train.py's draft: fc is Linear(3 x hidden) (0.3.0, 0.4.0 speculators/models/eagle3/core.py).
SCRIPT_TARGET_LAYERS = 3
BACKENDS = ("file", "fp8")


def trainer_of(version):
    """The trainer family of a speculators version, or None where neither reads extraction outputs (0.5-0.7)."""
    if version is None:
        return None
    if versions.in_range(version, ">=0.8.0.dev0"):
        return ARROW_TRAINER
    if versions.in_range(version, "<0.5.0.dev0"):
        return SCRIPT_TRAINER
    return None


def refusals(*, file_format, trainer, storage, slots, layer_ids, num_hidden_layers, backend, target_layer_ids,
             stray_samples):
    """Each reason the trainer would refuse the output or silently train on wrong data, one line with its fix.

    backend, target_layer_ids: what the user asked for (None: what the files need); stray_samples: files
    under a scripts/train.py data path that end in "pt" without being samples (token_freq.pt)."""
    found = []
    if trainer == ARROW_TRAINER and file_format == PT:
        found.append("data_{i}.pt files are the output of speculators 0.3-0.4, which `speculators train` (0.8+) "
                     "cannot read: train them with 0.3-0.4's scripts/train.py, or extract again on this host (server "
                     "mode writes hs_{i}.safetensors)")
    if trainer == SCRIPT_TRAINER and file_format == SAFETENSORS:
        found.append("hs_{i}.safetensors files are server mode's (speculators 0.8+), which 0.3-0.4's scripts/train.py "
                     "cannot read: train them with `speculators train` of speculators >= 0.8")
    if backend is not None and file_format == SAFETENSORS and storage == "fp8" and backend != "fp8":
        found.append("--hidden-states-backend %r with fp8 files: the %r backend casts fp8 states without their "
                     "scales (wrong values, no error): use --hidden-states-backend fp8" % (backend, backend))
    if backend == "fp8" and storage != "fp8":
        found.append("--hidden-states-backend 'fp8' with %s files: use the 'file' backend" % storage)
    if layer_ids and num_hidden_layers is not None and layer_ids[-1] != num_hidden_layers:
        found.append("the files' last slot is layer %d, where the trainer takes the last slot for the verifier's "
                     "last layer (%d): extract again with layer ids ending in %d" % (layer_ids[-1], num_hidden_layers,
                                                                                    num_hidden_layers))
    if target_layer_ids is not None and layer_ids and list(target_layer_ids) != list(layer_ids[:-1]):
        found.append("--target-layer-ids %s do not match the files, which hold layers %s (the last one the verifier's "
                     "output): pass --target-layer-ids %s" % (
                         " ".join(map(str, target_layer_ids)), layer_ids, " ".join(map(str, layer_ids[:-1]))))
    if trainer == SCRIPT_TRAINER and slots is not None and slots - 1 != SCRIPT_TARGET_LAYERS:
        found.append("the files hold %d target layer(s) and the verifier's last, where scripts/train.py's draft "
                     "takes exactly %d: extract again with 3 layer ids (and the last layer)" % (slots - 1,
                                                                                              SCRIPT_TARGET_LAYERS))
    for path in stray_samples:
        found.append("%s lies inside the data path, where scripts/train.py takes every file ending in 'pt' for a "
                     "sample: move it out (keep it for the vocabulary mapping)" % path)
    return found


def vocabulary(data_path, file_format, search):
    """The vocab-mapping files the training will use, present or named: {"options", "present", "note"}."""
    if file_format == PT:
        pairs = [("d2t.npy", "t2d.npy")]
        present = [name for pair in pairs for name in pair if os.path.exists(os.path.join(search, name))]
        if len(present) == 2:
            return {"options": ["--d2t-path", os.path.join(search, "d2t.npy"), "--t2d-path",
                                os.path.join(search, "t2d.npy")], "present": present, "note": None}
        return {"options": [], "present": present,
                "note": "scripts/train.py 0.3.0 loads --d2t-path/--t2d-path (default d2t.npy, t2d.npy) unconditionally: "
                        "build them with speculators' vocab mapping from the token frequencies and pass both"}
    names = sorted(os.listdir(data_path)) if data_path and os.path.isdir(data_path) else []
    sizes = sorted(int(name[4:-4]) for name in names
                   if name.startswith("d2t-") and name.endswith(".npy") and name[4:-4].isdigit()
                   and "t2d-%s.npy" % name[4:-4] in names)
    if sizes:
        return {"options": ["--draft-vocab-size", str(sizes[-1])],
                "present": ["d2t-%d.npy" % sizes[-1], "t2d-%d.npy" % sizes[-1]], "note": None}
    if "token_freq.pt" in names:
        return {"options": [], "present": ["token_freq.pt"],
                "note": "token_freq.pt is there: add --draft-vocab-size N for a draft vocabulary of N tokens"}
    return {"options": [], "present": [],
            "note": "no token_freq.pt nor d2t/t2d in the data path: the draft gets the verifier's full vocabulary "
                    "(prepare-data --no-skip-token-freq writes token_freq.pt; or pass --d2t-path and --t2d-path)"}


#: speculators 0.9's trainer under torch 2.11: its draft's torch.compile traces the fused loss's triton kernels,
#: and dynamo stops ("ListVariable(length=21) is already tracked for mutation", speculators/losses/fused.py:343)
#: before the first step. Found on the H200 (benchmarks/gpu/results/train-h200-2026-12-03.json), where the
#: command trained with dynamo off. Only the pair seen is named: no other torch has run the trainer on a GPU here
#: (the lab, torch 2.13 on the CPU, has no accelerator for it).
COMPILE_FAILS = {"speculators": ">=0.9.0.dev0,<0.10.0.dev0", "torch": ">=2.11.0.dev0,<2.12.0.dev0"}
NO_DYNAMO = "TORCHDYNAMO_DISABLE=1"


def environment(*, trainer, speculators, torch):
    """What the training command needs in its environment on this host, and the note that says why:
    ([NAME=VALUE ...], [note ...])."""
    if (trainer == ARROW_TRAINER and speculators and torch
            and versions.in_range(speculators, COMPILE_FAILS["speculators"])
            and versions.in_range(torch.split("+")[0], COMPILE_FAILS["torch"])):
        return [NO_DYNAMO], [
            "speculators %s under torch %s stops in torch.compile of its fused loss before the first step: the "
            "command runs with %s; without compile the draft takes more memory, so lower --total-seq-len (default "
            "8192) if it runs out (2048 trained the 8B shape on one H200)" % (speculators, torch, NO_DYNAMO)]
    return [], []


def training_command(*, trainer, model, data_path, hidden_states_path, layer_ids, storage, save_path, vocab,
                     env=()):
    """The words of the training command for the output, or None when no trainer of the host reads it; `env`
    (NAME=VALUE words, environment()) goes in front through env(1)."""
    if trainer == ARROW_TRAINER:
        words = (["env", *env] if env else []) + ["speculators", "train", "--verifier-name-or-path", model, "--data-path", data_path,
                 "--hidden-states-path", hidden_states_path,
                 "--target-layer-ids"] + [str(layer) for layer in layer_ids[:-1]]
        if storage == "fp8":
            words += ["--hidden-states-backend", "fp8"]
        # Every row was verified present: a file gone later must stop the training, not start a generation
        # against a vLLM endpoint that is not there.
        return words + ["--on-missing", "raise"] + vocab["options"] + ["--save-path", save_path]
    if trainer == SCRIPT_TRAINER:
        return (["python", "scripts/train.py", "--verifier-name-or-path", model, "--data-path", hidden_states_path]
                + vocab["options"] + ["--save-path", save_path])
    return None


def shell_line(words):
    """The command as one line for a POSIX shell, each word that needs it single-quoted."""
    safe = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%")
    return " ".join(word if word and set(word) <= safe else "'" + word.replace("'", "'\\''") + "'" for word in words)


def option(words, name, default=None):
    """The value of option `name` in a training command's words, `--name VALUE` or `--name=VALUE`; the last one
    given, as speculators' argument parser takes it; else `default`."""
    value = default
    for index, word in enumerate(words):
        if word == name and index + 1 < len(words):
            value = words[index + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value
