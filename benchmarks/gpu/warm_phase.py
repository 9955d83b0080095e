"""The phase `warm[:bare]`: the arms' servers started once to their /health and stopped, so that the first
start's costs fall in a staging call rather than in a measurement."""
import os
import shutil
import time

import arm_inputs
import arms
import harness


def phase_warm(spec="warm"):
    """warm[:bare]: the extraction server (speculators' docs' command) started once to its /health and stopped
    (with :bare, then the bare server too): the first start's costs (the wheels' bytecode, the libraries and
    the model read from disk, torch.compile's cache) paid in a staging call instead of the measurement's,
    where the first arm's server took 190 s against 84-131 s for the others (docs/gpu.md, runs 3 and 4).
    A server's start is reported, never in a ratio (issue 26)."""
    kinds = ["extraction"] + (["bare"] if spec == "warm:bare" else [])
    warmed = {}
    os.makedirs(harness.EXTRAS, exist_ok=True)
    for kind in kinds:
        harness.wait_idle()
        harness.wait_port_free()
        staging = os.path.join(harness.SG, "out", "warm-staging")
        argv = arm_inputs.docs_server_argv(staging)
        if kind == "bare":
            argv = arm_inputs.bare_argv(argv, arm_inputs.prefix_caching_decision())
        started = time.time()
        server = harness.start_server(argv, os.path.join(harness.EXTRAS, "warm-%s-server.log" % kind), cwd=harness.SG)
        healthy = arms.wait_for_health(harness.PORT, 500, lambda ended=server.poll: ended() is not None)
        warmed[kind] = {"healthy": healthy, "server_ready_s": round(time.time() - started, 2), "exit": server.poll()}
        harness.end_group(server)
        shutil.rmtree(staging, ignore_errors=True)
        harness.log("warm %s: healthy %s after %.0f s" % (kind, healthy, warmed[kind]["server_ready_s"]))
    harness.record("warm", dict(harness.results.get("warm") or {}, **warmed))
