"""`inv extract --dry-run`: what a server-mode run of a model needs per GPU, and the settings specrig would
choose, from the model's config.json and hosts.yaml's description of the host (gpus, gpu_memory_mib);
nothing is reached (issue 29, point 3: Kimi-K2.5 on 8 GPUs).

The arithmetic, per GPU at tensor-parallel size tp, for a DeepSeek-V3-class text model (MLA, MoE; Kimi-K2.5's
`text_config`), as vLLM 0.26 places the weights (vllm/model_executor/models/deepseek_v2.py):

- **weights**: q_a_proj and kv_a_proj_with_mqa whole on each GPU (replicated), q_b/kv_b/o_proj split by heads;
  the dense layers' MLP, the shared experts and every routed expert split along their intermediate size;
  the embedding and LM head split by vocabulary; norms, routers and the vision tower whole on each GPU (the
  vision tower: vLLM's recipe serves Kimi-K2.5 with `--mm-encoder-tp-mode data`, one copy per GPU). A routed
  expert quantized INT4 with group g takes 1/2 byte a weight and one bf16 scale per g weights.
- **KV cache**: MLA keeps one latent of kv_lora_rank + qk_rope_head_dim values per token and layer, the same
  on every GPU of the tp group (it is not split by heads).
- **staging**: the connector writes each request's states (its tokens x the captured layers x hidden size, in
  the storage's bytes) to the staging directory; about STAGING_MARGIN files per request in flight are there.

The settings: max-model-len = max_len + 1 (the prompt and the one generated token); max-num-batched-tokens
= max(vLLM's own for its API server on GPUs of 70 GiB or more, max-model-len), so that one whole prompt fits
one step; concurrency = specrig's default, or fewer when the KV cache cannot hold that many whole prompts;
staging = concurrency x STAGING_MARGIN x one request's states.
"""
from __future__ import annotations

import json
from pathlib import Path

from specrig.contract import DRIVER_DEFAULTS, SERVER_DEFAULTS, STAGING_MARGIN, stored_bytes_per_token
from specrig.errors import UsageError

MIB = 1 << 20
GIB = 1 << 30
BF16 = 2
#: vLLM's default share of GPU memory (CacheConfig.gpu_memory_utilization); server mode passes none unless set.
VLLM_GPU_MEMORY_UTILIZATION = 0.9
#: vLLM 0.26's max_num_batched_tokens for its API server on GPUs of 70 GiB or more (not A100):
#: vllm/engine/arg_utils.py:2460-2464.
VLLM_BATCHED_TOKENS = 8192
#: Memory a GPU keeps beside weights and KV cache, from the H200 run of issue 29 (docs/gpu.md): vLLM 0.26.0's own
#: breakdown for the shrunk Kimi-K2.5 at 8192 batched tokens was 5.02 GiB of peak activation and 0.23 GiB
#: non-torch. The peak is the step's logits, batched tokens x vocabulary in fp32 (8192 x 163840 x 4 B = 5.0 GiB),
#: which grow with --max-len past 8192, not with the hidden size. OTHER_RUNTIME_BYTES allows for the rest at the
#: real size: the hidden size's activations, CUDA's and NCCL's buffers at tp 8, not measured.
LOGITS_BYTES_PER_VALUE = 4
OTHER_RUNTIME_BYTES = 3 * GIB
#: The layers speculators captures by default: [2, L // 2, L - 3, L] (remote/base/server_command.py).
DEFAULT_LAYER_COUNT = 4


#: What the arithmetic below reads of the text model (the config's top level, or its `text_config`): a
#: DeepSeek-V3-class model, MLA and MoE. first_k_dense_replace and n_shared_experts have defaults.
TEXT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "q_lora_rank",
               "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "intermediate_size",
               "n_routed_experts", "moe_intermediate_size")
#: What vision_params reads of a Kimi-K2.5 `vision_config` (MoonViT's published names).
VISION_FIELDS = ("vt_hidden_size", "vt_intermediate_size", "vt_num_hidden_layers", "patch_size",
                 "init_pos_emb_height", "init_pos_emb_width", "text_hidden_size", "merge_kernel_size")
#: What a file that is no model's config is told to be instead.
MODEL_CONFIG_HINT = "pass --model a directory holding the model's own config.json, the one beside its weights"


def read_config(path: Path) -> dict:
    """The model's config.json at `path`, checked to hold every number the plan reads: a file that is not
    JSON, not a model's config or not one of a model the arithmetic knows is a UsageError naming the file and
    what it lacks, never a KeyError from deep in the sums."""
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not JSON ({exc})", hint=MODEL_CONFIG_HINT) from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: not a model's config.json: a JSON {type(config).__name__}, not an object",
                         hint=MODEL_CONFIG_HINT)
    text = _text(config)
    where = "text_config." if text is not config else ""
    missing = [name for name in TEXT_FIELDS if name not in text]
    if "hidden_size" in missing:
        named = ", ".join(where + name for name in missing[:3])
        more = f" and {len(missing) - 3} more of the plan's numbers" if len(missing) > 3 else ""
        raise UsageError(f"{path}: not a model's config.json: no {named}{more}", hint=MODEL_CONFIG_HINT)
    if missing:
        raise UsageError(f"{path}: --dry-run sizes MLA mixture-of-experts models (DeepSeek-V3's shape, Kimi-K2.5's "
                         f"text model), and this config has no {', '.join(where + name for name in missing)}",
                         hint="the dry run knows no other shape yet; the run itself does not need it")
    vision = config.get("vision_config") or {}
    if not isinstance(vision, dict):
        raise UsageError(f"{path}: vision_config is {vision!r}, not an object", hint=MODEL_CONFIG_HINT)
    missing_vision = [name for name in VISION_FIELDS if vision and name not in vision]
    if missing_vision:
        raise UsageError(f"{path}: --dry-run sizes Kimi-K2.5's vision tower by its published vt_* names, and this "
                         f"config's vision_config has no {', '.join(missing_vision)}", hint=MODEL_CONFIG_HINT)
    numbers = [(where + name, text[name]) for name in TEXT_FIELDS]
    numbers += [(f"vision_config.{name}", vision[name]) for name in VISION_FIELDS[:-1] if vision]
    merge = vision.get("merge_kernel_size")
    if vision and not (isinstance(merge, list) and len(merge) == 2):
        raise UsageError(f"{path}: vision_config.merge_kernel_size is {merge!r}, not two sizes such as [2, 2]",
                         hint=MODEL_CONFIG_HINT)
    numbers += [(f"vision_config.merge_kernel_size[{index}]", size) for index, size in enumerate(merge or ())]
    for name, value in numbers:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UsageError(f"{path}: {name} is {value!r}, not a positive integer", hint=MODEL_CONFIG_HINT)
    return config


def _text(config: dict) -> dict:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _quant_group(config: dict) -> int | None:
    """The INT4 group size of a compressed-tensors pack-quantized config whose ignore list leaves the routed
    experts quantized (Kimi-K2.5's), else None (every weight in bf16)."""
    quant = config.get("quantization_config") or _text(config).get("quantization_config") or {}
    for group in (quant.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        if quant.get("format") == "pack-quantized" and weights.get("num_bits") == 4:
            return weights.get("group_size")
    return None


def vision_params(vision: dict) -> int:
    """The vision tower and projector of a Kimi-K2.5 vision_config (published names, vt_*)."""
    if not vision:
        return 0
    width, inter = vision["vt_hidden_size"], vision["vt_intermediate_size"]
    merged = width * vision["merge_kernel_size"][0] * vision["merge_kernel_size"][1]
    block = 3 * width * width + 3 * width + width * width + width + 2 * inter * width + inter + width + 4 * width
    tower = (vision["vt_num_hidden_layers"] * block + width * 3 * vision["patch_size"] ** 2 + width
             + vision["init_pos_emb_height"] * vision["init_pos_emb_width"] * width + 2 * width)
    projector = 2 * width + merged * merged + merged + vision["text_hidden_size"] * merged + vision["text_hidden_size"]
    return tower + projector


def weights_per_gpu(config: dict, tp: int) -> dict:
    """{part: bytes on one GPU} at tensor-parallel size `tp`, and "total"."""
    text = _text(config)
    hidden, layers, heads = text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"]
    q_lora, kv_lora, rope = text["q_lora_rank"], text["kv_lora_rank"], text["qk_rope_head_dim"]
    nope, v_head = text["qk_nope_head_dim"], text["v_head_dim"]
    dense_layers = text.get("first_k_dense_replace", 0)
    moe_layers = layers - dense_layers
    experts, moe_inter = text["n_routed_experts"], text["moe_intermediate_size"]
    replicated = (q_lora * hidden + (kv_lora + rope) * hidden + q_lora + kv_lora + 2 * hidden) * layers
    split = heads * (nope + rope) * q_lora + heads * (nope + v_head) * kv_lora + hidden * heads * v_head
    expert_weights = moe_layers * experts * 3 * moe_inter * hidden
    group = _quant_group(config)
    parts = {
        "attention": (replicated + split * layers / tp) * BF16,
        "dense_mlp": dense_layers * 3 * text["intermediate_size"] * hidden * BF16 / tp,
        "shared_experts": moe_layers * 3 * moe_inter * text.get("n_shared_experts", 1) * hidden * BF16 / tp,
        "routed_experts": expert_weights * (0.5 + BF16 / group if group else BF16) / tp,
        "routers": moe_layers * experts * (hidden * BF16 + 4),
        "embeddings": 2 * text["vocab_size"] * hidden * BF16 / tp + hidden * BF16,
        "vision": vision_params(config.get("vision_config") or {}) * BF16,
    }
    parts = {name: int(value) for name, value in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


def kv_bytes_per_token(config: dict) -> int:
    """MLA's latent cache of one token over every layer, in bf16, on each GPU of the tp group."""
    text = _text(config)
    return (text["kv_lora_rank"] + text["qk_rope_head_dim"]) * text["num_hidden_layers"] * BF16


def runtime_reserve(config: dict, batched_tokens: int) -> int:
    """What a GPU keeps beside weights and KV cache: one step's logits and the rest's allowance."""
    vocab = _text(config).get("vocab_size") or config["vocab_size"]
    return batched_tokens * vocab * LOGITS_BYTES_PER_VALUE + OTHER_RUNTIME_BYTES


def plan(config: dict, *, gpus: int, gpu_memory_mib: int, tp: int | None = None, max_len: int | None = None,
         layer_count: int | None = None, storage: str | None = None, concurrency: int | None = None,
         gpu_memory_utilization: float | None = None) -> dict:
    """The run's figures and settings on a host of `gpus` GPUs of `gpu_memory_mib` each (a UsageError when
    the weights leave no room for one whole prompt's KV cache)."""
    tp = tp or gpus
    text = _text(config)
    max_len = max_len or DRIVER_DEFAULTS["max_length"]
    layers = layer_count or DEFAULT_LAYER_COUNT
    storage = storage or SERVER_DEFAULTS["storage"]
    utilization = gpu_memory_utilization or VLLM_GPU_MEMORY_UTILIZATION
    weights = weights_per_gpu(config, tp)
    usable = int(gpu_memory_mib * MIB * utilization)
    max_model_len = max_len + 1
    batched_tokens = max(VLLM_BATCHED_TOKENS, max_model_len)
    reserve = runtime_reserve(config, batched_tokens)
    kv_budget = usable - weights["total"] - reserve
    per_token = kv_bytes_per_token(config)
    kv_tokens = max(0, kv_budget) // per_token
    if kv_tokens < max_model_len:
        raise UsageError(f"--tp {tp}: {weights['total'] / GIB:.1f} GiB of weights per GPU leave "
                         f"{max(0, kv_budget) / GIB:.1f} GiB for the KV cache, less than one prompt of "
                         f"{max_model_len} tokens", hint="use more GPUs (--tp), or a shorter --max-len")
    wanted = concurrency or SERVER_DEFAULTS["concurrency"]
    chosen = min(wanted, kv_tokens // max_model_len)
    request_bytes = max_len * stored_bytes_per_token(storage, layers * text["hidden_size"], BF16)
    return {
        "gpus": gpus, "tp": tp, "gpu_memory_bytes": gpu_memory_mib * MIB, "gpu_memory_utilization": utilization,
        "weights_per_gpu": weights, "runtime_reserve_bytes": reserve,
        "kv_bytes_per_token": per_token, "kv_budget_bytes": kv_budget, "kv_tokens": kv_tokens,
        "staging_bytes_per_request": request_bytes, "layer_count": layers, "storage": storage,
        "settings": {"max_model_len": max_model_len,
                     "max_num_batched_tokens": batched_tokens,
                     "concurrency": chosen, "staging_bytes": chosen * STAGING_MARGIN * request_bytes},
        "concurrency_bound": "kv cache" if chosen < wanted else "specrig's default" if not concurrency else "given",
    }


def host_description(host) -> tuple[int, int]:
    """(gpus, gpu_memory_mib) from hosts.yaml's entry, which the dry run reaches nothing to learn."""
    if not host.gpus or not host.gpu_memory_mib:
        raise UsageError(f"{host.name}: --dry-run sizes the run from hosts.yaml's gpus and gpu_memory_mib, and "
                         f"this entry gives gpus={host.gpus!r}, gpu_memory_mib={host.gpu_memory_mib!r}",
                         hint="add both to the host's entry (nvidia-smi --query-gpu=memory.total gives the MiB)")
    return host.gpus, host.gpu_memory_mib
