"""`inv verify-dataset` against the trainer's own data loading, on one real server-mode output of the lab.

    python benchmarks/bench_verify_dataset.py RUN_ID [HOST]        (default host: lab-server)

Three timings of the same output, in one run, after one untimed verify-dataset (the bundle uploaded, the files
in the page cache, as for the anchor):

- `inv verify-dataset --host HOST --run RUN_ID` (the default: every row's header, size and token ids, the
  trainer's dataset and collate over a sample of 16 rows), wall time through SSH, as a user runs it;
- the same with `--full` (the trainer's code over every row);
- the anchor: a bare loop of speculators' own `ArrowDataset` (the transfer the files need) and `CollateFn` over
  every row, in the host's python, nothing else: what the training's first epoch reads before any step.

It prints the seconds and ours/anchor for both: what checking on every run costs against reading the data once.
Needs the lab (`inv lab.up --runnable`) and a run of HOST that succeeded (`inv status --host HOST`).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.expanduser("~specrig/specrig-work/runs")
ANCHOR = """
import sys, json, pathlib, time
from hs_connectors.transfer import FileTransfer, FP8Transfer
from speculators.models.eagle3.data import shift_batch
from speculators.train.data import ArrowDataset, CollateFn
plan = json.loads(sys.argv[1])
transfer = (FP8Transfer if plan["storage"] == "fp8" else FileTransfer)(pathlib.Path(plan["out"]))
started = time.perf_counter()
dataset = ArrowDataset(max_len=8192, datapath=plan["prepared"], on_missing="raise", train_ratio=1.0, transfer=transfer)
collate = CollateFn(8192, plan["hidden_size"], num_target_layers=len(plan["layer_ids"]) - 1, preprocess=shift_batch)
for row in range(len(dataset)):
    collate([dataset[row]])
print(json.dumps({"rows": len(dataset), "seconds": time.perf_counter() - started}))
"""


def timed_inv(*args):
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "invoke", "-r", REPO, *args, "--json"], capture_output=True,
                          text=True, cwd=REPO, timeout=3600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit("inv %s: exit %d\n%s%s" % (" ".join(args), done.returncode, done.stdout[-2000:], done.stderr[-2000:]))
    return seconds, json.loads(done.stdout)


def main(argv):
    if not argv:
        sys.exit(__doc__)
    run_id, host = argv[0], (argv[1] if len(argv) > 1 else "lab-server")
    with open(os.path.join(RUNS, run_id, "run.json")) as handle:
        record = json.load(handle)
    plan = dict(record["server"], prepared=record["server"]["prepared"], out=record["out"])
    timed_inv("verify-dataset", "--host", host, "--run", run_id)  # the bundle uploaded, the files in the page cache
    default_s, found = timed_inv("verify-dataset", "--host", host, "--run", run_id)
    full_s, _ = timed_inv("verify-dataset", "--host", host, "--run", run_id, "--full")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(ANCHOR)
    os.chmod(script.name, 0o644)
    try:
        # The host's python as the lab user (the files are theirs), the interpreter's start-up included as ours is.
        started = time.perf_counter()
        done = subprocess.run(["runuser", "-u", "specrig", "--", record["python"], script.name,
                               json.dumps({key: plan[key] for key in ("storage", "out", "prepared", "hidden_size",
                                                                        "layer_ids")})],
                              capture_output=True, text=True, timeout=3600, cwd="/")
        anchor_s = time.perf_counter() - started
    finally:
        os.unlink(script.name)
    if done.returncode != 0:
        sys.exit("anchor failed: %s" % done.stderr[-2000:])
    rows = found["counts"]["rows"]
    print("output: %s rows, %s tokens, %d bytes (%s storage)" % (rows, found["counts"]["tokens"],
                                                                 found["counts"]["bytes"], found["plan"]["storage"]))
    print("| check | seconds | ours / anchor |")
    print("|---|---|---|")
    print("| anchor: the trainer's dataset and collate over every row | %.1f | 1.00 |" % anchor_s)
    print("| verify-dataset (default: a sample loaded) | %.1f | %.2f |" % (default_s, default_s / anchor_s))
    print("| verify-dataset --full | %.1f | %.2f |" % (full_s, full_s / anchor_s))


if __name__ == "__main__":
    main(sys.argv[1:])
