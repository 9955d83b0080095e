"""How far two bf16 computations of the same random 8B-wide Llama layer stack drift apart, in transformers
alone (sdpa against eager attention, and against fp32), layer by layer, on the CPU: the scale of "bf16
tolerance" for the GPU run's states check (docs/gpu.md, States).

    python3 bf16_drift.py LAYERS TOKENS [nofp32]      (one JSON line: relative L2 per layer id)
"""
import json
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
L = int(sys.argv[1]); T = int(sys.argv[2])
cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=L, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, vocab_size=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False)
torch.set_default_dtype(torch.bfloat16)
m = LlamaForCausalLM(cfg).eval()
torch.set_default_dtype(torch.float32)
ids = torch.randint(0, 8192, (1, T))
def acts(model, attn):
    model.config._attn_implementation = attn
    out = {}
    model.model.embed_tokens.register_forward_hook(lambda mod, i, o: out.__setitem__(0, o.detach().float()))
    for k, layer in enumerate(model.model.layers):
        layer.register_forward_hook(lambda mod, i, o, k=k: out.__setitem__(k + 1, (o[0] if isinstance(o, tuple) else o).detach().float()))
    with torch.no_grad():
        model(ids)
    for mod in [model.model.embed_tokens, *model.model.layers]:
        mod._forward_hooks.clear()
    return out
t = time.time()
a = acts(m, "sdpa"); b = acts(m, "eager")
c = a if len(sys.argv) > 3 else acts(m.float(), "sdpa")
rel = lambda x, y: float((x - y).norm() / y.norm())
print(json.dumps({"layers": L, "tokens": T, "s": round(time.time() - t, 1),
  "bf16_sdpa_vs_bf16_eager": {k: round(rel(a[k], b[k]), 5) for k in a},
  "bf16_sdpa_vs_fp32": {k: round(rel(a[k], c[k]), 5) for k in a},
  "bf16_eager_vs_fp32": {k: round(rel(b[k], c[k]), 5) for k in a}}))
