"""Which samples an output directory holds, and whether each loads whole: `inv gather`'s check.

    <python> remote/run/verify_output.py <output_dir>

A program started by path (like the driver) by the `runs` command's verify-output action, with the
run's python: it imports torch, which the calls of remote/ never do. It loads every data_{i}.pt
as the driver's resume scan does (run/driver/output.py: the whole-sample check, with the layer count
of data_config.json) and prints one JSON line:

    {"indices": [i, ...], "unloadable": [{"index", "reason"}], "layers": n|null, "layer_ids": [..]|null,
     "dataset_samples": n|null, "shard_index": k|null, "shard_count": n|null}

Exit 0 whatever it found; 2 when the directory is not there.
"""
import json
import os
import re
import sys

# Started by path, so sys.path[0] is remote/run/: make it remote/, as the driver does.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from base import outputs
from run.driver.output import SAMPLE_PREFIX, SAMPLE_SUFFIX, load_sample, sample_is_whole

SAMPLE = re.compile(r"^%s(\d+)%s$" % (re.escape(SAMPLE_PREFIX), re.escape(SAMPLE_SUFFIX)))


def check(output_dir):
    specrig = {}
    try:
        with open(os.path.join(output_dir, "data_config.json"), encoding="utf-8") as handle:
            specrig = json.load(handle).get("specrig") or {}
    except (OSError, ValueError):
        pass
    layer_ids = specrig.get("layer_ids")
    layers = len(layer_ids) if layer_ids else None
    indices, unloadable = [], []
    names = sorted((int(m.group(1)), name) for name in os.listdir(output_dir) for m in [SAMPLE.match(name)] if m)
    for index, name in names:
        indices.append(index)
        path = os.path.join(output_dir, name)
        try:
            sample = load_sample(path)
        except OSError as exc:  # removed, or this user cannot read it (mode 000, another user's): named as a check names it
            unloadable.append({"index": index, "reason": outputs.reason(outputs.os_error_status(exc))})
            continue
        except Exception as exc:  # any failure to load is the finding
            unloadable.append({"index": index, "reason": "%s: %s" % (type(exc).__name__, str(exc)[:200])})
            continue
        if layers is None or not sample_is_whole(sample, layers):
            unloadable.append({"index": index, "reason": "not a whole sample of %s layer(s)" % layers})
    return {"indices": indices, "unloadable": unloadable, "layers": layers, "layer_ids": layer_ids,
            "dataset_samples": specrig.get("dataset_samples"), "shard_index": specrig.get("shard_index"),
            "shard_count": specrig.get("shard_count")}


def main(argv):
    if len(argv) != 1:
        sys.stderr.write("usage: verify_output.py <output_dir>\n")
        return 2
    if not os.path.isdir(argv[0]):
        sys.stderr.write("verify_output: %s is not a directory\n" % argv[0])
        return 2
    sys.stdout.write(json.dumps(check(argv[0])) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
