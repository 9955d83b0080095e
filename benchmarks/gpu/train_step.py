"""Issue 28's device phase: an extraction output checked by `inv verify-dataset --full`, then a few steps of the
training command it printed, on the GPU. The phase `train[:DIR]` of device_run.py:

    bash .gpu/tree/benchmarks/gpu/device.sh prep train            (a short extraction of N_TRAIN rows first)
    bash .gpu/tree/benchmarks/gpu/device.sh train:/var/tmp/sg/out/extract    (an output already there)

What it records in the results (key "train"), each step's argv, exit, seconds and what it found:

- `extraction`: without DIR, `inv extract --host local` of N_TRAIN rows (default 64) of the SHAPE model (the
  8B shape), waited for to its end; the run's own end says whether its dataset verified (exit.json "dataset");
- `verify`: `inv verify-dataset --host local --run RUN --full --json` (or `--out DIR`): the verdict, the counts,
  every bad row, the command;
- `training`: the printed command's words, plus `--max-steps TRAIN_STEPS --epochs 1 --no-resume-from-checkpoint`
  (and `--num-workers 2`: the check, not the loader's throughput), run to its end; the loss values its log
  shows, whether each is finite; the checkpoint under the command's --save-path (`0/`, the epoch's), its
  files, and whether every tensor of its safetensors is finite (a NaN loss leaves NaN weights).

The trainer's log goes to $SG/extras/train.log (device.sh packs the extras). Pass: verify exit 0, training
exit 0, at least one loss and all finite, the checkpoint written and finite (`passed`). The results file that
comes back is committed as benchmarks/gpu/results/train-h200-<date>.json, which tests/dataset/test_train_results.py
checks.
"""
import glob
import json
import math
import os
import re
import subprocess
import time

N_TRAIN = int(os.environ.get("N_TRAIN", "64"))
TRAIN_STEPS = int(os.environ.get("TRAIN_STEPS", "4"))
TRAIN_TIMEOUT_S = int(os.environ.get("TRAIN_TIMEOUT_S", "420"))
#: More of the trainer's options for the step (recorded in its argv), e.g. "--total-seq-len 2048".
TRAIN_EXTRA = os.environ.get("TRAIN_EXTRA", "")
#: A loss value as the trainer's metric log prints it: key=value pairs through rich's logging handler
#: (speculators 0.9.0 on the H200, 2026-12-03: "train/loss_0=1.637, ..., train/loss=4.914", at the epoch's end
#: "val/loss_epoch=4.893"). Not 'ttt_step_loss_decay' nor the accuracies: the key is loss itself.
LOSS = re.compile(r"\b(?:train|val)/loss(?:_\d+)?(?:_epoch)?=([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))")


def phase_train(spec, *, harness):
    """The phase; `harness` is harness.py: inv, log, record, extract_args, wait_run, run_state,
    FINAL, SG, EXTRAS."""
    entry = {"steps": TRAIN_STEPS}
    harness.record("train", entry)
    given = spec.split(":", 1)[1] if ":" in spec else None
    if given:
        verify = harness.inv("verify-dataset", "--host", "local", "--out", given, "--full", "--json", timeout=900)
    else:
        run_id = _short_extraction(harness, entry)
        if run_id is None:
            return
        verify = harness.inv("verify-dataset", "--host", "local", "--run", run_id, "--full", "--json", timeout=900)
    found = verify["json"] or {}
    entry["verify"] = dict({key: verify[key] for key in ("argv", "exit", "seconds", "stderr_tail")},
                           **{key: found.get(key) for key in ("trainable", "counts", "bad", "problems", "refusals",
                                                              "trainer", "plan", "command", "command_file")})
    harness.record("train", entry)
    harness.log("verify-dataset: exit %d, %s" % (verify["exit"], json.dumps(found.get("counts"))))
    if verify["exit"] != 0 or not found.get("command"):
        harness.log("not trainable: no training step")
        return
    words = found["command"] + ["--max-steps", str(TRAIN_STEPS), "--epochs", "1", "--no-resume-from-checkpoint",
                                "--num-workers", "2", "--log-dir", os.path.join(harness.SG, "train-logs")]
    words += TRAIN_EXTRA.split()
    save_path = words[words.index("--save-path") + 1]
    entry["training"] = _train(harness, words)
    entry["checkpoint"] = _checkpoint(save_path)
    training = entry["training"]
    entry["passed"] = bool(training["exit"] == 0 and training["losses"] and training["losses_finite"]
                           and entry["checkpoint"]["written"] and entry["checkpoint"]["finite"])
    harness.record("train", entry)
    harness.log("training: exit %d in %.0f s, losses %s, checkpoint %s; passed %s" % (
        training["exit"], training["seconds"], training["losses"][:8], entry["checkpoint"]["files"][:4],
        entry["passed"]))


def _short_extraction(harness, entry, rows=None, key="train", name="train", data=None):
    """`inv extract --host local` of `rows` (N_TRAIN) rows of `data` (the call's DATA) into $SG/out/`name`,
    waited for to its end, recorded in `entry["extraction"]` under the results' `key`: the run's id when it
    succeeded, else None (train_accept_phase.py shares it)."""
    rows = rows or N_TRAIN
    out = os.path.join(harness.SG, "out", name)
    subprocess.run(["rm", "-rf", out], check=False)
    launched = harness.inv(*harness.extract_args(out, rows, data=data), timeout=600)
    info = launched["json"] or {}
    entry["extraction"] = {"argv": launched["argv"], "exit": launched["exit"], "seconds": launched["seconds"],
                           "run_id": info.get("run_id"), "rows": rows, "data": data or harness.DATA}
    harness.record(key, entry)
    if not info.get("launched"):
        harness.log("extract did not launch: %s" % json.dumps(launched)[:3000])
        return None
    started = time.time()
    harness.wait_run(info["path"], lambda beat, status: harness.run_state(info["path"]) in harness.FINAL, timeout=600)
    harness.keep_run_files(name, info["path"])  # its logs come back with the extras, whatever its end
    ended = _read_json(os.path.join(info["path"], "exit.json"))
    entry["extraction"].update(state=ended.get("state"), wait_s=round(time.time() - started, 1),
                               dataset_at_run_end=ended.get("dataset"))
    harness.record(key, entry)
    harness.log("extraction %s: %s; its end says %s" % (info["run_id"], ended.get("state"), ended.get("dataset")))
    return info["run_id"] if ended.get("state") == "succeeded" else None


def _train(harness, words):
    log_path = os.path.join(harness.EXTRAS, "train.log")
    os.makedirs(harness.EXTRAS, exist_ok=True)
    started = time.time()
    with open(log_path, "w") as log_file:
        try:
            # Wide: rich wraps the logged metric dicts at the console's width, and a wrap can split a key from its value.
            code = subprocess.run(words, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=TRAIN_TIMEOUT_S, env=dict(os.environ, COLUMNS="1000")).returncode
        except subprocess.TimeoutExpired:
            code = 124
        except FileNotFoundError as exc:  # no `speculators` on PATH
            log_file.write(str(exc))
            code = 127
    with open(log_path, errors="replace") as log_file:
        text = log_file.read()
    losses = [_number(value) for value in LOSS.findall(text)]
    return {"argv": words, "exit": code, "seconds": round(time.time() - started, 1), "losses": losses,
            "losses_finite": all(math.isfinite(value) for value in losses), "log_tail": text[-3000:]}


def _number(text):
    try:
        return float(text)
    except ValueError:
        return float("nan") if text.lower() == "nan" else float("inf")


def _checkpoint(save_path):
    """The epoch's checkpoint the trainer wrote under `save_path`: its files, and every tensor finite."""
    files = sorted(os.path.relpath(path, save_path) for path in glob.glob(os.path.join(save_path, "**", "*"),
                                                                          recursive=True) if os.path.isfile(path))
    weights = glob.glob(os.path.join(save_path, "*", "*.safetensors"))
    finite = None
    if weights:
        from safetensors.torch import load_file

        finite = all(bool(tensor.float().isfinite().all()) for path in weights
                     for tensor in load_file(path).values())
    return {"path": save_path, "written": bool(weights), "files": files, "finite": finite}


def _read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}
