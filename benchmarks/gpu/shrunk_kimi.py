"""A shrunk Kimi-K2.5 (issue 29): the published config.json's architecture, `text_config`, `vision_config` and
`quantization_config` in the same shape, at a few layers, a few experts and a small hidden size, with random
weights in the checkpoint's own formats. Where each field comes from: kimi_k25_config.json (beside this file).

    shrunk_kimi.py build DIR DATA N     writes, from one set of random weights:
        DIR/kimi-k25        the stand-in of the real checkpoint: KimiK25ForConditionalGeneration, routed experts
                            compressed-tensors INT4 pack-quantized (group 32), the rest bf16, the vision tower
                            and projector; a tokenizer trained here instead of Moonshot's (no remote code)
        DIR/kimi-k2-text    the same text model and quantization alone (DeepseekV3ForCausalLM, text_config's
                            model_type deepseek_v3): what vLLM loads when the multimodal class cannot start
        DIR/reference-bf16  the same text model with the experts dequantized to bf16 (DeepseekV3ForCausalLM,
                            no quantization_config): transformers' reference for the extracted states
    and N chat conversations at DATA (gpu_tools.conversations).

What the stand-in differs in from moonshotai/Kimi-K2.5 is `DIFFERENCES` (also in the built config's
`_specrig_stand_in`). Needs torch, safetensors, tokenizers, transformers (the device image, or the lab's
~specrig/venv-cpu-0.32 on a CPU); the packing alone (`pack_int4`, `unpack_int4`) needs only torch.
"""
import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

PROVENANCE = os.path.join(HERE, "kimi_k25_config.json")
SEED = 29
#: The published checkpoint's INT4 group (quantization_config.config_groups.group_0.weights.group_size).
GROUP_SIZE = 32
#: compressed-tensors' pack-quantized layout: 32 // num_bits values per int32, the first in the lowest bits,
#: each stored as value + 2**(num_bits-1) (compressors/pack_quantized/helpers.py: pack_to_int32's offset).
NUM_BITS = 4
PER_INT32 = 32 // NUM_BITS
OFFSET = 1 << (NUM_BITS - 1)

#: The shrunk text model: each value with why. Attention's per-head sizes stay the real ones (MLA kernels
#: are built for kv_lora_rank 512 + qk_rope_head_dim 64), and 8 heads are what one GPU of tp 8 holds of
#: the real 64; hidden_size stays a multiple of 128 and moe_intermediate_size of 64 (Marlin's MoE tiles,
#: vLLM 0.26 marlin_utils.check_moe_marlin_supports_layer) and both of the group size 32.
TEXT_SHRUNK = {
    "hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 256,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 384,
    "n_routed_experts": 16,
}
#: The shrunk vision tower. vLLM 0.26 builds it from KimiK25VisionConfig's own names (hidden_size,
#: num_hidden_layers, intermediate_size, num_attention_heads), whose defaults are the published sizes; the
#: published config.json names them vt_* (Moonshot's code): a shrunk tower must set both.
VISION_SHRUNK = {"vt_hidden_size": 128, "vt_intermediate_size": 256, "vt_num_attention_heads": 2,
                 "vt_num_hidden_layers": 2}
VISION_VLLM_NAMES = {"vt_hidden_size": "hidden_size", "vt_intermediate_size": "intermediate_size",
                     "vt_num_attention_heads": "num_attention_heads", "vt_num_hidden_layers": "num_hidden_layers"}
#: What the stand-in differs in from the real checkpoint (docs/gpu.md, issue 29).
DIFFERENCES = [
    "sizes: TEXT_SHRUNK and VISION_SHRUNK (8 of 61 layers, 16 of 384 experts, hidden 512 of 7168); the rest of "
    "text_config, vision_config and quantization_config as published",
    "tokenizer: a byte-level BPE trained here (ChatML template) instead of Moonshot's tiktoken tokenizer "
    "(tokenization_kimi.py + tiktoken.model, loaded only with trust_remote_code); bos/eos/pad and "
    "media_placeholder_token_id are its ids, not 163584/163585/163839/163605",
    "no auto_map and no remote code in the directory: vLLM 0.26 ships its own KimiK25Config and processor",
    "preprocessor_config.json holds media_proc_cfg for vLLM's own fused image processor (used when numba is "
    "installed); without numba vLLM asks for Moonshot's image processor (remote code), which is not here",
    "vision_config also names the tower's sizes as vLLM reads them (VISION_VLLM_NAMES)",
    "weights random: INT4 values uniform in [-8, 7] with bf16 scales; one safetensors file, no index",
]


def published():
    with open(PROVENANCE) as f:
        return json.load(f)["published"]


def shrunk_config(tokens):
    """The stand-in's config.json: the published one with TEXT_SHRUNK and VISION_SHRUNK, Moonshot's auto_map
    left out, and the stand-in tokenizer's ids (`tokens`: bos, eos, pad, media)."""
    config = copy.deepcopy(published())
    config.pop("auto_map")
    text, vision = config["text_config"], config["vision_config"]
    text.pop("auto_map")
    text.update(TEXT_SHRUNK)
    vision.update(VISION_SHRUNK)
    for published_name, vllm_name in VISION_VLLM_NAMES.items():
        vision[vllm_name] = vision[published_name]
    # As published, mm_hidden_size equals the tower's width; vLLM's KimiK25Config then makes it the text
    # model's hidden size (the projector's output).
    vision["mm_hidden_size"] = vision["vt_hidden_size"]
    vision["text_hidden_size"] = text["hidden_size"]
    for holder in (config, text):
        holder.update(bos_token_id=tokens["bos"], eos_token_id=tokens["eos"], pad_token_id=tokens["pad"])
    config["media_placeholder_token_id"] = tokens["media"]
    config["_specrig_stand_in"] = DIFFERENCES
    return config


def text_only_config(config, *, quantized):
    """The text model alone, DeepseekV3ForCausalLM with text_config's own model_type (deepseek_v3, which
    transformers and vLLM both know; Kimi-K2's kimi_k2 transformers 5 reads as a bare config and fails on
    its yarn rope): with the quantization, or without it for transformers' reference."""
    text = copy.deepcopy(config["text_config"])
    if not quantized:
        text.pop("quantization_config")
    return text


# -- compressed-tensors pack-quantized, INT4 symmetric, group 32 ------------------------------------------

def pack_int4(values):
    """int values in [-8, 7], shape [rows, cols] (cols a multiple of 8) -> int32 [rows, cols // 8], as
    compressed-tensors' pack_to_int32(values, 4) writes them."""
    import torch

    rows, cols = values.shape
    unsigned = (values.to(torch.int64) + OFFSET).view(rows, cols // PER_INT32, PER_INT32)
    shifts = torch.arange(PER_INT32, dtype=torch.int64) * NUM_BITS
    packed = (unsigned << shifts).sum(dim=2)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def unpack_int4(packed, cols):
    """The inverse of pack_int4: int32 [rows, cols // 8] -> int8 [rows, cols]."""
    import torch

    shifts = torch.arange(PER_INT32, dtype=torch.int32) * NUM_BITS
    nibbles = (packed.unsqueeze(-1) >> shifts) & ((1 << NUM_BITS) - 1)
    return (nibbles.reshape(packed.shape[0], -1)[:, :cols] - OFFSET).to(torch.int8)


def dequantize(values, scale):
    """bf16 weight = value x its group's scale, rounded once to bf16 (as the INT4 kernels' bf16 product)."""
    import torch

    return (values.float() * scale.float().repeat_interleave(GROUP_SIZE, dim=1)).to(torch.bfloat16)


def random_int4(rows, cols, generator, std=0.02):
    """(values int8 [rows, cols] in [-8, 7], scale bf16 [rows, cols // 32]) whose product has about `std`."""
    import torch

    values = torch.randint(-OFFSET, OFFSET, (rows, cols), generator=generator, dtype=torch.int8)
    jitter = 0.5 + torch.rand(rows, cols // GROUP_SIZE, generator=generator)
    return values, (jitter * std / 4.6).to(torch.bfloat16)  # 4.6: the std of uniform integers in [-8, 7]


# -- the weights ------------------------------------------------------------------------------------------

def text_tensors(text, generator):
    """{name under the text model: tensor}, and {expert weight name: (values, scale)} for the routed experts,
    in the published checkpoint's names and dtypes (kimi_k25_config.json's `tensors`)."""
    import torch

    def normal(*shape):
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    def ones(size):
        return torch.ones(size, dtype=torch.bfloat16)

    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    qk_head = text["qk_nope_head_dim"] + text["qk_rope_head_dim"]
    dense, experts = {}, {}
    dense["model.embed_tokens.weight"] = normal(text["vocab_size"], hidden)
    dense["lm_head.weight"] = normal(text["vocab_size"], hidden)
    dense["model.norm.weight"] = ones(hidden)
    for layer in range(text["num_hidden_layers"]):
        at = "model.layers.%d." % layer
        dense.update({
            at + "input_layernorm.weight": ones(hidden), at + "post_attention_layernorm.weight": ones(hidden),
            at + "self_attn.q_a_proj.weight": normal(text["q_lora_rank"], hidden),
            at + "self_attn.q_a_layernorm.weight": ones(text["q_lora_rank"]),
            at + "self_attn.q_b_proj.weight": normal(heads * qk_head, text["q_lora_rank"]),
            at + "self_attn.kv_a_proj_with_mqa.weight": normal(text["kv_lora_rank"] + text["qk_rope_head_dim"],
                                                               hidden),
            at + "self_attn.kv_a_layernorm.weight": ones(text["kv_lora_rank"]),
            at + "self_attn.kv_b_proj.weight": normal(heads * (text["qk_nope_head_dim"] + text["v_head_dim"]),
                                                      text["kv_lora_rank"]),
            at + "self_attn.o_proj.weight": normal(hidden, heads * text["v_head_dim"]),
        })
        if layer < text["first_k_dense_replace"]:
            inter = text["intermediate_size"]
            dense.update({at + "mlp.gate_proj.weight": normal(inter, hidden),
                          at + "mlp.up_proj.weight": normal(inter, hidden),
                          at + "mlp.down_proj.weight": normal(hidden, inter)})
            continue
        inter, count = text["moe_intermediate_size"], text["n_routed_experts"]
        dense.update({
            at + "mlp.gate.weight": normal(count, hidden),
            at + "mlp.gate.e_score_correction_bias": torch.randn(count, generator=generator) * 0.01,
            at + "mlp.shared_experts.gate_proj.weight": normal(inter * text["n_shared_experts"], hidden),
            at + "mlp.shared_experts.up_proj.weight": normal(inter * text["n_shared_experts"], hidden),
            at + "mlp.shared_experts.down_proj.weight": normal(hidden, inter * text["n_shared_experts"]),
        })
        for expert in range(count):
            for proj, (rows, cols) in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                                       ("down_proj", (hidden, inter))):
                experts[at + "mlp.experts.%d.%s" % (expert, proj)] = random_int4(rows, cols, generator)
    return dense, experts


def vision_tensors(vision, text_hidden, generator):
    """The vision tower and projector in the published names (vision_tower.*, mm_projector.*), bf16."""
    import torch

    def normal(*shape):
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    width, inter = vision["vt_hidden_size"], vision["vt_intermediate_size"]
    merged = width * vision["merge_kernel_size"][0] * vision["merge_kernel_size"][1]
    zeros = {"dtype": torch.bfloat16}
    out = {
        "vision_tower.patch_embed.proj.weight": normal(width, 3, vision["patch_size"], vision["patch_size"]),
        "vision_tower.patch_embed.proj.bias": torch.zeros(width, **zeros),
        "vision_tower.patch_embed.pos_emb.weight": normal(vision["init_pos_emb_height"],
                                                          vision["init_pos_emb_width"], width),
        "vision_tower.encoder.final_layernorm.weight": torch.ones(width, **zeros),
        "vision_tower.encoder.final_layernorm.bias": torch.zeros(width, **zeros),
        "mm_projector.pre_norm.weight": torch.ones(width, **zeros),
        "mm_projector.pre_norm.bias": torch.zeros(width, **zeros),
        "mm_projector.proj.0.weight": normal(merged, merged), "mm_projector.proj.0.bias": torch.zeros(merged, **zeros),
        "mm_projector.proj.2.weight": normal(text_hidden, merged),
        "mm_projector.proj.2.bias": torch.zeros(text_hidden, **zeros),
    }
    for block in range(vision["vt_num_hidden_layers"]):
        at = "vision_tower.encoder.blocks.%d." % block
        for name, shape in (("wqkv", (3 * width, width)), ("wo", (width, width)), ("mlp.fc0", (inter, width)),
                            ("mlp.fc1", (width, inter))):
            out[at + name + ".weight"] = normal(*shape)
            out[at + name + ".bias"] = torch.zeros(shape[0], **zeros)
        for norm in ("norm0", "norm1"):
            out[at + norm + ".weight"] = torch.ones(width, **zeros)
            out[at + norm + ".bias"] = torch.zeros(width, **zeros)
    return out


def quantized_tensors(experts, prefix=""):
    """The routed experts as compressed-tensors writes them: weight_packed, weight_scale, weight_shape."""
    import torch

    out = {}
    for name, (values, scale) in experts.items():
        out[prefix + name + ".weight_packed"] = pack_int4(values)
        out[prefix + name + ".weight_scale"] = scale
        out[prefix + name + ".weight_shape"] = torch.tensor(values.shape, dtype=torch.int32)
    return out


#: vLLM's fused image processor's settings (vllm/transformers_utils/processors/kimi_k25_vision_fused.py reads
#: these keys of media_proc_cfg); the values are the tower's: patch 14, merge 2x2, 4 frames a chunk.
MEDIA_PROC_CFG = {"patch_size": 14, "merge_kernel_size": [2, 2], "temporal_merge_kernel_size": 4,
                  "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "in_patch_limit": 16384,
                  "in_patch_limit_each_frame": 4096, "in_patch_limit_video": None, "patch_limit_on_one_side": 512,
                  "fixed_output_tokens": None}


def stand_in_tokenizer(rows, vocab):
    """The lab's ChatML BPE (make_tiny_model.train_tokenizer) with Kimi's media tokens added."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "specrig", "lab"))
    from make_tiny_model import train_tokenizer

    texts = [turn["value"] for row in rows[:400] for turn in row["conversations"]] + [" ".join(vocab)]
    tokenizer = train_tokenizer(texts + ["<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_start|>system\n"],
                                8192)
    tokenizer.add_special_tokens({"additional_special_tokens": [
        "<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>", "<|kimi_k25_video_placeholder|>"]})
    return tokenizer


def save(directory, config, tensors, tokenizer, *, preprocessor=False):
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    tokenizer.save_pretrained(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": config["eos_token_id"], "bos_token_id": config["bos_token_id"]}, f)
    if preprocessor:
        with open(os.path.join(directory, "preprocessor_config.json"), "w") as f:
            json.dump({"media_proc_cfg": MEDIA_PROC_CFG}, f, indent=1)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()},
              os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def build(out_dir, data_path, n):
    import time

    import torch
    from gpu_tools import conversations

    started = time.time()
    rows, vocab = conversations(n)
    os.makedirs(os.path.dirname(os.path.abspath(data_path)), exist_ok=True)
    with open(data_path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    tokenizer = stand_in_tokenizer(rows, vocab)
    tokens = {"bos": tokenizer.convert_tokens_to_ids("<|im_start|>"), "eos": tokenizer.eos_token_id,
              "pad": tokenizer.pad_token_id, "media": tokenizer.convert_tokens_to_ids("<|media_pad|>")}
    config = shrunk_config(tokens)
    generator = torch.Generator().manual_seed(SEED)
    dense, experts = text_tensors(config["text_config"], generator)
    vision = vision_tensors(config["vision_config"], config["text_config"]["hidden_size"], generator)
    packed = quantized_tensors(experts)
    built = {}
    kimi = os.path.join(out_dir, "kimi-k25")
    save(kimi, config, dict({"language_model." + k: v for k, v in {**dense, **packed}.items()}, **vision),
         tokenizer, preprocessor=True)
    built["kimi-k25"] = kimi
    text = os.path.join(out_dir, "kimi-k2-text")
    save(text, text_only_config(config, quantized=True), {**dense, **packed}, tokenizer)
    built["kimi-k2-text"] = text
    reference = os.path.join(out_dir, "reference-bf16")
    bf16 = {name + ".weight": dequantize(values, scale) for name, (values, scale) in experts.items()}
    save(reference, text_only_config(config, quantized=False), {**dense, **bf16}, tokenizer)
    built["reference-bf16"] = reference
    params = sum(t.numel() for t in dense.values()) + sum(v.numel() for v, _ in experts.values())
    print(json.dumps({"models": built, "data": data_path, "conversations": len(rows), "text_params": params,
                      "experts_packed": len(experts), "vision_tensors": len(vision), "tokens": tokens,
                      "num_hidden_layers": config["text_config"]["num_hidden_layers"],
                      "build_s": round(time.time() - started, 1)}))


def main(argv):
    if argv[:1] == ["build"] and len(argv) == 4:
        build(argv[1], argv[2], int(argv[3]))
    else:
        sys.exit("usage: shrunk_kimi.py build DIR DATA N")


if __name__ == "__main__":
    main(sys.argv[1:])
