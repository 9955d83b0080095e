"""args.json: read, checked against contract.py's defaults and the reorder hazard, completed.

The schema is documented at the top of remote/run/extract_driver.py.
"""
import json
import os

from base import pkgmeta
from base.contract import DRIVER_DEFAULTS, DRIVER_REQUIRED, reorder_hazard


class Refused(Exception):
    """Arguments the driver will not run with; the message says which and why."""


class Locked(Refused):
    """Another driver is writing the same output directory."""


def load_arguments(path):
    try:
        with open(path, encoding="utf-8") as handle:
            given = json.load(handle)
    except (OSError, ValueError) as exc:
        raise Refused("cannot read arguments file %r: %s" % (path, exc)) from None
    if not isinstance(given, dict):
        raise Refused("arguments file %r holds %s, not a JSON object" % (path, type(given).__name__))
    unknown = sorted(set(given) - set(DRIVER_DEFAULTS) - set(DRIVER_REQUIRED))
    if unknown:
        raise Refused("unknown argument(s) %r; known: %s"
                      % (unknown, ", ".join(DRIVER_REQUIRED + tuple(DRIVER_DEFAULTS))))
    missing = [key for key in DRIVER_REQUIRED if not given.get(key)]
    if missing:
        raise Refused("missing required argument(s) %r" % missing)
    args = dict(DRIVER_DEFAULTS, **given)
    for key in ("max_length", "batch_size", "writes_in_flight", "preprocess_procs", "cpu_kvcache_space_gib"):
        if not isinstance(args[key], int) or isinstance(args[key], bool) or args[key] < 1:
            raise Refused("%s=%r: give a positive integer" % (key, args[key]))
    for key in ("tensor_parallel_size", "max_samples"):
        value = args[key]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise Refused("%s=%r: give a positive integer or null" % (key, value))
    shard_index, shard_count = args["shard_index"], args["shard_count"]
    if (shard_index is None) != (shard_count is None):
        raise Refused("shard_index=%r, shard_count=%r: give both (one shard of a sharded run) or neither"
                      % (shard_index, shard_count))
    if shard_count is not None:
        if (not isinstance(shard_count, int) or isinstance(shard_count, bool) or shard_count < 1
                or not isinstance(shard_index, int) or isinstance(shard_index, bool)
                or not 0 <= shard_index < shard_count):
            raise Refused("shard_index=%r, shard_count=%r: give a shard count >= 1 and an index in "
                          "0 .. shard_count - 1" % (shard_index, shard_count))
    if not isinstance(args["seed"], int):
        raise Refused("seed=%r: give an integer" % (args["seed"],))
    layer_ids = args["layer_ids"]
    if layer_ids is not None:
        if (not isinstance(layer_ids, list) or not layer_ids
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layer_ids)):
            raise Refused("layer_ids=%r: give a non-empty list of layer indices, or null" % (layer_ids,))
        if len(set(layer_ids)) != len(layer_ids) or layer_ids != sorted(layer_ids):
            # The worker captures layers in model order into one list per distinct layer.
            raise Refused("layer_ids=%r: give distinct indices in increasing order, e.g. %r"
                          % (layer_ids, sorted(set(layer_ids))))
    if args["hf_overrides"] is not None and not isinstance(args["hf_overrides"], dict):
        raise Refused("hf_overrides=%r: give a JSON object of config.json keys" % (args["hf_overrides"],))
    if not os.path.isdir(args["model"]):
        raise Refused("model=%r is not a directory on this host" % (args["model"],))
    dataset = args["dataset"]
    if dataset.endswith((".json", ".jsonl")) and not os.path.isfile(dataset):
        raise Refused("dataset=%r does not exist on this host" % (dataset,))
    installed = pkgmeta.versions(("speculators",))["speculators"]
    hazard = reorder_hazard(installed, args["batch_size"], args["max_length"])
    if not hazard["ok"]:
        raise Refused(
            "batch_size=%d x max_length=%d = %d tokens exceeds vLLM's per-step budget max(8192, max_length)=%d "
            "that speculators <= 0.4 configures (installed: %s): the batch would be split across scheduler "
            "steps and hidden states attached to the wrong samples (silent corruption); use batch_size <= %d"
            % (args["batch_size"], args["max_length"], hazard["tokens"], hazard["budget"], installed or "unknown",
               hazard["max_batch_size"]))
    args["output_dir"] = os.path.abspath(args["output_dir"])
    args["model"] = os.path.abspath(args["model"])
    if args["heartbeat"] is None:
        args["heartbeat"] = os.path.join(args["output_dir"], "heartbeat.json")
    return args
