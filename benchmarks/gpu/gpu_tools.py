"""GPU-side helpers of the GPU run (benchmarks/gpu/device_run.py), each a subcommand run in a process of
its own so that the harness itself never holds a CUDA context (it would show in nvidia-smi as a compute
process and keep GPU memory between the arms):

    gpu_tools.py build-model DIR SHAPE DATA N     a random-weight Llama of SHAPE (llama8b, llama1b, tiny)
                                                  in bf16 with a BPE tokenizer trained here, and N chat
                                                  conversations (half with one long shared system
                                                  prompt), nothing downloaded
    gpu_tools.py deepseek-config DIR TOKENIZER    a DeepSeek-V3-shaped config.json (published fields) and
                                                  the tokenizer of TOKENIZER, for `inv smoke`
    gpu_tools.py reference HS_DIR MODEL IDS JSON  every stored layer of every file against transformers'
                                                  forward in bf16 on the GPU (and the shifted pairing)
    gpu_tools.py bare-client PREPARED PORT MODEL C N JSON [wait-health]
                                                  bare prefill: each prepared sample once, max_tokens=1,
                                                  C requests in flight, no extraction (wait-health: from
                                                  the server's /health on, its prompts loaded before)

Needs torch, transformers, tokenizers, safetensors, datasets (the device image and the wheels).
"""
import json
import math
import os
import random
import sys
import threading
import time
import urllib.request

# The lab's recipe for a tokenizer trained here (ChatML, byte-level BPE): one for the lab and this run.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "specrig", "lab"))
from make_tiny_model import train_tokenizer

SEED = 19
#: Tokens compared to tell the samples opening with the shared system prompt from the others.
PREFIX_TOKENS = 64
#: Llama-3-8B's and TinyLlama-1.1B's published shapes (vocab kept at the real size: the embedding and
#: the LM head are a real part of the work); "tiny" for a CPU rehearsal.
SHAPES = {
    "llama8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=128, max_position_embeddings=8192, vocab_size=128256,
                    rope_theta=500000.0, rms_norm_eps=1e-5),
    "llama1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=4, head_dim=64, max_position_embeddings=4096, vocab_size=32000,
                    rope_theta=10000.0, rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, vocab_size=4096,
                 rope_theta=10000.0, rms_norm_eps=1e-5),
}
#: Words of the synthetic chats: pseudo-words from syllables, so that the tokenizer learns real merges.
SYLLABLES = "ka to ri mu se na lo pe di gu fa ve zo ch th qu ex an or in el ar um is".split()


def words(rng, n_words=3000):
    vocab = set()
    while len(vocab) < n_words:
        vocab.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
    return sorted(vocab)


def text(rng, vocab, n):
    out, sentence = [], 0
    for _ in range(n):
        word = rng.choice(vocab)
        if sentence == 0:
            word = word.capitalize()
        sentence += 1
        if sentence > rng.randint(6, 20):
            word += "."
            sentence = 0
        out.append(word)
    return " ".join(out)


def conversations(n, seed=SEED):
    """n single-turn chats; lengths spread up to about 1900 words; the even ones open with the same long
    system prompt (as chat data with one system prompt does: prefix caching sees it)."""
    rng = random.Random(seed)
    vocab = words(rng)
    system = text(rng, vocab, 700)
    rows = []
    for i in range(n):
        turns = []
        if i % 2 == 0:
            turns.append({"from": "system", "value": system})
            budget = rng.randint(100, 1150)
        else:
            budget = rng.randint(150, 1850)
        user = max(20, int(budget * rng.uniform(0.1, 0.5)))
        turns.append({"from": "human", "value": text(rng, vocab, user)})
        turns.append({"from": "gpt", "value": text(rng, vocab, max(20, budget - user))})
        rows.append({"conversations": turns})
    return rows, vocab


def build_model(out_dir, shape, data_path, n):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    started = time.time()
    rows, vocab = conversations(n)
    os.makedirs(os.path.dirname(os.path.abspath(data_path)), exist_ok=True)
    with open(data_path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    fields = dict(SHAPES[shape])
    texts = [turn["value"] for row in rows[:400] for turn in row["conversations"]] + [" ".join(vocab)]
    tokenizer = train_tokenizer(texts + ["<|im_start|>user\n", "<|im_start|>assistant\n",
                                         "<|im_start|>system\n"], min(8192, fields["vocab_size"]))
    os.makedirs(out_dir, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    torch.manual_seed(SEED)
    config = LlamaConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None, tie_word_embeddings=False, torch_dtype="bfloat16", **fields)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 directly: no fp32 copy of 8B parameters
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    torch.set_default_dtype(torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    built = time.time()
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="5GB")
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": out_dir, "shape": shape, "params": params, "vocab_trained": len(tokenizer),
                      "data": data_path, "conversations": len(rows), "device": device,
                      "build_s": round(built - started, 1), "save_s": round(time.time() - built, 1)}))


#: A DeepSeek-V3 config.json's published fields (deepseek-ai/DeepSeek-V3, config.json; Kimi-K2 uses the
#: same architecture class with 384 experts and 64 heads), without its FP8 quantization_config.
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
    "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "tie_word_embeddings": False,
    "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                          "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                          "type": "yarn"},
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}


def deepseek_config(out_dir, tokenizer_dir):
    import shutil
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(tokenizer_dir):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(os.path.join(tokenizer_dir, name), out_dir)
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
        tokens = json.load(f)
    config = dict(DEEPSEEK_V3)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    print(json.dumps({"model": out_dir, "architectures": config["architectures"],
                      "tokenizer_eos": tokens.get("eos_token")}))


# -- the states against transformers ------------------------------------------------------------------

#: The bf16 tolerance, set before the run: vLLM may be off transformers' bf16 forward by at most
#: BF16_MARGIN times what bf16 itself costs transformers at that layer (its bf16 forward against its fp32
#: forward of the same weights, worst of CALIBRATION_SAMPLES samples). A fixed figure cannot serve: on
#: 8B-wide random weights bf16 drifts 1-2 % at the first layers and 5-6 % at the last (the first GPU run,
#: docs/gpu.md). Two bf16 computations with independent rounding sit about sqrt(2) apart of one's own
#: error; 2 leaves room for vLLM's other kernels (FlashAttention, fused norms) and no more.
BF16_MARGIN = 2.0
CALIBRATION_SAMPLES = 32
#: The shifted pairing (the next layer's output) must be off by more than this, and more than the tolerance.
SHIFTED_MIN = 0.1


def load_model(model_dir, dtype, device):
    import torch  # noqa: F401 - transformers' import needs it loaded first on the device image
    from transformers import AutoModelForCausalLM
    try:
        import accelerate  # noqa: F401 - device_map needs it: load straight onto the GPU
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map=device).eval()
    except ImportError:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()


def residual_stream(model):
    """{0: the embeddings, k: decoder layer k's output}, filled by each forward."""
    acts = {}
    model.model.embed_tokens.register_forward_hook(lambda m, i, o: acts.__setitem__(0, o.detach()))
    for index, layer in enumerate(model.model.layers):
        layer.register_forward_hook(lambda m, i, o, index=index: acts.__setitem__(
            index + 1, (o[0] if isinstance(o, tuple) else o).detach()))
    return acts


def rel_l2(got, ref):
    """(relative L2 error, max |diff|, max |ref|, sum diff^2, sum ref^2) of two tensors, in fp32."""
    diff = got.float() - ref.float()
    sq_diff, sq_ref = float((diff * diff).sum()), float((ref.float() ** 2).sum())
    return (math.sqrt(sq_diff / sq_ref) if sq_ref else float("inf"), float(diff.abs().max()),
            float(ref.abs().max()), sq_diff, sq_ref)


def reference(hs_dir, model_dir, layer_ids, out_json):
    """For each stored id k (axis 1, ascending) and every file: the stored rows against transformers'
    residual stream in bf16 on the same GPU, two pairings:
      documented  id k = the output of decoder layer k-1 (0: the embeddings) = the input of layer k
      shifted     id k = the output of decoder layer k (k = L: of layer L-2, one the other way)
    per layer: max |diff|, max |reference|, relative L2 error over all tokens, the worst sample's.
    On the first CALIBRATION_SAMPLES files, also against transformers' fp32 forward: what bf16 costs
    transformers itself there sets the tolerance (BF16_MARGIN). A layer passes when every sample is
    within it; the shifted pairing must exceed it and SHIFTED_MIN on every layer (it must fail)."""
    import torch
    from safetensors.torch import load_file

    started = time.time()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, exact = load_model(model_dir, torch.bfloat16, device), load_model(model_dir, torch.float32, device)
    loaded = time.time()
    n_layers = len(model.model.layers)
    acts, acts32 = residual_stream(model), residual_stream(exact)
    pairings = {"documented": {k: k for k in layer_ids},
                "shifted": {k: (k + 1 if k < n_layers else k - 1) for k in layer_ids}}
    stats = {name: {str(k): {"max_abs_diff": 0.0, "max_abs_ref": 0.0, "sq_diff": 0.0, "sq_ref": 0.0,
                             "worst_sample_rel_l2": 0.0, "worst_sample": None}
                    for k in layer_ids} for name in pairings}
    # Calibration, per layer: the worst sample's transformers bf16 against fp32, and vLLM's against fp32.
    calibration = {who: {str(k): 0.0 for k in layer_ids} for who in ("transformers_bf16", "vllm")}
    files = sorted((f for f in os.listdir(hs_dir) if f.startswith("hs_") and f.endswith(".safetensors")),
                   key=lambda f: int(f[3:-12]))
    problems, tokens, dtype, nonfinite = [], 0, None, 0
    # Per sample: its length, whether it opens with the prefix most samples share (the system prompt the
    # prefix cache serves from another request), and its documented pairing's error per layer.
    per_sample = []
    openings = {name: tuple(load_file(os.path.join(hs_dir, name))["token_ids"][:PREFIX_TOKENS].tolist())
                for name in files}
    common = max(set(openings.values()), key=list(openings.values()).count) if openings else None
    for position, name in enumerate(files):
        tensors = load_file(os.path.join(hs_dir, name))
        token_ids, stored = tensors["token_ids"], tensors["hidden_states"]
        dtype = str(stored.dtype)
        if tuple(stored.shape) != (len(token_ids), len(layer_ids), model.config.hidden_size):
            problems.append("%s: shape %s" % (name, tuple(stored.shape)))
            continue
        tokens += len(token_ids)
        stored = stored.to(device)
        if not torch.isfinite(stored).all():
            nonfinite += 1
        calibrating = position < CALIBRATION_SAMPLES
        with torch.no_grad():
            model(token_ids[None].long().to(device))
            if calibrating:
                exact(token_ids[None].long().to(device))
        sample = {"file": name, "tokens": len(token_ids), "shared_prefix": openings[name] == common, "rel_l2": {}}
        per_sample.append(sample)
        for j, k in enumerate(layer_ids):
            got = stored[:, j]
            if calibrating:
                for who, value in (("transformers_bf16", acts[k][0]), ("vllm", got)):
                    calibration[who][str(k)] = max(calibration[who][str(k)], rel_l2(value, acts32[k][0])[0])
            for pairing, which in pairings.items():
                rel, max_diff, max_ref, sq_diff, sq_ref = rel_l2(got, acts[which[k]][0])
                entry = stats[pairing][str(k)]
                entry["max_abs_diff"] = max(entry["max_abs_diff"], max_diff)
                entry["max_abs_ref"] = max(entry["max_abs_ref"], max_ref)
                entry["sq_diff"] += sq_diff
                entry["sq_ref"] += sq_ref
                if pairing == "documented":
                    sample["rel_l2"][str(k)] = round(rel, 5)
                if rel > entry["worst_sample_rel_l2"]:
                    entry["worst_sample_rel_l2"], entry["worst_sample"] = rel, name
    for pairing in stats.values():
        for entry in pairing.values():
            entry["rel_l2"] = math.sqrt(entry["sq_diff"] / entry["sq_ref"]) if entry["sq_ref"] else None
            del entry["sq_diff"], entry["sq_ref"]
    tolerance = {k: BF16_MARGIN * e for k, e in calibration["transformers_bf16"].items()}
    documented_ok = bool(files) and not problems and not nonfinite and all(
        e["worst_sample_rel_l2"] <= tolerance[k] and calibration["vllm"][k] <= tolerance[k]
        for k, e in stats["documented"].items())
    shifted_fails = all(e["rel_l2"] is not None and e["rel_l2"] > max(SHIFTED_MIN, tolerance[k])
                        for k, e in stats["shifted"].items())
    result = {"files": len(files), "tokens": tokens, "dtype": dtype, "layer_ids": layer_ids,
              "num_hidden_layers": n_layers, "device": device,
              "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
              "reference": "transformers %s forward, bf16, forward hooks (residual stream before the final norm)"
                           % __import__("transformers").__version__,
              "tolerance": {"rule": "per layer: BF16_MARGIN x transformers' own bf16 error against its fp32 "
                                    "forward (worst calibration sample); every sample of vLLM against transformers "
                                    "bf16, and the calibration samples of vLLM against fp32, within it",
                            "bf16_margin": BF16_MARGIN, "calibration_samples": min(CALIBRATION_SAMPLES, len(files)),
                            "rel_l2_per_layer": tolerance, "shifted_must_exceed": SHIFTED_MIN},
              "calibration_fp32": calibration,
              "documented": stats["documented"], "shifted": stats["shifted"],
              "problems": problems, "files_with_nonfinite": nonfinite,
              "by_prefix": {group: {str(k): max([x["rel_l2"][str(k)] for x in per_sample
                                                 if x["shared_prefix"] == (group == "shared")] or [None],
                                                key=lambda v: -1 if v is None else v)
                                    for k in layer_ids}
                            for group in ("shared", "own")},
              "samples": per_sample,
              "within_tolerance": documented_ok, "shifted_fails": shifted_fails,
              "load_s": round(loaded - started, 1), "check_s": round(time.time() - loaded, 1)}
    with open(out_json, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("files", "tokens", "within_tolerance", "shifted_fails", "check_s")}))


# -- bare prefill: the same prompts, no extraction, max_tokens=1 --------------------------------------

def bare_client(prepared, port, model, concurrency, n, out_json, wait_health=False):
    """Each prepared sample once, max_tokens=1, `concurrency` in flight. With `wait_health`, the prompts are
    loaded first and the requests start once the server answers /health. Times are epoch seconds (the
    harness makes them the arm's) and the wall from the first request; `prompts` is arms.prompts_digest of
    what was sent, the same digest the extraction arms take of their files' token ids."""
    import arms
    from datasets import load_from_disk

    rows = load_from_disk(prepared)
    prompts = [list(map(int, row)) for row in rows["input_ids"][:n]]
    digest = arms.prompts_digest(prompts)
    if wait_health and not arms.wait_for_health(port):
        sys.exit("the server on port %d never answered /health" % port)
    url = "http://127.0.0.1:%d/v1/completions" % port
    lock, queue, done = threading.Lock(), list(range(len(prompts)))[::-1], []
    errors, answered = [], []

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop()
            body = json.dumps({"model": model, "prompt": prompts[i], "max_tokens": 1}).encode()
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=600) as answer:
                    reply = json.load(answer)
                usage = reply.get("usage") or {}
                with lock:
                    done.append(usage.get("prompt_tokens") or len(prompts[i]))
                    answered.append(time.time())
            except Exception as exc:  # counted and reported
                with lock:
                    errors.append("%d: %s" % (i, exc))

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    open(out_json + ".sending", "w").close()  # the profile window's cue (profiling.py)
    started = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - started
    result = {"samples": len(done), "tokens": sum(done), "wall_s": round(wall, 2), "sending_at": round(started, 3),
              "first_response_s": round(min(answered) - started, 3) if answered else None,
              "first_response_at": round(min(answered), 3) if answered else None,
              "last_response_at": round(max(answered), 3) if answered else None,
              "errors": errors[:10], "error_count": len(errors), "concurrency": concurrency, "prompts": digest,
              "tokens_per_s": round(sum(done) / wall, 1) if wall else None,
              "samples_per_s": round(len(done) / wall, 2) if wall else None}
    with open(out_json, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


def main(argv):
    command, rest = argv[0], argv[1:]
    if command == "build-model":
        build_model(rest[0], rest[1], rest[2], int(rest[3]))
    elif command == "deepseek-config":
        deepseek_config(rest[0], rest[1])
    elif command == "reference":
        reference(rest[0], rest[1], [int(x) for x in rest[2].split(",")], rest[3])
    elif command == "bare-client":
        bare_client(rest[0], int(rest[1]), rest[2], int(rest[3]), int(rest[4]), rest[5],
                    wait_health=rest[6:7] == ["wait-health"])
    else:
        sys.exit("unknown command %r" % command)


if __name__ == "__main__":
    main(sys.argv[1:])
