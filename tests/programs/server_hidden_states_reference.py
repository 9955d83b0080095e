"""Compare server-mode files (hs_{i}.safetensors) with transformers' own forward (run by a Python with
torch, transformers and safetensors: the speculators venv).

    server_hidden_states_reference.py <hs_dir> <model_dir> <layer ids, comma-separated>

For each stored layer id k (axis 1 of hidden_states, ascending) the largest |stored - reference| over
every file, for two conventions: "input" (id k = the output of decoder layer k-1 = the input of
layer k; id 0 = the embeddings) and "output" (id k = the output of decoder layer k, as the old path
of speculators <= 0.4 stores it). Forward hooks give the residual stream before the final norm.
Prints one JSON object.
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main(hs_dir, model_dir, layer_ids):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    layers = model.model.layers
    outputs = {}
    model.model.embed_tokens.register_forward_hook(
        lambda module, inputs, output: outputs.__setitem__(-1, output.detach()))
    for i, layer in enumerate(layers):
        layer.register_forward_hook(lambda module, inputs, output, i=i: outputs.__setitem__(
            i, (output[0] if isinstance(output, tuple) else output).detach()))
    worst = {"input": {str(k): 0.0 for k in layer_ids}, "output": {str(k): 0.0 for k in layer_ids}}
    largest, files, problems, tokens = 0.0, sorted(hs_dir.glob("hs_*.safetensors")), [], 0
    for path in files:
        tensors = load_file(str(path))
        token_ids, stored = tensors["token_ids"], tensors["hidden_states"]
        if stored.shape != (len(token_ids), len(layer_ids), model.config.hidden_size):
            problems.append("%s: shape %s" % (path.name, tuple(stored.shape)))
            continue
        tokens += len(token_ids)
        with torch.no_grad():
            model(token_ids[None].long())
        for j, k in enumerate(layer_ids):
            got = stored[:, j].float()
            reference_input = outputs[k - 1][0].float()  # k - 1 = -1: the embeddings
            worst["input"][str(k)] = max(worst["input"][str(k)], (got - reference_input).abs().max().item())
            if k < len(layers):
                reference_output = outputs[k][0].float()
                worst["output"][str(k)] = max(worst["output"][str(k)], (got - reference_output).abs().max().item())
            else:
                worst["output"][str(k)] = None  # no layer L: "output of layer L" does not exist
            largest = max(largest, reference_input.abs().max().item())
    print(json.dumps({"layer_ids": layer_ids, "files": len(files), "tokens": tokens, "dtype": str(stored.dtype),
                      "max_abs_diff": worst, "max_abs_value": largest, "problems": problems}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], [int(x) for x in sys.argv[3].split(",")])
