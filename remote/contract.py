# The contracts both sides of specrig read, defined once: the host imports this module, the laptop
# loads this very file (specrig/contract.py). entry.py imports it before it checks the Python
# version, so it stays in syntax that any Python parses: no f-strings, no annotations.

#: Starts the one line of a call's stdout that holds its JSON result (entry.py/rpc.py -> transport).
SENTINEL = "@@SPECRIG-RESULT@@"

# -- run states (remote/run/rundir.py writes them; status, logs, the live view read them) -------
#: A supervisor is (or should be) working on the run.
ACTIVE_STATES = ("starting", "running", "restarting", "stalled")
#: The supervisor ended the run.
FINAL_STATES = ("succeeded", "failed", "stopped")
#: An active state whose supervisor is gone (host rebooted, killed): resumable.
LOST = "lost"
SUCCEEDED = "succeeded"

# -- the extraction driver's arguments (remote/run/extract_driver.py reads them) ------------------
DRIVER_REQUIRED = ("model", "dataset", "output_dir")
DRIVER_DEFAULTS = {
    "layer_ids": None, "tensor_parallel_size": None, "max_length": 2048, "batch_size": 8, "seed": 0,
    "max_samples": None, "load_format": None, "hf_overrides": None, "heartbeat": None,
    "writes_in_flight": 4, "gpu_memory_utilization": 0.8, "cpu_kvcache_space_gib": 1, "preprocess_procs": 1,
}

# -- how the supervisor runs the driver (hosts.yaml's `extract:` may set each one) -------------
SUPERVISOR_DEFAULTS = {
    "max_restarts": 3,          # restarts of retryable failures, per supervisor
    "backoff_s": 5.0,           # first restart delay, doubled each time
    "backoff_max_s": 300.0,
    "stall_timeout_s": 900.0,   # no new phase, sample or output file for this long: stalled
    "load_timeout_s": 3600.0,   # the same while the model loads
    "stall_restart": False,     # restart a stalled driver (counts as a restart)
    "grace_s": 20.0,            # between SIGTERM and SIGKILL when stopping
    "telemetry_interval_s": 5.0,
}

# -- the reorder hazard of speculators <= 0.4 (the driver refuses it, preflight reports it) -------
#: speculators <= 0.4 sizes vLLM's per-step token budget as max(8192, max_model_len). A batch
#: larger than that is split over scheduler steps, the generator aborts every request after its
#: first step, and the captured states are sliced by the original order: they land on the wrong
#: samples.
MIN_BATCHED_TOKENS = 8192
#: The newest speculators release (major, minor) with that hazard.
LAST_REORDER_HAZARD = (0, 4)


def reorder_hazard(speculators_version, batch_size, max_length):
    """The hazard for a batch: {"affected", "tokens", "budget", "ok", "max_batch_size"}.

    `speculators_version` is the installed release's text, or None when unknown (assumed affected).
    """
    import versions  # here, not at the top: versions.py is Python 3 syntax (see above)

    affected = (speculators_version is None
                or versions.Version(speculators_version).release[:2] <= LAST_REORDER_HAZARD)
    budget = max(MIN_BATCHED_TOKENS, max_length)
    tokens = batch_size * max_length
    return {"affected": affected, "tokens": tokens, "budget": budget,
            "ok": tokens <= budget or not affected, "max_batch_size": max(1, budget // max_length)}
