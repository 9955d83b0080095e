"""The `preflight` remote command: can this host run this extraction? (stdlib only)

    {"workdir", "driver_args": {model, dataset, output_dir, layer_ids, tensor_parallel_size,
                                max_length, batch_size, max_samples, (server mode) port, staging, ...},
     "server_python": path|null}
    -> {"checks": [{"name", "ok", "detail", "advice"}], "estimate": {...}}

Every check runs (one failing does not hide the others) and none changes anything. The model may be
a directory or a Hugging Face repo id in this host's cache (launching.host_paths): one that is neither fails
the call itself ("bad-argument", "model-not-found"), as the launch would.
"""
import json
import os
import re
import shutil
import subprocess
import sys

from base import contract, hfcache, pkgmeta, prepared, procs, rundir, telemetry
from base import server_command as launch
from base.units import human_bytes
from run import budget, gpu_preflight, launching, model_support
from run.server import server_preflight
from run.storage import existing_parent

#: speculators' default EAGLE-3 choice captures four layers.
DEFAULT_LAYER_COUNT = 4
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}
#: Characters per token, for estimating the dataset's tokens without a tokenizer.
CHARS_PER_TOKEN = 4
HUB_DATASETS = ("sharegpt", "ultrachat")
#: The helper that reads torch's build in a process of its own (remote/run/torch_arch.py).
TORCH_ARCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_arch.py")
#: Importing torch from a cold network disk can take a while; the laptop gives the whole preflight 120 s.
TORCH_ARCH_TIMEOUT_S = 60


def check(name, ok, detail, advice=None):
    return {"name": name, "ok": bool(ok), "detail": detail, "advice": None if ok else advice}


def run(args):
    driver = launching.host_paths(args.get("driver_args"))
    workdir = args.get("workdir") or "~"
    # What the driver will run with where the launch leaves a setting to its default.
    max_len = driver.get("max_length") or contract.DRIVER_DEFAULTS["max_length"]
    batch_size = driver.get("batch_size") or contract.DRIVER_DEFAULTS["batch_size"]
    server_mode = contract.extraction_mode(pkgmeta.versions(("speculators",))["speculators"]) == contract.SERVER
    checks = [] if server_mode else [packages()]
    config, config_check = model_config(driver.get("model"), driver.get("model_id"))
    checks.append(config_check)
    if config is not None:  # custom code and quantization: what stops vLLM before it loads a weight
        checks += model_support.host_checks(driver.get("model"), server_python=args.get("server_python"),
                                            tp=driver.get("tensor_parallel_size"),
                                            visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not server_mode:  # server mode checks the layer ids with the whole server command
        checks.append(layers(driver.get("layer_ids"), config))
    checks.append(max_length(max_len, config))
    samples, dataset_check = dataset(driver.get("dataset"), driver.get("max_samples"), driver.get("max_length"))
    checks.append(dataset_check)
    if server_mode:
        found, estimate = server_preflight.checks(sys.modules[__name__], driver, workdir=workdir, samples=samples,
                                                  server_python=args.get("server_python"), config=config)
        return {"checks": checks + found, "estimate": estimate}
    checks.append(gpus(driver.get("tensor_parallel_size")))
    checks.append(torch_arch(driver.get("tensor_parallel_size")))
    checks += gpu_preflight.checks(driver, config=config)  # topology, vLLM on the GPUs, the collective probe
    estimate = output_estimate(config, driver, share(samples, driver, server=False))
    checks.append(disk(driver.get("output_dir"), estimate))
    checks.append(reorder_hazard(batch_size, max_len))
    checks.append(output_free(workdir, driver.get("output_dir")))
    return {"checks": checks, "estimate": estimate}


def packages():
    found = pkgmeta.versions(("speculators", "vllm", "torch", "transformers"))
    missing = [name for name, version in found.items() if version is None]
    detail = ", ".join("%s %s" % (name, version or "missing") for name, version in found.items())
    return check("packages", not missing, detail,
                 "install %s into this host's environment, or point `python` in hosts.yaml at the one that has "
                 "them" % ", ".join(missing))


def _dtype(config):
    # transformers >= 4.56 writes `dtype`, older versions `torch_dtype`.
    text = launch.text_config(config)
    for source in (text, config):
        for key in ("dtype", "torch_dtype"):
            if source.get(key):
                return source[key]
    return "bfloat16"


def model_config(model, model_id):
    """The model's config.json and its check; `model` is the directory launching.host_paths found (a snapshot
    of the hub cache when the run names the model by `model_id`)."""
    if not model:
        return None, check("model", False, "no model given", "pass --model or set extract.model in hosts.yaml")
    path = os.path.join(model, "config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        return None, check("model", False, "cannot read %s: %s" % (path, exc), "is the model fully downloaded?")
    text = launch.text_config(config)
    detail = "%s: %s, hidden %s, %s layers, %s" % (hfcache.describe(hfcache.Model(model, model_id)),
                                                   (config.get("architectures") or ["?"])[0],
                                                   text.get("hidden_size"), text.get("num_hidden_layers"),
                                                   _dtype(config))
    return config, check("model", text.get("hidden_size") and text.get("num_hidden_layers"), detail,
                         "config.json names no hidden_size / num_hidden_layers")


def layers(layer_ids, config):
    if config is None:
        return check("layers", False, "unknown: the model config could not be read", "fix the model check first")
    count = launch.text_config(config).get("num_hidden_layers") or 0
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
    limit = launch.text_config(config).get("max_position_embeddings")
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
    tokens = [min(length // CHARS_PER_TOKEN + 1, max_length or contract.DRIVER_DEFAULTS["max_length"]) for length in lengths]
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


def _process(app):
    """'pid 1234 (python3 hold.py, 8200 MiB)': the command line from /proc where this user may read it.

    In a container nvidia-smi may give the host's pids: the command line counts only when it runs
    the program nvidia-smi names, else that name is shown."""
    name = app.get("process_name") or "?"
    words = procs.cmdline(app["pid"]).split()
    if not words or os.path.basename(words[0]) != os.path.basename(name):
        words = [name]
    command = " ".join(os.path.basename(word) if word.startswith("/") else word for word in words)
    if len(command) > 60:
        command = command[:57] + "..."
    memory = app.get("memory_used_mib")
    return "pid %s (%s%s)" % (app["pid"], command, ", %.0f MiB" % memory if memory is not None else "")


def _free(rows):
    free = ["%.0f" % (g["memory_free_mib"] or 0) for g in rows]
    if len(free) > 1 and len(set(free)) == 1:
        return "%s MiB free on each" % free[0]
    return "%s MiB free" % " / ".join(free)


def gpus(tp):
    seen = telemetry.gpus(timeout=15)
    apps = telemetry.compute_apps(timeout=15) if seen["available"] else []
    return gpu_check(tp, seen, apps, os.environ.get("CUDA_VISIBLE_DEVICES"))


def gpu_check(tp, seen, apps, visible):
    """Enough visible GPUs for the tensor-parallel size, and none of those it will use held by others."""
    if not seen["available"]:
        return check("gpus", not tp or tp <= 1, "no NVIDIA GPUs (%s): vLLM's CPU backend runs it" % seen["reason"],
                     "tensor-parallel size %s needs that many GPUs; this host shows none" % tp)
    rows = telemetry.visible_gpus(seen["gpus"], visible)
    need = tp or len(rows)
    # vLLM takes the first `tp` visible GPUs.
    busy = [g for g in telemetry.with_processes(rows[:need], apps) if g["processes"]]
    detail = "%d visible, %s" % (len(rows), _free(rows))
    if visible is not None:
        detail += "; CUDA_VISIBLE_DEVICES=%s: %s" % (visible, ", ".join(
            "cuda:%d is GPU %s" % (position, gpu["index"]) for position, gpu in enumerate(rows)) or "no GPU")
    if busy:
        detail += "; in use: " + "; ".join("GPU %s by %s" % (g["index"], ", ".join(_process(p) for p in g["processes"]))
                                          for g in busy)
    if len(rows) < need:
        return check("gpus", False, detail, "tensor-parallel size %d needs %d GPUs; CUDA_VISIBLE_DEVICES=%s shows %d"
                     % (need, need, visible, len(rows)))
    return check("gpus", not busy, detail,
                 "other processes hold GPU memory; stop them or pick free GPUs with CUDA_VISIBLE_DEVICES in hosts.yaml")


# -- torch's build against the GPUs' compute capability ----------------------------------------------------

def torch_arch(tp, python=None):
    """torch in `python`'s environment (default: this one) has kernels the visible GPUs can run (read from
    the build and nvidia-smi)."""
    caps = telemetry.compute_caps(timeout=15)
    if not caps["available"] and caps["reason"] == telemetry.NOT_FOUND:
        return check("torch-arch", True, "no NVIDIA GPUs: nothing to match torch's build against")
    rows = telemetry.visible_gpus(caps["gpus"], os.environ.get("CUDA_VISIBLE_DEVICES"))
    build = torch_build(python) if caps["available"] and rows else None
    return torch_arch_check(build, caps, rows[:tp or len(rows)])


def torch_build(python=None, timeout=TORCH_ARCH_TIMEOUT_S):
    """What remote/run/torch_arch.py prints: the torch build of `python` (default: this one, the host's)."""
    try:
        proc = subprocess.run([python or sys.executable, TORCH_ARCH], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"installed": None, "error": "importing torch took longer than %d s" % timeout}
    except OSError as exc:
        return {"installed": None, "error": "cannot run %s: %s" % (python or sys.executable, exc)}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        return {"installed": None, "error": "torch_arch.py exited with %s: %s" % (proc.returncode,
                                                                                 said[-1] if said else "no output")}
    return json.loads(lines[-1])


ARCH = re.compile(r"(sm|compute)_(\d+)([af]?)")


def _capability(text):
    """'9.0' -> (9, 0); None when nvidia-smi gave none."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def arch_runs_on(arch, capability):
    """Whether code built for `arch` (sm_90, sm_90a, compute_90) runs on a GPU of `capability` (9, 0).

    Machine code (sm_XY) runs on X.Y and on later minor versions of the same major (sm_80 on 8.6),
    never across majors; 'a' (arch-specific) code only on X.Y itself, 'f' (family) code as sm_XY.
    PTX (compute_XY) is compiled by the driver for X.Y and every later GPU.
    """
    match = ARCH.fullmatch(arch)
    if not match:
        return False
    number = int(match.group(2))
    built = (number // 10, number % 10)
    if match.group(3) == "a":
        return built == capability
    if match.group(1) == "compute" and not match.group(3):
        return built <= capability
    return built[0] == capability[0] and built[1] <= capability[1]


def _sm(capability):
    return "sm_%d%d" % capability


def _indices(indices):
    """[0, 1, 2, 3] -> '0-3'; [0, 2] -> '0, 2'."""
    if len(indices) > 2 and indices == list(range(indices[0], indices[-1] + 1)):
        return "%d-%d" % (indices[0], indices[-1])
    return ", ".join(str(index) for index in indices)


def _gpu_groups(rows):
    """'GPU 0 (NVIDIA B200) is sm_100', 'GPUs 0-7 (NVIDIA H200) are sm_90': GPUs grouped by name and capability."""
    groups = {}
    for gpu in rows:
        groups.setdefault((gpu.get("name") or "?", _capability(gpu.get("compute_cap"))), []).append(gpu["index"])
    return "; ".join("GPU%s %s (%s) %s %s" % ("s" if len(indices) > 1 else "", _indices(indices), name,
                                               "are" if len(indices) > 1 else "is", _sm(cap) if cap else "of unknown capability")
                     for (name, cap), indices in groups.items())


def _build_for(capability):
    """The advice: which torch build has kernels for a GPU of `capability`."""
    if capability[0] >= 10:
        cuda, wheel = ("13.0", "cu130") if capability[0] == 11 else ("12.8", "cu128")
        return ("install a torch build for CUDA %s+ (%s), e.g. `pip install torch --index-url "
                "https://download.pytorch.org/whl/%s`" % (cuda, wheel, wheel))
    if capability < (7, 5):
        return ("install a torch build that still has kernels for %s: CUDA 13 builds dropped it; a CUDA 12 build "
                "(e.g. cu126) has them" % _sm(capability))
    return ("install a torch build for CUDA 11.8+ (cu118 or newer), e.g. `pip install torch --index-url "
            "https://download.pytorch.org/whl/cu128`")


def _describe_build(build):
    arch = build.get("arch_list") or []
    machine = [a for a in arch if a.startswith("sm_")]
    ptx = [a for a in arch if a.startswith("compute_")]
    return "torch %s (CUDA %s) has kernels for %s%s" % (
        build.get("version"), build.get("cuda"), ", ".join(machine) or "no GPU",
        " and PTX for %s" % ", ".join(ptx) if ptx else "")


def torch_arch_check(build, caps, rows):
    """The check from torch_arch.py's answer (`build`), nvidia-smi's compute capabilities (`caps`) and
    the GPUs the job will use (`rows`, each with compute_cap)."""
    name = "torch-arch"
    if not caps["available"]:
        return check(name, True, "compute capability unknown (%s): not checked" % caps["reason"])
    if not rows:
        return check(name, True, "no GPU visible to the job (CUDA_VISIBLE_DEVICES): nothing to match")
    caps_known = [_capability(gpu.get("compute_cap")) for gpu in rows if _capability(gpu.get("compute_cap"))]
    newest = max(caps_known) if caps_known else (9, 0)
    gpus_text = _gpu_groups(rows)
    if build is None or build.get("installed") is None:
        return check(name, False, "cannot read torch's build: %s" % ((build or {}).get("error") or "no answer"),
                     "check that torch imports in the host's python (hosts.yaml `python`)")
    if not build["installed"]:
        return check(name, False, "torch is not installed in this environment (%s); %s" % (sys.executable, gpus_text),
                     _build_for(newest))
    if build.get("error"):
        return check(name, False, "torch is installed but does not import: %s" % build["error"],
                     "reinstall torch in the host's environment; " + _build_for(newest))
    if build.get("hip"):
        return check(name, False, "torch %s is a ROCm build (HIP %s), but %s: NVIDIA GPUs"
                     % (build.get("version"), build["hip"], gpus_text), _build_for(newest))
    if not build.get("cuda"):
        return check(name, False, "torch %s is a CPU-only build, but %s: it would not use them"
                     % (build.get("version"), gpus_text), _build_for(newest))
    arch = build.get("arch_list") or []
    if not arch:
        return check(name, True, "torch %s (CUDA %s) names no GPU architectures: not checked; %s"
                     % (build.get("version"), build["cuda"], gpus_text))
    bad, through_ptx = [], []
    for gpu in rows:
        cap = _capability(gpu.get("compute_cap"))
        if cap is None:
            continue
        if not any(arch_runs_on(a, cap) for a in arch):
            bad.append(gpu)
        elif not any(arch_runs_on(a, cap) for a in arch if a.startswith("sm_")):
            through_ptx.append(gpu)
    if bad:
        return check(name, False, "%s but %s: it fails at the first kernel with 'no kernel image is available'"
                     % (_describe_build(build), _gpu_groups(bad)),
                     _build_for(max(_capability(gpu["compute_cap"]) for gpu in bad)))
    return check(name, True, "%s; %s%s" % (_describe_build(build), gpus_text,
                                           " (GPU %s only through PTX, compiled by the driver at the first start)"
                                           % _indices([g["index"] for g in through_ptx]) if through_ptx else ""))


def output_estimate(config, driver, samples, storage=contract.BF16):
    """Bytes the hidden states of `samples` (their tokens: this host's share) take: tokens x the bytes a token
    takes in `storage` (contract.stored_bytes_per_token: layers x hidden size values; bf16 is the model
    dtype's own, which the in-process driver stores)."""
    if config is None:
        return None
    text = launch.text_config(config)
    hidden = text.get("hidden_size") or 0
    dtype = _dtype(config)
    layer_count = len(driver.get("layer_ids") or []) or DEFAULT_LAYER_COUNT
    per_token = contract.stored_bytes_per_token(storage, values_per_token=layer_count * hidden,
                                                model_dtype_bytes=DTYPE_BYTES.get(dtype, 2))
    return {"bytes_per_token": per_token, "tokens": sum(samples), "samples": len(samples),
            "bytes": per_token * sum(samples), "layers": layer_count, "hidden_size": hidden, "dtype": dtype,
            "share": share_words(driver)}


def share(samples, driver, *, server):
    """The samples (their token counts, in dataset order) this host extracts: all of them, or its shard's:
    in process the indices i % n == k, in server mode speculators' contiguous chunk of rank k
    (run/server/client.py shard_indices). Server mode counts rows, one per assistant turn, where the
    dataset check counted conversations: the share is the same fraction of either."""
    count, index = driver.get("shard_count"), driver.get("shard_index")
    if not count:
        return samples
    if not server:
        return samples[index::count]
    return [samples[i] for i in prepared.shard_indices(len(samples), None, count, index,
                                                     driver.get("clients") or contract.SERVER_DEFAULTS["clients"])]


def share_words(driver):
    """'shard 2 of 3' or 'the whole dataset', for the disk check's message."""
    count = driver.get("shard_count")
    return "shard %d of %d" % (driver["shard_index"] + 1, count) if count else "the whole dataset"


def disk(output_dir, estimate):
    if not output_dir:
        return check("disk", False, "no output directory given", "pass --out or set extract.out in hosts.yaml")
    where = existing_parent(output_dir)
    if not os.access(where, os.W_OK):
        return check("disk", False, "%s is not writable" % where, "choose an --out this user can write")
    if not estimate or not estimate["tokens"]:
        return check("disk", True, "%s free at %s (output size unknown)" % (human_bytes(shutil.disk_usage(
            where).free), where))
    found = budget.room(output_dir, need=estimate["bytes"], what="%s (%d samples, %d B/token x %d tokens)" % (
        estimate["share"], estimate["samples"], estimate["bytes_per_token"], estimate["tokens"]),
        fix="or choose an --out with room for it; or lower --max-samples, or split the dataset over more hosts "
            "(a group in --host)")
    return check("disk", found["ok"], found["detail"], found["advice"])


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
    busy = rundir.writers_of(workdir, output_dir)
    existing = os.path.exists(os.path.join(output_dir, "data_config.json"))
    detail = "%s%s" % (output_dir, " (holds samples: the run resumes them)" if existing else "")
    if busy:
        return check("output-free", False, "run %s is writing %s" % (busy[0].run_id, output_dir),
                     "stop it (`inv stop --run %s`) or choose another --out" % busy[0].run_id)
    return check("output-free", True, detail)
