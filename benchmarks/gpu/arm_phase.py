"""The phase `arm:WAY[:C[:KEY=VALUE,...]]` (arms.py): the client patched or reverted as the arm asks, the arm
named by what it varies, run (arm_runs.py) with its profile window where asked, and its record in the
results."""
import json
import os

import arm_inputs
import arm_runs
import arms
import harness
import profiling


def phase_arm(spec, keep_for_states=0):
    """arm:WAY[:C[:KEY=VALUE,...]] (arms.py): one arm, named by what it varies (arms.label)."""
    parsed = arms.parse_spec(spec)
    way, settings = parsed["way"], parsed["settings"]
    defaults = arm_inputs.server_defaults()
    # What client code the arm runs: a by-hand arm runs speculators as shipped (the patches reverted first);
    # a specrig arm as patch=1/0 asks, else as it finds it. The name says what the file holds, not what was asked.
    patching = None
    if way == "hand" or (way == "specrig" and parsed["patch"] == "0"):
        patching = harness.patch_client("revert")
    elif way == "specrig" and parsed["patch"] == "1":
        patching = harness.patch_client("apply")
    client = harness.client_state()
    nondefault = arms.nondefault(settings, defaults) if way == "specrig" else {}
    prefix = None
    if way == "bare":
        prefix = arm_inputs.prefix_caching_decision()
        if prefix["flag"]:
            nondefault["prefix_caching"] = prefix["setting"]
    concurrency = parsed["concurrency"]
    named = concurrency or (defaults.get("concurrency") if way == "specrig" else arms.CLIENT_DEFAULT_CONCURRENCY)
    if way != "specrig":
        concurrency = named
    label = arms.unique(arms.label(way, named, nondefault, None if way == "bare" else client["state"], harness.SHAPE,
                                   harness.MAIN_SHAPE, parsed["profile"]), harness.results.get("arms") or {})
    waited, port_waited = harness.wait_idle(), harness.wait_port_free()
    harness.log("arm %s: %d samples (waited %s s for the GPU's memory, %s s for the port)"
                % (label, harness.N_MEASURE, waited, port_waited))
    common = {"way_id": way, "spec": spec, "settings_nondefault": nondefault, "defaults": defaults,
              "client_patch": dict(client, used=way != "bare", patching=patching), "shape": harness.SHAPE,
              "n_measure": harness.N_MEASURE}
    if way == "hand" and client["state"] == "patched":  # "unknown" runs, and its name says so
        arm = dict(common, way=arms.WAY_WORDS[way], concurrency=concurrency,
                   error="speculators' client is %s after revert-patches: a by-hand arm runs it as shipped, "
                         "so it did not run" % client["state"])
        harness.results.setdefault("arms", {})[label] = arm
        harness.save()
        harness.log("arm %s: %s" % (label, arm["error"]))
        return
    window = None
    if parsed["profile"]:
        window = profiling.Window(os.path.join(harness.EXTRAS, "profile-" + label), trigger=None)
        saved_env = dict(os.environ)
        os.environ.update(profiling.enable(os.environ, window.directory))
    try:
        if way == "specrig":
            arm = arm_runs.arm_specrig(label, concurrency, settings, keep_for_states=keep_for_states, window=window)
        else:
            arm = arm_runs.arm_by_hand(label, concurrency, bare=way == "bare", prefix=prefix, window=window)
    finally:
        if parsed["profile"]:
            os.environ.clear()
            os.environ.update(saved_env)
    if parsed["profile"]:
        window.cancelled = True  # ended: a window still waiting for the steady part gives up
        if window.ident is not None:
            window.join(timeout=60)
        arm["profile"] = window.result
        if arm.get("started_at") and window.result.get("started_at"):
            arm["profile"]["from_s"] = round(window.result["started_at"] - arm["started_at"], 2)
            arm["profile"]["to_s"] = round(window.result["ended_at"] - arm["started_at"], 2)
    arm = dict(common, **arms.figures(arm))
    if way == "specrig" and arm.get("concurrency") and arm["concurrency"] != named:
        # specrig's default, read from its plan, differs from the tree's SERVER_DEFAULTS: the name follows the plan
        arm["files_label"] = label  # its logs and profile keep the name it began with
        label = arms.unique(arms.label(way, arm["concurrency"], nondefault, client["state"], harness.SHAPE,
                                       harness.MAIN_SHAPE, parsed["profile"]), harness.results.get("arms") or {})
    harness.results.setdefault("arms", {})[label] = arm
    harness.save()
    harness.log("arm %s: %s" % (label, json.dumps({k: arm.get(k) for k in (
        "samples", "tokens", "wall_s", "server_ready_s", "health_to_first_file_s", "health_to_last_file_s",
        "tokens_per_s_to_last_file", "error")})))
