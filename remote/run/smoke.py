"""`inv smoke`: the extraction driver on a shrunk copy of the target, to show runtime drift in a minute.

args: {"model": directory or Hugging Face repo id (required), "samples": int, "timeout_s": float, "keep": bool,
       "server_python": path|null (server mode: the vLLM server's interpreter), "host": its name in hosts.yaml,
       "server_settings": {setting: value} of server mode's run (storage, enforce_eager; the driver's
                          argument names), each absent: the default,
       "slurm": hosts.yaml's `slurm:` of a login node|null (the call runs as a job on a node, slurm/jobs.py)}

speculators >= 0.8 takes server mode: run/server/server_smoke.py, the same differences on `inv extract`'s
server run. Otherwise:

The driver runs exactly as `inv extract` runs it (same file, same code path through
speculators and vLLM) with three differences: the model's own config.json shrunk to a few
layers and small dimensions (same architecture, same tokenizer) through the driver's
`hf_overrides`, random weights (`load_format: dummy`), and a few built-in conversations.
Two or more generate() calls are made, since some drift only fails the second one.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from base import atomic, contract, hfcache, pkgmeta
from base.failure import RemoteFailure
from run import classify
from run.server import server_smoke
from slurm import jobs as slurm_jobs

HERE = os.path.dirname(os.path.abspath(__file__))
#: On a Slurm login node, how long the smoke job may wait in the queue beyond the driver's own time.
SLURM_QUEUE_S = 120
DRIVER = os.path.join(HERE, "extract_driver.py")
SMOKE_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "specrig", "smoke")
BATCH_SIZE, MAX_LENGTH = 2, 256
#: Small enough to build in seconds, shaped for vLLM's CPU attention (head_dim 32), and 8 layers so
#: that speculators' default layer choice [2, n/2, n-3, n-1] still names four distinct layers.
#: MLA's dimensions (kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) stay
#: the target's: vLLM's MLA kernels take only DeepSeek's, a latent cache of 512 + 64 = 576 on the CPU
#: and on GPUs (vllm==0.32.0 v1/attention/backends/mla/cpu_mla.py:61-64, flashattn_mla.py:109-111)
#: and a FlashAttention prefill of (128, 64, 128) (issue 19: vLLM 0.26.0 on an H200 refused (32, 64, 32)).
SHRUNK = {"num_hidden_layers": 8, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
          "head_dim": 32, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
          "n_routed_experts": 4, "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
          "n_shared_experts": 1, "n_group": 1, "topk_group": 1}
#: Dummy weights cannot be quantized checkpoints of another shape (None: the driver removes the key).
DROPPED = ("quantization_config",)
CONVERSATIONS = [
    [("human", "What does a draft model do in speculative decoding?"),
     ("gpt", "It proposes several tokens cheaply; the target model verifies them in one pass.")],
    [("human", "Name three colours."), ("gpt", "Red, green and blue."),
     ("human", "And three more?"), ("gpt", "Cyan, magenta and yellow.")],
    [("human", "Count from one to five."), ("gpt", "One, two, three, four, five.")],
    [("human", "Why cache keys and values?"), ("gpt", "So that earlier tokens are not recomputed at each step.")],
    [("human", "Say hello."), ("gpt", "Hello!")],
    [("human", "What is a hidden state?"),
     ("gpt", "The vector a transformer layer outputs for each token, which the next layer reads.")],
]


def shrunk_overrides(config):
    """Overrides making `config` small; applied to text_config too for multimodal wrappers."""
    overrides = _shrink(config)
    for nested in ("text_config", "language_config", "llm_config"):
        if isinstance(config.get(nested), dict):
            overrides[nested] = _shrink(config[nested])
    return overrides


def _shrink(config):
    layers = config.get("num_hidden_layers")
    overrides = {key: value for key, value in SHRUNK.items() if key in config}
    if layers:
        overrides["num_hidden_layers"] = min(layers, SHRUNK["num_hidden_layers"])
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv_heads:
        # Keep the model's kind of attention: multi-head stays multi-head, grouped stays grouped.
        overrides["num_key_value_heads"] = SHRUNK["num_attention_heads"] if kv_heads == heads else 2
    if "first_k_dense_replace" in config:
        overrides["first_k_dense_replace"] = min(config["first_k_dense_replace"], 1)
    for key, value in config.items():
        # Per-layer lists (layer_types, sliding-window patterns) must keep one entry per layer.
        if layers and isinstance(value, list) and len(value) == layers and key not in SHRUNK:
            overrides[key] = value[: overrides["num_hidden_layers"]]
    for key in DROPPED:
        if key in config:
            overrides[key] = None
    return overrides


def name_failure(log_text, exit_status):
    """What failed, for people: the exception, the speculators call that raised it, the classifier's kind."""
    verdict = classify.classify(log_text, exit_status)
    root, last_chain = classify.root_cause(log_text)
    # The speculators line that made the failing call: in the root cause (a worker's traceback when
    # the driver's only points at it), else in the driver's.
    frame = classify.consumer_frame([t["text"] for t in (root, last_chain) if t], ["/speculators/"])
    # Named by the last exception of the root cause's chain, which says what the failing call was
    # doing: PydanticUndefinedAnnotation rather than the NameError in pydantic's internals beneath it.
    chain = last_chain if root is not None and root["start"] == last_chain["start"] else root
    exception = (chain and classify.exception_line(chain["text"])) or verdict["evidence"]
    where = None
    if frame:
        short = frame.group("file").split("/site-packages/")[-1]
        where = "%s:%s in %s: %s" % (short, frame.group("line"), frame.group("function"),
                                     (frame.group("code") or "").strip())
    # The traceback(s) worth reading: from the root cause's to the end, library noise before it cut.
    text = classify.without_log_prefixes(log_text)
    return {"kind": verdict["kind"], "exception": exception, "where": where, "explain": verdict["explain"],
            "exit_status": exit_status, "traceback": text[root["start"]:][-8000:] if root else text[-4000:]}


def run(args):
    if not args.get("model"):
        raise RemoteFailure("bad-argument", "no model given")
    found = hfcache.resolve(args["model"], os.environ)
    model = found.path
    if not os.path.isfile(os.path.join(model, "config.json")):
        raise RemoteFailure("bad-argument", "model %s has no config.json" % hfcache.describe(found))
    samples = int(args.get("samples") or 6)
    if samples < BATCH_SIZE + 1:
        raise RemoteFailure("bad-argument", "samples=%r: give at least %d (two generate() calls)"
                            % (samples, BATCH_SIZE + 1))
    if args.get("slurm"):
        # A Slurm login node: the same call, on a node of a job (slurm/jobs.py), queue time included.
        return slurm_jobs.run_call(args["slurm"], "smoke", dict(args, slurm=None),
                                   wait_s=float(args.get("timeout_s") or 540) + SLURM_QUEUE_S)
    with open(os.path.join(model, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    os.makedirs(SMOKE_ROOT, exist_ok=True)
    work = tempfile.mkdtemp(prefix="smoke-", dir=SMOKE_ROOT)
    timeout_s = float(args.get("timeout_s") or 540)
    server_mode = contract.extraction_mode(pkgmeta.versions(("speculators",))["speculators"]) == contract.SERVER
    try:
        if server_mode:
            result = server_smoke.run(sys.modules[__name__], model=model, config=config, samples=samples, work=work,
                                      timeout_s=timeout_s, server_python=args.get("server_python"),
                                      host=args.get("host"), settings=args.get("server_settings") or {})
        else:
            result = _run_driver(model, config, samples, work, timeout_s)
        return dict(result, model_id=found.repo_id, resolved=hfcache.describe(found))
    finally:
        if not args.get("keep"):
            shutil.rmtree(work, ignore_errors=True)


def write_conversations(work):
    """The built-in conversations as a ShareGPT-style .jsonl in `work`; its path."""
    dataset = os.path.join(work, "conversations.jsonl")
    with open(dataset, "w", encoding="utf-8") as handle:
        for turns in CONVERSATIONS:
            handle.write(json.dumps({"conversations": [{"from": r, "value": v} for r, v in turns]}) + "\n")
    return dataset


def _run_driver(model, config, samples, work, timeout_s):
    dataset = write_conversations(work)
    overrides = shrunk_overrides(config)
    driver_args = {"model": model, "dataset": dataset, "output_dir": os.path.join(work, "out"),
                   "max_length": MAX_LENGTH, "batch_size": BATCH_SIZE, "max_samples": samples,
                   "load_format": "dummy", "hf_overrides": overrides}
    args_file = os.path.join(work, "args.json")
    with open(args_file, "w", encoding="utf-8") as handle:
        json.dump(driver_args, handle)
    log_file = os.path.join(work, "driver.log")
    started = time.monotonic()
    with open(log_file, "w+", encoding="utf-8") as log:
        proc = subprocess.Popen([sys.executable, DRIVER, args_file], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            exit_status = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise RemoteFailure("timeout", "the smoke run did not finish within %.0f s" % timeout_s) from None
        log.seek(0)
        log_text = log.read()
    elapsed = round(time.monotonic() - started, 1)
    heartbeat = atomic.read_json(os.path.join(work, "out", "heartbeat.json")) or {}
    shrunk = {k: v for k, v in overrides.items() if not isinstance(v, (dict, list))}
    if exit_status != 0:
        failure = name_failure(log_text, exit_status)
        raise RemoteFailure("smoke-failed", failure_message(failure), failure=failure, elapsed_s=elapsed,
                            shrunk=shrunk)
    data_config = atomic.read_json(os.path.join(work, "out", "data_config.json")) or {}
    return {"ok": True, "model": model, "architectures": config.get("architectures"), "shrunk": shrunk,
            "samples": heartbeat.get("samples_done"), "layer_ids": data_config.get("hidden_states", {}).get("layer_ids"),
            "tokens_per_s": heartbeat.get("tokens_per_s"), "elapsed_s": elapsed,
            "versions": (data_config.get("reproducibility") or {}).get("package_versions")}


def failure_message(failure):
    where = (" at %s" % failure["where"]) if failure["where"] else ""
    return "%s%s [%s]" % (failure["exception"], where, failure["kind"])
