"""The `preflight` remote command: can this host run this extraction? (stdlib only)

    {"workdir", "driver_args": {model, dataset, output_dir, layer_ids, tensor_parallel_size,
                                max_length, batch_size, max_samples}}
    -> {"checks": [{"name", "ok", "detail", "advice"}], "estimate": {...}}

Every check runs (one failing does not hide the others) and none changes anything.
"""
import json
import os
import shutil

import contract
import pkgmeta
import telemetry
from run import runs

#: speculators' default EAGLE-3 choice captures four layers.
DEFAULT_LAYER_COUNT = 4
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}
#: Characters per token, for estimating the dataset's tokens without a tokenizer.
CHARS_PER_TOKEN = 4
DISK_MARGIN = 1.1
HUB_DATASETS = ("sharegpt", "ultrachat")


def check(name, ok, detail, advice=None):
    return {"name": name, "ok": bool(ok), "detail": detail, "advice": None if ok else advice}


def run(args):
    driver = dict(args.get("driver_args") or {})
    for key in runs.PATH_ARGS:
        if driver.get(key):
            driver[key] = os.path.abspath(os.path.expanduser(driver[key]))
    workdir = args.get("workdir") or "~"
    checks = [packages()]
    config, config_check = model_config(driver.get("model"))
    checks.append(config_check)
    checks.append(layers(driver.get("layer_ids"), config))
    checks.append(max_length(driver.get("max_length") or contract.DRIVER_DEFAULTS["max_length"], config))
    samples, dataset_check = dataset(driver.get("dataset"), driver.get("max_samples"), driver.get("max_length"))
    checks.append(dataset_check)
    checks.append(gpus(driver.get("tensor_parallel_size")))
    estimate = output_estimate(config, driver, samples)
    checks.append(disk(driver.get("output_dir"), estimate))
    checks.append(reorder_hazard(driver.get("batch_size") or contract.DRIVER_DEFAULTS["batch_size"], driver.get("max_length") or contract.DRIVER_DEFAULTS["max_length"]))
    checks.append(output_free(workdir, driver.get("output_dir")))
    return {"checks": checks, "estimate": estimate}


def packages():
    found = pkgmeta.versions(("speculators", "vllm", "torch", "transformers"))
    missing = [name for name, version in found.items() if version is None]
    detail = ", ".join("%s %s" % (name, version or "missing") for name, version in found.items())
    return check("packages", not missing, detail,
                 "install %s into this host's environment, or point `python` in hosts.yaml at the one that has "
                 "them" % ", ".join(missing))


def _text_config(config):
    # Multimodal targets (Kimi-K2.5) keep the language model's shape under text_config.
    return config.get("text_config") or config


def _dtype(config):
    # transformers >= 4.56 writes `dtype`, older versions `torch_dtype`.
    text = _text_config(config)
    for source in (text, config):
        for key in ("dtype", "torch_dtype"):
            if source.get(key):
                return source[key]
    return "bfloat16"


def _size(count):
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return "%.1f %s" % (count, unit)
        count /= 1000.0


def model_config(model):
    if not model:
        return None, check("model", False, "no model given", "pass --model or set extract.model in hosts.yaml")
    path = os.path.join(model, "config.json")
    if not os.path.isdir(model):
        return None, check("model", False, "%s is not a directory" % model, "check --model / extract.model")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        return None, check("model", False, "cannot read %s: %s" % (path, exc), "is the model fully downloaded?")
    text = _text_config(config)
    detail = "%s: %s, hidden %s, %s layers, %s" % (model, (config.get("architectures") or ["?"])[0],
                                                   text.get("hidden_size"), text.get("num_hidden_layers"),
                                                   _dtype(config))
    return config, check("model", text.get("hidden_size") and text.get("num_hidden_layers"), detail,
                         "config.json names no hidden_size / num_hidden_layers")


def layers(layer_ids, config):
    if config is None:
        return check("layers", False, "unknown: the model config could not be read", "fix the model check first")
    count = _text_config(config).get("num_hidden_layers") or 0
    if layer_ids is None:
        return check("layers", True, "speculators' default choice of %d layers (of %d)" % (DEFAULT_LAYER_COUNT,
                                                                                          count))
    bad = [layer for layer in layer_ids if not 0 <= layer < count]
    return check("layers", not bad, "layers %s of %d" % (layer_ids, count),
                 "layer ids %s are out of range 0-%d" % (bad, count - 1))


def max_length(length, config):
    """The driver asks vLLM for max_length + 1 tokens (room for the one decode step)."""
    if config is None:
        return check("max-len", False, "unknown: the model config could not be read", "fix the model check first")
    limit = _text_config(config).get("max_position_embeddings")
    if not limit:
        return check("max-len", True, "max_len %d (the model names no max_position_embeddings)" % length)
    return check("max-len", length + 1 <= limit, "max_len %d + 1 of the model's %d positions" % (length, limit),
                 "use --max-len %d or less" % (limit - 1))


def dataset(path, max_samples, max_length):
    """(samples as [estimated tokens], check)."""
    if not path:
        return [], check("dataset", False, "no dataset given", "pass --data or set extract.data in hosts.yaml")
    if path.rsplit("/", 1)[-1] in HUB_DATASETS:
        return [], check("dataset", True, "%s: fetched from the hub by the host" % path)
    try:
        lengths = _sample_lengths(path, max_samples)
    except (OSError, ValueError) as exc:
        return [], check("dataset", False, "cannot read %s: %s" % (path, exc),
                         "give a local .json or .jsonl file of conversations")
    tokens = [min(length // CHARS_PER_TOKEN + 1, max_length or DRIVER_MAX_LENGTH) for length in lengths]
    return tokens, check("dataset", bool(tokens), "%s: %d conversations, about %d tokens" % (
        path, len(tokens), sum(tokens)), "the dataset holds no conversations")


def _sample_lengths(path, max_samples):
    lengths = []
    with open(path, encoding="utf-8") as handle:
        if path.endswith(".jsonl"):
            for line in handle:
                if line.strip():
                    lengths.append(len(line))
                if max_samples and len(lengths) >= max_samples:
                    break
        else:
            records = json.load(handle)
            lengths = [len(json.dumps(record)) for record in records][:max_samples or None]
    return lengths


def _visible(gpu_rows, visible):
    """The GPUs CUDA_VISIBLE_DEVICES (indices or uuids; None: all) lets the job see, in its order."""
    if visible is None:
        return gpu_rows
    wanted = [item.strip() for item in visible.split(",") if item.strip()]
    by_name = {}
    for gpu in gpu_rows:
        by_name[str(gpu["index"])] = by_name[gpu["uuid"]] = gpu
    return [by_name[item] for item in wanted if item in by_name]


def gpus(tp):
    seen = telemetry.gpus(timeout=15)
    apps = telemetry.compute_apps(timeout=15) if seen["available"] else []
    return gpu_check(tp, seen, apps, os.environ.get("CUDA_VISIBLE_DEVICES"))


def gpu_check(tp, seen, apps, visible):
    """Enough visible GPUs for the tensor-parallel size, and none of those it will use held by others."""
    if not seen["available"]:
        return check("gpus", not tp or tp <= 1, "no NVIDIA GPUs (%s): vLLM's CPU backend runs it" % seen["reason"],
                     "tensor-parallel size %s needs that many GPUs; this host shows none" % tp)
    rows = _visible(seen["gpus"], visible)
    need = tp or len(rows)
    # vLLM takes the first `tp` visible GPUs.
    busy = [g for g in telemetry.with_processes(rows[:need], apps) if g["processes"]]
    detail = "%d visible, %s MiB free%s" % (
        len(rows), " / ".join("%.0f" % (g["memory_free_mib"] or 0) for g in rows),
        "; in use: " + ", ".join("GPU %s by pid %s" % (g["index"], ", ".join(str(p["pid"]) for p in g["processes"]))
                                 for g in busy) if busy else "")
    if len(rows) < need:
        return check("gpus", False, detail, "tensor-parallel size %d needs %d GPUs; CUDA_VISIBLE_DEVICES=%s shows %d"
                     % (need, need, visible, len(rows)))
    return check("gpus", not busy, detail,
                 "other processes hold GPU memory; stop them or pick free GPUs with CUDA_VISIBLE_DEVICES in hosts.yaml")


def output_estimate(config, driver, samples):
    """Bytes the hidden states take: layers x tokens x hidden size x dtype bytes."""
    if config is None:
        return None
    text = _text_config(config)
    hidden = text.get("hidden_size") or 0
    dtype = _dtype(config)
    layer_count = len(driver.get("layer_ids") or []) or DEFAULT_LAYER_COUNT
    per_token = layer_count * hidden * DTYPE_BYTES.get(dtype, 2)
    return {"bytes_per_token": per_token, "tokens": sum(samples), "samples": len(samples),
            "bytes": per_token * sum(samples), "layers": layer_count, "hidden_size": hidden, "dtype": dtype}


def _existing_parent(path):
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def disk(output_dir, estimate):
    if not output_dir:
        return check("disk", False, "no output directory given", "pass --out or set extract.out in hosts.yaml")
    where = _existing_parent(output_dir)
    free = shutil.disk_usage(where).free
    if not os.access(where, os.W_OK):
        return check("disk", False, "%s is not writable" % where, "choose an --out this user can write")
    if not estimate or not estimate["tokens"]:
        return check("disk", True, "%s free at %s (output size unknown)" % (_size(free), where))
    need = estimate["bytes"] * DISK_MARGIN
    return check("disk", free >= need, "%s free at %s; the output needs about %s (%d B/token x %d tokens)"
                 % (_size(free), where, _size(estimate["bytes"]), estimate["bytes_per_token"], estimate["tokens"]),
                 "free space or choose another --out; or lower --max-samples")


def reorder_hazard(batch_size, max_length):
    version = pkgmeta.versions(("speculators",))["speculators"]
    hazard = contract.reorder_hazard(version, batch_size, max_length)
    return check("reorder-hazard", hazard["ok"],
                 "batch_size %d x max_len %d = %d tokens; budget max(%d, max_len) = %d (speculators %s)"
                 % (batch_size, max_length, hazard["tokens"], contract.MIN_BATCHED_TOKENS, hazard["budget"], version),
                 "speculators <= 0.4 attaches hidden states to the wrong samples when a batch exceeds the budget: "
                 "use --batch-size %d or less" % hazard["max_batch_size"])


def output_free(workdir, output_dir):
    if not output_dir:
        return check("output-free", False, "no output directory given", "pass --out")
    busy = runs.writers_of(workdir, output_dir)
    existing = os.path.exists(os.path.join(output_dir, "data_config.json"))
    detail = "%s%s" % (output_dir, " (holds samples: the run resumes them)" if existing else "")
    if busy:
        return check("output-free", False, "run %s is writing %s" % (busy[0].run_id, output_dir),
                     "stop it (`inv stop --run %s`) or choose another --out" % busy[0].run_id)
    return check("output-free", True, detail)
