"""Compare extracted samples with transformers' own hidden states (run by the runnable venv's Python).

    hidden_states_reference.py <output_dir> <model_dir>

Prints one JSON object: per layer, the largest |extracted - transformers| over every sample, the
largest |value|, and the samples whose shapes are wrong. speculators captures the output of
decoder layer i before the final norm, as reference_states.py keeps it (computed once for every test).
"""
import json
import sys
from pathlib import Path

import torch
from reference_states import ReferenceStates


def main(output_dir, model_dir):
    config = json.loads((output_dir / "data_config.json").read_text())
    layer_ids = config["hidden_states"]["layer_ids"]
    reference_states = ReferenceStates(model_dir)
    worst = {str(layer): 0.0 for layer in layer_ids}
    largest, bad_shapes, samples = 0.0, [], sorted(output_dir.glob("data_*.pt"))
    for path in samples:
        sample = torch.load(path, weights_only=True)
        states = reference_states.of(sample["input_ids"])
        for layer, extracted in zip(layer_ids, sample["hidden_states"], strict=True):
            reference = states[layer + 1]  # the output of decoder layer `layer`
            if reference.shape != extracted.shape:
                bad_shapes.append(path.name)
                continue
            worst[str(layer)] = max(worst[str(layer)], (reference.float() - extracted.float()).abs().max().item())
            largest = max(largest, reference.float().abs().max().item())
    print(json.dumps({"layer_ids": layer_ids, "max_abs_diff": worst, "max_abs_value": largest,
                      "samples": len(samples), "bad_shapes": bad_shapes}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
