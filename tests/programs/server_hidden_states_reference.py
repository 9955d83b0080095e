"""Compare server-mode files (hs_{i}.safetensors) with transformers' own forward (run by a Python with
torch, transformers and safetensors: the speculators venv).

    server_hidden_states_reference.py <hs_dir> <model_dir> <layer ids, comma-separated>

For each stored layer id k (axis 1 of hidden_states, ascending) the largest |stored - reference| over
every file, for two conventions: "input" (id k = the output of decoder layer k-1 = the input of
layer k; id 0 = the embeddings) and "output" (id k = the output of decoder layer k, as the old path
of speculators <= 0.4 stores it). The residual stream before the final norm is reference_states.py's,
computed once for every test.

fp8 files (hidden_states_scales present, docs/server-mode.md "fp8 storage") are dequantized as training
reads them, hs-connectors' FP8Transfer (hs_connectors==0.9.0 transfer.py:229-240). For every file and
layer the relative L2 error ||stored - reference|| / ||reference|| is measured too, its largest value
kept ("max_rel_l2"), and the same with the stored states shifted one token against the reference's
(stored token t+1 against reference token t: the smallest over files, "min_shifted_rel_l2"), the
off-by-one pairing a tolerance must tell apart. "bf16_bytes": what the same samples take as vLLM's own
connector writes them (safetensors of the two tensors, hidden_states in bf16), for comparing sizes.
Prints one JSON object.
"""
import json
import sys
from pathlib import Path

import torch
from reference_states import ReferenceStates
from safetensors.torch import load_file, save

SCALES = "hidden_states_scales"


def relative_l2(got, reference):
    return ((got - reference).norm() / reference.norm()).item()


def main(hs_dir, model_dir, layer_ids):
    reference_states = ReferenceStates(model_dir)
    worst = {"input": {str(k): 0.0 for k in layer_ids}, "output": {str(k): 0.0 for k in layer_ids}}
    rel_l2 = {str(k): 0.0 for k in layer_ids}
    shifted = {str(k): float("inf") for k in layer_ids}
    largest, files, problems, tokens, bf16_bytes = 0.0, sorted(hs_dir.glob("hs_*.safetensors")), [], 0, 0
    for path in files:
        tensors = load_file(str(path))
        token_ids, stored = tensors["token_ids"], tensors["hidden_states"]
        if SCALES in tensors:
            from hs_connectors.fp8_utils import dequantize_fp8_tensor

            stored = dequantize_fp8_tensor(stored, tensors[SCALES])
        bf16_bytes += len(save({"hidden_states": stored.to(torch.bfloat16), "token_ids": token_ids}))
        states = reference_states.of(token_ids)  # [0] the embeddings, [i + 1] decoder layer i's output
        n_layers, hidden_size = states.shape[0] - 1, states.shape[-1]
        if stored.shape != (len(token_ids), len(layer_ids), hidden_size):
            problems.append("%s: shape %s" % (path.name, tuple(stored.shape)))
            continue
        tokens += len(token_ids)
        for j, k in enumerate(layer_ids):
            got = stored[:, j].float()
            reference_input = states[k].float()  # the input of layer k: layer k - 1's output (k = 0: embeddings)
            worst["input"][str(k)] = max(worst["input"][str(k)], (got - reference_input).abs().max().item())
            rel_l2[str(k)] = max(rel_l2[str(k)], relative_l2(got, reference_input))
            if len(token_ids) > 1:
                shifted[str(k)] = min(shifted[str(k)], relative_l2(got[1:], reference_input[:-1]))
            if k < n_layers:
                reference_output = states[k + 1].float()
                worst["output"][str(k)] = max(worst["output"][str(k)], (got - reference_output).abs().max().item())
            else:
                worst["output"][str(k)] = None  # no layer L: "output of layer L" does not exist
            largest = max(largest, reference_input.abs().max().item())
    print(json.dumps({"layer_ids": layer_ids, "files": len(files), "tokens": tokens,
                      "dtype": str(tensors["hidden_states"].dtype), "max_abs_diff": worst, "max_abs_value": largest,
                      "max_rel_l2": rel_l2, "min_shifted_rel_l2": shifted, "bf16_bytes": bf16_bytes,
                      "problems": problems}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], [int(x) for x in sys.argv[3].split(",")])
