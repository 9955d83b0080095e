"""A draft that predicts its target, made by hand from a `speculators train --dry-run` checkpoint, for the lab's
random-weight tiny-llama (no accelerator: the lab cannot train). Run with the lab's speculators python:

    python craft_draft.py DRAFT_DIR TARGET_DIR

The checkpoint must read target layers whose last is the target's last but one (--target-layer-ids ... 7 of
its 8). The draft then passes that layer's state straight through (fc selects it, the decoder layer's
attention and MLP write nothing) to the target's own final norm and lm_head: it proposes nearly the target's
next token, as a well-trained draft would. Edited in place.
"""
import sys

import torch
from safetensors.torch import load_file, save_file

draft, target = sys.argv[1], sys.argv[2]
weights = load_file(f"{draft}/model.safetensors")
target_weights = load_file(f"{target}/model.safetensors")
hidden = weights["norm.weight"].shape[0]
dtype = weights["fc.weight"].dtype
fc = torch.zeros_like(weights["fc.weight"])
fc[:, 2 * hidden:3 * hidden] = torch.eye(hidden, dtype=dtype)  # the third captured layer: the last but one
weights.update({
    "fc.weight": fc,
    "input_norm.weight": torch.ones_like(weights["input_norm.weight"]),
    "layers.0.hidden_norm.weight": torch.ones_like(weights["layers.0.hidden_norm.weight"]),
    "layers.0.self_attn.o_proj.weight": torch.zeros_like(weights["layers.0.self_attn.o_proj.weight"]),
    "layers.0.mlp.down_proj.weight": torch.zeros_like(weights["layers.0.mlp.down_proj.weight"]),
    "norm.weight": target_weights["model.norm.weight"].to(dtype),
    "lm_head.weight": target_weights["lm_head.weight"].to(dtype),
    "embed_tokens.weight": target_weights["model.embed_tokens.weight"].to(dtype),
})
save_file({name: tensor.contiguous() for name, tensor in weights.items()}, f"{draft}/model.safetensors",
          metadata={"format": "pt"})
