"""Checks a shrunk Kimi-K2.5 that benchmarks/gpu/shrunk_kimi.py built, with the libraries the checkpoint is read
by (run on the lab's ~specrig/venv-cpu-0.32: compressed-tensors 0.17.0, the device's version; transformers 5):

    shrunk_kimi_check.py MODELS_DIR [KIMI_K25_CONFIG_PY]     prints one JSON line

(KIMI_K25_CONFIG_PY: vLLM 0.26's vllm/transformers_utils/configs/kimi_k25.py, loaded by path: it imports
transformers alone.)

- every routed expert's weight_packed unpacks, by compressed-tensors' own unpack_from_int32, to values whose
  re-pack by its pack_to_int32 is the same int32s; weight_shape is int32 [rows, cols], weight_scale bf16
  [rows, cols / 32];
- the bf16 reference's experts are those values times their scales;
- the three directories hold the same text tensors; transformers loads the bf16 reference and its forward is
  finite; vLLM 0.26's KimiK25Config reads the vision tower's shrunk sizes.
"""
import json
import os
import sys

import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
from safetensors.torch import load_file

root = sys.argv[1]
kimi = load_file(os.path.join(root, "kimi-k25", "model.safetensors"))
text = load_file(os.path.join(root, "kimi-k2-text", "model.safetensors"))
reference = load_file(os.path.join(root, "reference-bf16", "model.safetensors"))
config = json.load(open(os.path.join(root, "kimi-k25", "config.json")))
group = config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"]
problems, experts = [], 0
for name in sorted(n for n in text if n.endswith(".weight_packed")):
    base = name[:-len(".weight_packed")]
    packed, scale, shape = text[name], text[base + ".weight_scale"], text[base + ".weight_shape"]
    rows, cols = shape.tolist()
    if packed.dtype != torch.int32 or shape.dtype != torch.int32 or scale.dtype != torch.bfloat16:
        problems.append("%s: dtypes %s %s %s" % (base, packed.dtype, shape.dtype, scale.dtype))
    if tuple(packed.shape) != (rows, cols // 8) or tuple(scale.shape) != (rows, cols // group):
        problems.append("%s: shapes %s %s for %s" % (base, tuple(packed.shape), tuple(scale.shape), (rows, cols)))
    values = unpack_from_int32(packed, 4, torch.Size([rows, cols]))
    if int(values.min()) < -8 or int(values.max()) > 7:
        problems.append("%s: values outside [-8, 7]" % base)
    if not torch.equal(pack_to_int32(values, 4), packed):
        problems.append("%s: compressed-tensors packs the values to other int32s" % base)
    expected = (values.float() * scale.float().repeat_interleave(group, dim=1)).to(torch.bfloat16)
    if not torch.equal(reference[base + ".weight"], expected):
        problems.append("%s: the bf16 reference is not values x scales" % base)
    if not torch.equal(kimi["language_model." + name], packed):
        problems.append("%s: kimi-k25 holds other int32s" % base)
    experts += 1
for name, tensor in text.items():
    if ".experts." not in name and not (torch.equal(kimi["language_model." + name], tensor)
                                        and torch.equal(reference[name], tensor)):
        problems.append("%s differs between the directories" % name)

from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(os.path.join(root, "reference-bf16"), dtype=torch.bfloat16).eval()
loaded = dict(model.named_parameters())
with torch.no_grad():
    out = model(torch.arange(3, 35)[None], output_hidden_states=True)
finite = bool(torch.isfinite(out.logits).all()) and all(bool(torch.isfinite(h).all()) for h in out.hidden_states)
vision = None
if len(sys.argv) > 2:
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_kimi_k25_config", sys.argv[2])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parsed = module.KimiK25Config(**{k: v for k, v in config.items() if k != "model_type"})
    vision = {"hidden_size": parsed.vision_config.hidden_size, "intermediate_size": parsed.vision_config.intermediate_size,
              "num_hidden_layers": parsed.vision_config.num_hidden_layers,
              "num_attention_heads": parsed.vision_config.num_attention_heads,
              "mm_hidden_size": parsed.vision_config.mm_hidden_size, "text_hidden": parsed.text_config.hidden_size,
              "media_placeholder_token_id": parsed.media_placeholder_token_id}
print(json.dumps({"experts": experts, "problems": problems[:20], "transformers_class": type(model).__name__,
                  "transformers_params": len(loaded), "forward_finite": finite,
                  "hidden_states": len(out.hidden_states), "vllm_vision": vision}))
