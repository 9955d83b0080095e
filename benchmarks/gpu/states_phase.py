"""The phase `states[:WHICH]`: the hidden states an arm or a fault cell kept, against transformers' forward."""
import os
import shutil

import harness


def reference(directory, layer_ids, name, timeout=600):
    """Every stored layer of the files in `directory` against transformers' forward, once the GPU is free
    (gpu_tools.py reference, its answer written to $SG/`name`): (what it found, or its exit and error; seconds)."""
    harness.wait_idle()
    target = os.path.join(harness.SG, name)
    rc, out, err, seconds = harness.gpu_tools("reference", directory, harness.MODEL, ",".join(map(str, layer_ids)),
                                              target, timeout=timeout)
    harness.log("reference rc %d in %.0f s: %s %s" % (rc, seconds, out[-400:], err[-2000:] if rc else ""))
    return ((harness.read_json(target) or {}) if rc == 0 else {"exit": rc, "error": err[-3000:]}), seconds


def phase_states(spec="states"):
    """states[:WHICH]: every stored layer of the files a measured arm or a fault cell kept (the latest whose name
    starts with WHICH, default specrig; fault: the fault cell's, after its recovery) against transformers'
    forward (gpu_tools.py reference: the tolerance from bf16's own error, the shifted control). The GPU must be
    free: run it after the arm, between arms."""
    which = spec.split(":", 1)[1] if ":" in spec else "specrig"
    kept = [(label, arm) for group in ("arms", "faults") for label, arm in (harness.results.get(group) or {}).items()
            if label.startswith(which) and arm.get("states_subset") and os.path.isdir(arm["states_subset"]["dir"])]
    if not kept:
        harness.record("states", {"error": "no arm or fault cell named %s* kept files for a states check in this call"
                                  % which})
        return
    label, arm = kept[-1]
    subset = arm["states_subset"]
    if not arm.get("layer_ids"):
        harness.record("states", {"arm": label, "error": "the arm's plan gave no layer ids"})
        return
    harness.log("states of %s: %d of its %d files" % (label, subset["files"], subset["of"]))
    found, seconds = reference(subset["dir"], arm["layer_ids"], "reference-%s.json" % label)
    found.update(arm=label, subset={k: subset[k] for k in ("files", "of", "how")}, wall_s=seconds,
                 client_patch=(arm.get("client_patch") or {}).get("state"))
    harness.record("states", found)
    shutil.rmtree(subset["dir"], ignore_errors=True)
