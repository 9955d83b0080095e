"""The `dataset.verify` remote command: is an extraction output trainable by the host's speculators, and with
which command (stdlib only; the trainer's own loading code runs in dataset/trainer_load.py).

    dataset.verify {"workdir", "run": id|null, "out": [dir, ...]|null, "data": dir|null, "full": bool,
                    "backend": "file"|"fp8"|null, "target_layer_ids": [int]|null}

The output is one or several *shares*: a run's output directory; every run on this host of a sharded run
or a Slurm job array (their id); or the directories of `out`, each a shard (a run that wrote it gives its
plan, else the directory's own record: specrig-layers.json, data_config.json). For every row a share must
hold: its file is there, its header and size are whole, its layer slots and hidden size are the plan's, its
storage type is the one recorded; no file is extra, no row held twice; the shares agree on the storage type
and the layers. Then the trainer's code loads rows (a sample of them; every one with `full`), and the command
that fits is written beside the output (`specrig-train-command.sh`) and returned. Shares in several directories
are linked into one (`specrig-train-merged-<digest>`, beside them): the trainer reads one.
"""
import getpass
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

from base import atomic, contract, nodes, outputs, pkgmeta, prepared, rundir
from base.failure import RemoteFailure
from dataset import command

#: The program that runs the trainer's loading code (this file is remote/dataset/verify.py).
TRAINER_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer_load.py")
TRAINER_TIMEOUT_S = 3600
#: Rows loaded whole by the trainer's code without `full`: spread over the output, the first and last among them.
SAMPLE_ROWS = 16
#: The file verify-dataset writes beside the output: the training command, for a shell.
COMMAND_FILE = "specrig-train-command.sh"
#: The verdict beside the command, for `inv train` (run/training/launch.py): trainable or not, the command, the
#: counts, and the states' fingerprint then, so that states changed since are verified again before a training.
VERDICT_FILE = "specrig-verified.json"
#: The sample files of either format (server mode's hs_{i}.safetensors, in-process data_{i}.pt).
SAMPLE_NAME = re.compile(r"^(?:hs_[0-9]+\.safetensors|data_[0-9]+\.pt)$")
#: The collate's buffer length in the check: speculators train's --total-seq-len default.
MAX_LEN = 8192
LAYERS_FILE = "specrig-layers.json"
PT_SAMPLE = ("data_", ".pt")


def verify(args):
    workdir = rundir.workdir_of(args)
    backend = args.get("backend")
    if backend is not None and backend not in command.BACKENDS:
        raise RemoteFailure("bad-argument", "--hidden-states-backend %r: expected one of %s"
                            % (backend, ", ".join(command.BACKENDS)))
    shares = _shares(workdir, args)
    file_format = _one_format(shares)
    found_versions = pkgmeta.versions(["speculators", "torch"])
    version = found_versions["speculators"]
    trainer = command.trainer_of(version)
    plan = shares[0]["plan"]
    problems, bad = [], {}
    if not args.get("at_run_end"):  # the run's own end verifies it before its state says so
        problems += ["run %s is %s: its output is not whole yet; verify it once it ends" % (share["run_id"],
                                                                                           share["state"])
                     for share in shares if share["state"] in contract.ACTIVE_STATES]
    for share in shares:
        _check_headers(share, file_format, bad, problems)
    _check_agreement(shares, bad, problems)
    held = {}
    for share in shares:
        for row in share["held"]:
            held.setdefault(row, []).append(share["out"])
    for row, outs in sorted(held.items()):
        if len(outs) > 1:
            bad.setdefault(row, "held twice: in %s" % " and ".join(outs))
    data_path = args.get("data") or plan.get("data_path")
    if file_format == command.SAFETENSORS and not data_path:
        raise RemoteFailure("bad-argument", "%s: no run of this host wrote it, so its prepared dataset is unknown: "
                                            "pass --data with prepare-data's output directory" % shares[0]["out"])
    total = _dataset_rows(shares, file_format, data_path) if _whole(shares) else None
    for row in range(total or 0):
        if row not in held and row not in bad:
            bad[row] = "no file: %s is missing" % _file(file_format, row)
    stray = _stray_samples(shares) if file_format == command.PT else []
    refused = command.refusals(file_format=file_format, trainer=trainer, storage=plan["storage"],
                               slots=plan["slots"], layer_ids=plan["layer_ids"],
                               num_hidden_layers=plan.get("num_hidden_layers"), backend=backend,
                               target_layer_ids=args.get("target_layer_ids"), stray_samples=stray)
    reads = (trainer, file_format) in ((command.ARROW_TRAINER, command.SAFETENSORS), (command.SCRIPT_TRAINER, command.PT))
    loaded = _trainer_loads(shares, file_format, plan, data_path, bad, full=bool(args.get("full"))) if reads else {}
    if data_path and file_format == command.SAFETENSORS and not os.access(data_path, os.W_OK):
        problems.append("the data path %s is not writable: the trainer writes its vocab mappings there; copy it "
                        "somewhere writable and pass that as --data-path" % data_path)
    # The trainer reads one directory: the shards of a job array (or several --out) are linked into one.
    search = shares[0]["out"] if len(set(share["out"] for share in shares)) == 1 else _merged(shares, file_format)
    vocab = command.vocabulary(data_path, file_format, search)
    env, notes = command.environment(trainer=trainer, speculators=version, torch=found_versions["torch"])
    words = command.training_command(env=env,
        trainer=trainer, model=plan.get("model") or "<the verifier model>", data_path=data_path,
        hidden_states_path=search, layer_ids=plan["layer_ids"], storage=plan["storage"],
        save_path=os.path.join(os.path.dirname(search.rstrip("/")), os.path.basename(search.rstrip("/")) + "-draft"),
        vocab=vocab) if not refused else None
    trainable = not refused and not bad and not problems
    result = {
        "format": file_format, "full": bool(args.get("full")),
        "trainer": dict(loaded.get("trainer") or {}, version=version, command=trainer),
        "plan": {key: plan.get(key) for key in ("layer_ids", "hidden_size", "storage", "model", "num_hidden_layers")},
        "shares": [{key: share[key] for key in ("run_id", "out", "state", "shard", "expected", "storage_recorded")}
                   for share in shares],
        "partial": not _whole(shares),
        "counts": {"rows": max(total or 0, len(held), sum(share["expected"] for share in shares)), "files": len(held),
                   "tokens": loaded.get("tokens", 0), "bytes": sum(share["bytes"] for share in shares),
                   "loaded": loaded.get("loaded", 0)},
        "bad": [{"row": row, "reason": reason} for row, reason in sorted(bad.items())],
        "extra": [name for share in shares for name in share["extra"]],
        "problems": problems, "refusals": refused, "vocab": vocab, "notes": notes, "data_path": data_path,
        "held": sorted(held),
        "merged": None if search == shares[0]["out"] else search,
        "command": words, "command_line": command.shell_line(words) if words else None, "command_file": None,
        "trainable": trainable,
    }
    if words:
        result["command_file"] = _write_command(search, result)
        _write_verdict(search, result)
    return result


# -- the shares -------------------------------------------------------------------------------------

def _shares(workdir, args):
    outs = args.get("out")
    if outs:
        found = []
        for out in outs:
            out = os.path.abspath(os.path.expanduser(out))
            if not os.path.isdir(out):
                raise RemoteFailure("bad-argument", "--out %r is not a directory on this host" % out)
            _listable(out, "--out %r" % out)
            run = _run_that_wrote(workdir, out)
            found.append(_share(run, out) if run else _share_of_directory(out))
        return found
    run_id = args.get("run")
    group = [run for run in rundir.all_runs(workdir) if run_id and rundir.group_id(run) == run_id]
    runs = group if len(group) > 1 else [rundir.find_run(workdir, run_id)]
    found = []
    for run in runs:
        out = (run.record.get("server") or {}).get("out") or run.record.get("out")
        if not out or not os.path.isdir(out):
            raise RemoteFailure("bad-argument", "run %s: its output %r is not there" % (run.run_id, out))
        _listable(out, "run %s: its output %r" % (run.run_id, out))
        found.append(_share(run, out))
    return found


def _listable(out, named):
    """Refuses an output directory this host's user cannot list (mode 000, another user's 0700): its files could
    be neither counted nor read."""
    if not os.access(out, os.R_OK | os.X_OK):
        raise RemoteFailure("bad-argument", "%s cannot be listed by this host's user %s: give it read access (chmod "
                                            "u+rx; a+rx for another user's) or verify as its owner"
                            % (named, getpass.getuser()))


def _run_that_wrote(workdir, out):
    for run in reversed(rundir.all_runs(workdir)):
        if os.path.abspath(os.path.expanduser(run.record.get("out") or "")) == out:
            return run
    return None


def _share(run, out):
    """One run's output: its plan from run.json (server mode) or data_config.json (in process)."""
    server = run.record.get("server")
    if not server:
        share = _share_of_directory(out)
        share.update(run_id=run.run_id, state=run.state())
        share["plan"].setdefault("model", (run.record.get("driver_args") or {}).get("model"))
        return share
    shard = run.record.get("shard") or {}
    total = run.status.get("samples_total")
    if total is None and prepared.complete(server["prepared"]):
        total = prepared.rows(server["prepared"])
    rows = prepared.shard_indices(total or 0, server.get("max_samples"), shard.get("shard_count") or 1,
                                shard.get("shard_index") or 0, server.get("clients", 1))
    recorded = _layers_record(out).get("storage") or server.get("storage")
    plan = {"layer_ids": server["layer_ids"], "hidden_size": server.get("hidden_size"), "storage": recorded or "bf16",
            "model": server.get("model") or (run.record.get("driver_args") or {}).get("model"),
            "num_hidden_layers": server.get("num_hidden_layers"), "data_path": server.get("prepared")}
    share = _completed({"run_id": run.run_id, "state": run.state(), "out": out, "rows": rows, "plan": plan,
                        "storage_recorded": recorded, "dataset_rows": total,
                        "shard": _shard(shard.get("shard_index"), shard.get("shard_count"))})
    if shard.get("shared_out"):
        # One directory holds every shard's files: the others' rows are theirs, not extra here.
        share["others"] = set(prepared.shard_indices(total or 0, server.get("max_samples"))) - set(rows)
    return share


def _share_of_directory(out):
    """An output directory on its own: server mode's specrig-layers.json, or in-process data_config.json."""
    record = _layers_record(out)
    if record:
        plan = {"layer_ids": record.get("layer_ids"), "hidden_size": record.get("hidden_size"),
                "storage": record.get("storage") or "bf16", "model": record.get("model"),
                "num_hidden_layers": record.get("num_hidden_layers"), "data_path": None}
        return _completed({"run_id": record.get("run_id"), "state": None, "out": out, "rows": None, "plan": plan,
                           "storage_recorded": record.get("storage"), "dataset_rows": None, "shard": None})
    config = _json(os.path.join(out, "data_config.json"))
    if not config:
        raise RemoteFailure("bad-argument", "%s holds neither %s (server mode) nor data_config.json (in process): "
                                            "not an output specrig wrote; name the run with --run" % (out, LAYERS_FILE))
    mine = config.get("specrig") or {}
    total = mine.get("dataset_samples") or (config.get("data") or {}).get("num_samples") or 0
    count, index = mine.get("shard_count"), mine.get("shard_index")
    rows = list(range(index, total, count)) if count else list(range((config.get("data") or {}).get("num_samples") or 0))
    layer_ids = mine.get("layer_ids") or (config.get("hidden_states") or {}).get("layer_ids")
    plan = {"layer_ids": layer_ids, "hidden_size": (config.get("model") or {}).get("hidden_size"),
            "storage": "bf16", "model": (config.get("model") or {}).get("target_model_path"),
            "num_hidden_layers": None, "data_path": None}
    return _completed({"run_id": None, "state": None, "out": out, "rows": rows, "plan": plan,
                       "storage_recorded": "bf16", "dataset_rows": total, "shard": _shard(index, count)})


def _completed(share):
    plan = share["plan"]
    if not plan.get("layer_ids"):
        raise RemoteFailure("bad-argument", "%s: its layer ids are recorded nowhere (run.json, %s, data_config.json)"
                                            % (share["out"], LAYERS_FILE))
    plan["slots"] = len(plan["layer_ids"])
    share.update(held=[], extra=[], bytes=0, expected=0, others=set())
    return share


def _shard(index, count):
    return None if count is None else {"index": index, "count": count}


def _layers_record(out):
    return _json(os.path.join(out, LAYERS_FILE)) or {}


def _json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _one_format(shares):
    formats = set()
    for share in shares:
        names = os.listdir(share["out"])
        if any(outputs.FILE_PATTERN.match(name) for name in names):
            formats.add(command.SAFETENSORS)
        if any(_pt_index(name) is not None for name in names):
            formats.add(command.PT)
    if len(formats) != 1:
        raise RemoteFailure("bad-argument", "%s: %s" % (", ".join(share["out"] for share in shares),
                                                        "no hs_{i}.safetensors nor data_{i}.pt files" if not formats
                                                        else "both hs_{i}.safetensors and data_{i}.pt files"))
    return formats.pop()


def _pt_index(name):
    prefix, suffix = PT_SAMPLE
    middle = name[len(prefix):-len(suffix)] if name.startswith(prefix) and name.endswith(suffix) else ""
    return int(middle) if middle.isdigit() else None


# -- the checks ---------------------------------------------------------------------------------------

def _check_headers(share, file_format, bad, problems):
    """Every row of the share: its file there, whole, of the plan's slots, hidden size and recorded storage."""
    out, plan = share["out"], share["plan"]
    if file_format == command.SAFETENSORS:
        present = outputs.existing_indices(out)
    else:
        present = sorted(index for index in map(_pt_index, os.listdir(out)) if index is not None)
    rows = share["rows"] if share["rows"] is not None else present
    share["expected"] = len(rows)
    wanted = set(rows)
    share["extra"] = [_file(file_format, index) for index in present if index not in wanted
                      and index not in share["others"]]
    for name in share["extra"]:
        problems.append("%s: %s is no row of this output (extra)" % (out, name))
    if share["storage_recorded"] is None:
        problems.append("%s: the storage type is recorded nowhere (run.json, %s): the command cannot say which "
                        "backend decodes the files" % (out, LAYERS_FILE))
    for row in rows:
        found, size = _file_status(os.path.join(out, _file(file_format, row)), file_format, plan)
        if found["status"] == outputs.MISSING:
            bad[row] = "no file: %s is missing" % _file(file_format, row)
            continue
        share["held"].append(row)
        share["bytes"] += size
        if found["status"] != outputs.OK:
            bad[row] = outputs.reason(found)


def _file_status(path, file_format, plan):
    """(outputs' status of a row's file, its size): a safetensors header checked against the plan; of a data_{i}.pt,
    whether this user can open it (torch reads it, in trainer_load.py). A file this user cannot read (mode 000,
    another user's) is an unreadable row, never a traceback."""
    try:
        size = os.path.getsize(path)
        if file_format == command.PT:
            open(path, "rb").close()
            return {"status": outputs.OK, "detail": ""}, size
    except OSError as error:
        return outputs.os_error_status(error), 0
    return outputs.check_file(path, n_layers=plan["slots"], hidden_size=plan["hidden_size"], scan_values=False,
                              storage=plan["storage"]), size


def _whole(shares):
    """Whether the shares are every shard of their dataset (a host of a sharded run over several holds one)."""
    shards = [share["shard"] for share in shares if share["shard"] is not None]
    return not shards or set(shard["index"] for shard in shards) == set(range(shards[0]["count"]))


def _dataset_rows(shares, file_format, data_path):
    """The rows of the dataset the shares are of: prepare-data's output's (what `speculators train` reads), else
    what the runs recorded; None when nothing says (an output known by its files alone)."""
    if file_format == command.SAFETENSORS and data_path and prepared.complete(data_path):
        try:
            return prepared.rows(data_path)
        except prepared.PreparedDataError:
            pass
    counts = [share["dataset_rows"] for share in shares if share["dataset_rows"] is not None]
    return max(counts) if counts else None


def _file(file_format, index):
    return outputs.file_name(index) if file_format == command.SAFETENSORS else "%s%d%s" % (PT_SAMPLE[0], index,
                                                                                           PT_SAMPLE[1])


def _check_agreement(shares, bad, problems):
    """The shares of one training: one storage type, one set of layers; a row of a disagreeing share is named."""
    first = shares[0]
    for share in shares[1:]:
        for key, what in (("storage", "storage type"), ("layer_ids", "layer ids"), ("hidden_size", "hidden size")):
            if share["plan"].get(key) != first["plan"].get(key):
                for row in share["held"]:
                    bad.setdefault(row, "its shard %s has %s %s, the shard %s %s: one training reads one" % (
                        share["out"], what, share["plan"].get(key), first["out"], first["plan"].get(key)))
                problems.append("the shards differ in %s: %s has %s, %s %s" % (
                    what, first["out"], first["plan"].get(key), share["out"], share["plan"].get(key)))


def _stray_samples(shares):
    """Files under a scripts/train.py data path that end in "pt" without being data_{i}.pt (token_freq.pt)."""
    stray = []
    for share in shares:
        for root, _, names in os.walk(share["out"]):
            for name in names:
                if name.endswith("pt") and not (root == share["out"] and _pt_index(name) is not None):
                    stray.append(os.path.join(root, name))
    return sorted(stray)


def _sample(rows):
    if len(rows) <= SAMPLE_ROWS:
        return list(rows)
    step = (len(rows) - 1) / (SAMPLE_ROWS - 1)
    return sorted(set(rows[round(i * step)] for i in range(SAMPLE_ROWS)))


def _trainer_loads(shares, file_format, plan, data_path, bad, *, full):
    """trainer_load.py's answer over each share (its rows whose header was whole); its bad rows join `bad`."""
    answer = {"tokens": 0, "loaded": 0, "data_rows": None, "trainer": None}
    for share in shares:
        rows = [row for row in share["held"] if row not in bad]
        found = _run_program({"format": file_format, "hidden_states_path": share["out"], "data_path": data_path,
                              "storage": plan["storage"], "rows": rows, "load": rows if full else _sample(rows),
                              "slots": plan["slots"], "hidden_size": plan["hidden_size"], "max_len": MAX_LEN})
        for row, reason in found["bad"].items():
            bad[int(row)] = reason
        answer["tokens"] += found["tokens"]
        answer["loaded"] += found["loaded"]
        answer["data_rows"] = found.get("data_rows")
        answer["trainer"] = found["trainer"]
    return answer


def _run_program(arguments):
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="specrig-dataset-", delete=False) as handle:
        json.dump(arguments, handle)
    try:
        done = subprocess.run([sys.executable, TRAINER_PROGRAM, handle.name], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=TRAINER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RemoteFailure("timeout", "the trainer's loading code took longer than %d s" % TRAINER_TIMEOUT_S) from None
    finally:
        os.unlink(handle.name)
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RemoteFailure("verify-failed", "the trainer's loading code (%s) failed (exit %s): %s"
                            % (sys.executable, done.returncode, done.stderr.decode(errors="replace").strip()[-500:]),
                            traceback=done.stderr.decode(errors="replace")[-4000:])
    return json.loads(lines[-1])


def _merged(shares, file_format):
    """A directory of links to every share's files, beside the shares (the same one for the same shares):
    what the trainer's one --hidden-states-path (0.3-0.4: --data-path) reads. Links left from an earlier
    verification are replaced."""
    outs = sorted(set(share["out"] for share in shares))
    digest = hashlib.sha256("\0".join(outs).encode()).hexdigest()[:8]
    merged = os.path.join(os.path.commonpath(outs), "specrig-train-merged-%s" % digest)
    os.makedirs(merged, mode=0o700, exist_ok=True)
    for name in os.listdir(merged):
        if os.path.islink(os.path.join(merged, name)):
            os.unlink(os.path.join(merged, name))
    for share in shares:
        for row in share["held"]:
            name = _file(file_format, row)
            try:
                os.symlink(os.path.join(share["out"], name), os.path.join(merged, name))
            except FileExistsError:  # made meanwhile by a verification on another host of the same storage
                pass
    return merged


def _write_command(out, result):
    """The command beside the output, for a shell; its path (0600: hosts are shared)."""
    path = os.path.join(out, COMMAND_FILE)
    verdict = "trainable" if result["trainable"] else "NOT trainable: see `inv verify-dataset`"
    text = "#!/bin/sh\n# written by specrig verify-dataset: %d rows, %s\n%s\n" % (
        result["counts"]["rows"], verdict, result["command_line"])
    # A temporary file of this process's own: the hosts of a sharded run with one shared --out verify at once
    # and write this same file (one fixed temporary name let one host's rename take the other's file away).
    atomic.write_bytes(path, text.encode(), mode=atomic.PRIVATE)
    return path


def _write_verdict(out, result):
    """The verdict file (VERDICT_FILE, 0600) beside the command: what a training's launch reads."""
    files = result["counts"]["files"]
    verdict = {"trainable": result["trainable"], "verified_at": rundir.now_iso(), "full": result["full"],
               "command": result["command"], "counts": result["counts"], "plan": result["plan"],
               "bad_rows": len(result["bad"]), "problems": result["refusals"] + result["problems"],
               "notes": result["notes"], "vocab": result["vocab"], "hidden_states_path": out,
               # The rows' tokens (every row's token ids are read) over the rows: a training plans its steps
               # per epoch with it.
               "tokens_per_row": result["counts"]["tokens"] / files if files else None,
               "fingerprint": fingerprint(out)}
    atomic.write_bytes(os.path.join(out, VERDICT_FILE), json.dumps(verdict, indent=1).encode(), mode=atomic.PRIVATE)


def fingerprint(out):
    """{"files", "bytes", "newest"} of the sample files in `out` (links followed: a merged directory's are
    links): two fingerprints differ when a file was added, removed, rewritten or grew since."""
    files = size = 0
    newest = 0.0
    try:
        with os.scandir(out) as entries:
            for entry in entries:
                if not SAMPLE_NAME.match(entry.name):
                    continue
                try:
                    stat = entry.stat()
                except OSError:
                    continue
                files, size, newest = files + 1, size + stat.st_size, max(newest, stat.st_mtime)
    except OSError:
        return None
    return {"files": files, "bytes": size, "newest": newest}


def at_run_end(run):
    """What a run's end records of its dataset (exit.json's "dataset"): the verdict of `verify` on the run, in
    a few fields, or why it could not be had; None for a multi-node job's worker, whose head holds the output,
    and for a run that extracts nothing (a training, an acceptance measurement).
    Never raises: a run's end is not the place to fail."""
    if (run.record.get("nodes") or {}).get("role") == nodes.WORKER or contract.run_kind(run.record) != contract.KIND_EXTRACT:
        return None
    try:
        found = verify({"workdir": os.path.dirname(os.path.dirname(run.path.rstrip("/"))), "run": run.run_id,
                        "at_run_end": True})
    except RemoteFailure as failure:
        return {"verified": False, "error": "%s: %s" % (failure.kind, failure.message)}
    except Exception as exc:  # a bug of the check must not change the run's outcome
        return {"verified": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    return {"verified": True, "trainable": found["trainable"], "rows": found["counts"]["rows"],
            "bad_rows": len(found["bad"]), "problems": found["refusals"] + found["problems"],
            "command_file": found["command_file"]}
