"""The `runs.verify-output` remote command: which samples a run's output directory holds, and which
fail to load whole (stdlib only).

    runs.verify-output {"workdir", "run": id|null}   null: the newest run

An in-process run's data_{i}.pt files are loaded by run/verify_output.py on the run's python (torch is
imported there, not in this call); a server-mode run's hs_{i}.safetensors are checked here
(base/outputs.py). The answer's `identity` is what a shard must share with the others to be
merged (specrig/run/sharded_runs.py union()).
"""
import json
import os
import subprocess
import sys

from base import contract, hfcache, outputs, prepared, rundir
from base.failure import RemoteFailure

#: The program that loads an in-process run's samples (this file is remote/run/output_check.py).
VERIFY_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verify_output.py")
VERIFY_TIMEOUT_S = 3600


def verify_output(args):
    """The run's output directory: which data_{i}.pt it holds and which fail to load whole, checked
    by run/verify_output.py on the run's python (torch is imported there, not in this call)."""
    workdir = rundir.workdir_of(args)
    run = rundir.find_run(workdir, args.get("run"))
    out = run.record.get("out")
    result = {"run_id": run.run_id, "state": run.state(), "out": out, "shard": run.record.get("shard")}
    if not out or not os.path.isdir(out):
        return dict(result, indices=[], unloadable=[], layers=None, dataset_samples=None, missing_dir=True)
    model = (run.record.get("driver_args") or {}).get("model")
    result["identity"] = {"model": hfcache.fingerprint(model) if model else None}
    if run.record.get("server"):
        found = _server_output(run)
        result["identity"].update(layer_ids=run.record["server"]["layer_ids"], dtype=found.pop("dtype"),
                                  storage=_storage(run.record["server"]))
        return dict(result, missing_dir=False, **found)
    python = run.record.get("python") or sys.executable
    if not os.path.exists(python):
        python = sys.executable
    try:
        done = subprocess.run([python, VERIFY_PROGRAM, out], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=VERIFY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RemoteFailure("timeout", "verifying %s took longer than %d s" % (out, VERIFY_TIMEOUT_S)) from None
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RemoteFailure("verify-failed", "verifying %s with %s failed (exit %s): %s"
                            % (out, python, done.returncode, done.stderr.decode(errors="replace").strip()[-500:]),
                            traceback=done.stderr.decode(errors="replace")[-4000:])
    found = json.loads(lines[-1])
    result["identity"].update(layer_ids=found.pop("layer_ids", None), dtype=None)
    return dict(result, missing_dir=False, **found)


def _storage(plan):
    """A server-mode plan's storage type: runs planned before fp8 storage existed stored bf16."""
    return plan.get("storage", contract.BF16)


def _server_output(run):
    """verify_output.py's answer for a server-mode run's hs_{i}.safetensors, checked here (stdlib:
    base/outputs.py reads every header and scans the states for NaN/Inf)."""
    server = run.record["server"]
    present = outputs.existing_indices(server["out"])
    total = run.status.get("samples_total")
    shard = run.record.get("shard") or {}
    if shard.get("shared_out") and total is not None:
        # One directory holds every shard (`inv extract --shared-out`): this shard is its own indices there.
        # (a run made before --clients has no "clients": one process)
        own = set(prepared.shard_indices(total, server["max_samples"], shard["shard_count"], shard["shard_index"],
                                       server.get("clients", 1)))
        present = [index for index in present if index in own]
    report = outputs.check_dataset(server["out"], None, indices=present, n_layers=len(server["layer_ids"]),
                                   hidden_size=server["hidden_size"], storage=_storage(server))
    dtype = None
    for index in present:  # the states' dtype, from the first file whose header reads
        try:
            dtype = outputs.read_header(os.path.join(server["out"], outputs.file_name(index)))["tensors"][
                "hidden_states"]["dtype"]
            break
        except (outputs.SafetensorsError, OSError, KeyError):
            continue
    return {"indices": present, "layers": len(server["layer_ids"]), "dtype": dtype,
            "unloadable": [{"index": index, "reason": outputs.reason(found)}
                           for index, found in sorted(report["files"].items())],
            # The samples the run covers: min(max_samples, N) as generate-offline-data counts them.
            "dataset_samples": None if total is None else min(total, server["max_samples"] or total),
            "shard_index": shard.get("shard_index"), "shard_count": shard.get("shard_count")}
