"""Do the shards of a sharded run hold the samples one host's run numbers alike? (runnable venv's Python)

    same_samples.py <whole_output_dir> <shard_output_dir>...

Prints one JSON object: the sample files compared (every data_{i}.pt of the shards against the whole
run's data_{i}.pt), those whose input_ids differ, those the whole run lacks, and the largest
difference of their hidden states.
"""
import json
import sys
from pathlib import Path

import torch


def main(whole, shards):
    compared, differing, absent, worst = [], [], [], 0.0
    for shard in shards:
        for path in sorted(shard.glob("data_*.pt")):
            other = whole / path.name
            if not other.exists():
                absent.append(path.name)
                continue
            mine, theirs = torch.load(path, weights_only=True), torch.load(other, weights_only=True)
            compared.append(path.name)
            if not torch.equal(mine["input_ids"], theirs["input_ids"]):
                differing.append(path.name)
                continue
            for a, b in zip(mine["hidden_states"], theirs["hidden_states"], strict=True):
                worst = max(worst, (a.float() - b.float()).abs().max().item())
    print(json.dumps({"compared": len(compared), "differing_input_ids": differing, "absent": absent,
                      "max_state_diff": worst}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(arg) for arg in sys.argv[2:]])
