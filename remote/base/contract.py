# The contracts both sides of specrig read, defined once: the host imports this module, the laptop
# loads this very file (specrig/contract.py). entry.py imports it before it checks the Python
# version, so it stays in syntax that any Python parses: no f-strings, no annotations.

try:
    from base import versions  # the one PEP 440 parser (remote/base/versions.py); remote/ is sys.path[0] on a host
except (ImportError, SyntaxError):
    # The laptop loads this file alone and sets `versions` itself (specrig/contract.py); a Python too
    # old for versions.py imports this module only for SENTINEL (entry.py).
    versions = None

#: Starts the one line of a call's stdout that holds its JSON result (entry.py/rpc.py -> transport).
SENTINEL = "@@SPECRIG-RESULT@@"

# -- run states (remote/base/rundir.py writes them; status, logs, the live view read them) -------
# Every state is named here once; code writes and compares these names, never the bare strings, so a
# renamed state cannot go unnoticed.
STARTING = "starting"        # the supervisor is up; the workload not yet started
RUNNING = "running"          # the workload is working
RESTARTING = "restarting"    # an attempt failed with a retryable failure; the next one waits its back-off
STALLED = "stalled"          # no progress for the stall timeout (the workload is still alive)
SUCCEEDED = "succeeded"
FAILED = "failed"
STOPPED = "stopped"          # a stop asked for it
#: An active state whose supervisor is gone (host rebooted, killed): resumable. Never written: status
#: derives it from a dead supervisor.
LOST = "lost"
#: An active state whose supervisor runs but does not answer: stopped (SIGSTOP, a debugger), or silent (its
#: liveness beat, written by a thread of its own every SUPERVISOR_BEAT_S, older than SUPERVISOR_SILENT_S: it
#: hangs). Never written: status derives it. `inv stop` ends it (SIGTERM, then SIGCONT), then `inv resume`.
UNRESPONSIVE = "unresponsive"
SUPERVISOR_BEAT_S = 2.0
SUPERVISOR_SILENT_S = 30.0
#: A supervisor is (or should be) working on the run.
ACTIVE_STATES = (STARTING, RUNNING, RESTARTING, STALLED, UNRESPONSIVE)
#: The supervisor ended the run.
FINAL_STATES = (SUCCEEDED, FAILED, STOPPED)

# -- what a run does (run.json "kind"; remote/run/supervisor.py picks the workload by it) -----------
#: An extraction: the in-process driver or the vLLM server and speculators' client steps. run.json of
#: a specrig before kinds has no "kind": it is an extraction.
KIND_EXTRACT = "extract"
#: speculators' trainer on a verified dataset (remote/run/training/): run.json "train" holds its plan.
KIND_TRAIN = "train"
#: The target served with a draft, its acceptance measured (remote/run/acceptance/): run.json "accept".
KIND_ACCEPT = "accept"
RUN_KINDS = (KIND_EXTRACT, KIND_TRAIN, KIND_ACCEPT)
#: A training's default bound on the work a crash may lose, in minutes: its checkpoint frequency follows from it
#: (`inv train --checkpoint-minutes`; remote/run/training/plan.py).
TRAIN_CHECKPOINT_MINUTES = 15.0
#: An acceptance measurement's defaults (`inv accept`; remote/run/acceptance/launch.py).
ACCEPT_DEFAULTS = {"num_prompts": 64, "max_tokens": 128, "k": 3, "tp": 1}


def run_kind(record):
    """The kind of the run whose run.json is `record` (KIND_EXTRACT when it names none)."""
    return record.get("kind") or KIND_EXTRACT


# -- the pace of a run's samples (status.json "pace", written by the supervisor's watch) -----------
#: Without a new sample for this many median gaps between samples (and at least PACE_STALE_S), a run's rate
#: and ETA say nothing any more: `inv status` and the live view show how long since the last sample instead.
STALE_GAPS = 3
PACE_STALE_S = 10.0


def pace_now(pace, now):
    """The pace's facts as of `now` (the host's clock): since_sample_s (since the last sample, or the phase's
    start before the first) and stale (True: the rate and ETA must not be shown); None without a pace."""
    if not pace:
        return None
    since = now - (pace.get("last_sample_at") or pace["phase_started_at"])
    stale = not pace.get("last_sample_at") or since > max(PACE_STALE_S, STALE_GAPS * (pace.get("median_gap_s") or 0))
    return dict(pace, since_sample_s=round(since, 1), stale=stale)


# -- failure kinds the supervisor finds itself (no log decides them; classify_rules.json holds the rest) --
#: Free space under the output or the connector's staging directory fell below what the next files need:
#: the run stops before the disk fills, keeping every whole file (remote/run/disk_watch.py). Not retried,
#: and a resume is refused until there is room: the same files would need the same space.
DISK_LOW = "disk-low"
#: A directory the run writes (the output, the staging directory) cannot be made or written.
OUTPUT_UNWRITABLE = "output-unwritable"
#: A Slurm job's time limit came (USR1, slurm/jobs.py) before any of its attempts wrote a sample: the run
#: fails rather than stop for the job to be requeued, since the next job, as long, would spend its time
#: the same way (the model's load) and be requeued again, forever (slurm/time_limit.py). Not retried; the
#: fix is a longer `slurm.time`, which `inv resume` then takes from hosts.yaml.
TIME_LIMIT_TOO_SHORT = "time-limit-too-short"
#: The preflight's collective probe (remote/gpus/collective.py): the GPUs' all-reduce did not complete within its
#: seconds. Its check says whether it passes with NCCL_P2P_DISABLE=1 (`inv extract --collective-safe`).
COLLECTIVE_HANG = "collective-hang"

# -- heartbeat phases (heartbeat.json "phase"): what the workload is doing now ---------------------
# Another word than the run's state: a RUNNING run goes PHASE_LOADING -> PHASE_EXTRACTING -> PHASE_DONE.
# The in-process driver writes them (remote/run/driver/), a server-mode supervisor writes its own
# (remote/run/server/workload.py); the supervisor reads PHASE_LOADING (load_timeout_s applies), the laptop
# shows them. A heartbeat's last phase may also be a run state: FAILED from the driver that failed, the
# run's final state from a server-mode supervisor. The vLLM server's own states (loading, ready,
# unhealthy of /health) are a third vocabulary: remote/run/server/health.py.
PHASE_STARTING = "starting"        # server mode: the supervisor is up, the first attempt not begun
PHASE_LOADING = "loading"          # the model loads (in-process: the driver; server mode: the server)
PHASE_EXTRACTING = "extracting"    # in-process: samples go through the model
PHASE_WRITING = "writing"          # in-process: the last samples' files are written
PHASE_DONE = "done"                # in-process: every sample of the run's share is written
PHASE_PREPARING = "preparing"      # server mode: speculators prepare-data
PHASE_GENERATING = "generating"    # server mode: speculators generate-offline-data
PHASE_VALIDATING = "validating"    # server mode: every file of the share is checked
PHASE_SERVING = "serving"          # a multi-node worker: its server serves the head's attempt
PHASE_WAITING = "waiting"          # a multi-node worker: between the head's attempts
PHASE_TRAINING = "training"        # a training: the trainer takes steps (remote/run/training/workload.py)
PHASE_VALIDATING = "validating"    # a training: the trainer validates an epoch
PHASE_CHECKPOINTING = "checkpointing"  # a training: the trainer saves a checkpoint

# -- the extraction driver's arguments (remote/run/extract_driver.py reads them) ------------------
DRIVER_REQUIRED = ("model", "dataset", "output_dir")
DRIVER_DEFAULTS = {
    "layer_ids": None, "tensor_parallel_size": None, "max_length": 2048, "batch_size": 8, "seed": 0,
    "max_samples": None, "load_format": None, "hf_overrides": None, "heartbeat": None,
    "writes_in_flight": 4, "gpu_memory_utilization": 0.8, "cpu_kvcache_space_gib": 1, "preprocess_procs": 1,
    # One shard of a sharded run (docs/runs.md, "Sharded runs"): the driver takes the global sample indices
    # i with i % shard_count == shard_index. Both null: every sample (one host).
    "shard_index": None, "shard_count": None,
    # The Hugging Face repo id `model` was found by in the host's cache (run/launching.py host_paths sets it; the
    # driver reads `model`, the snapshot directory): kept so that the run's record names both.
    "model_id": None,
    # --collective-safe (issue 38): vLLM without its custom all-reduce (the laptop adds NCCL_P2P_DISABLE=1 to the env)
    "collective_safe": False,
}

# -- server mode (speculators >= 0.8): the server and speculators' CLI steps (remote/run/server/) ----
#: What a server-mode run takes beyond the driver's model, dataset, output, layers, tp, max_length
#: (prepare-data's --seq-length), max_samples, seed, load_format and gpu_memory_utilization.
SERVER_DEFAULTS = {
    "port": 8000,             # the server's port on 127.0.0.1; preflight checks it is free
    "concurrency": 32,        # generate-offline-data's requests in flight (its own default)
    "clients": 1,             # generate-offline-data processes sharing them (one: speculators' own way)
    "request_timeout": 120,   # seconds per request (its own default)
    "max_retries": 3,         # tries per sample (its own default)
    "allow_skipped": False,   # samples the client gave up on fail the run unless allowed
    "staging": None,          # the connector's staging directory; None: <out>/.specrig-staging/<run-id>
    "writer_threads": None,   # the connector's file writers (num_writer_threads); None: its own (8 on 0.26-0.32)
    "max_num_batched_tokens": None,  # vLLM's per-step token budget; None: vLLM's own default
    "enforce_eager": False,   # vLLM without torch.compile and CUDA graphs: no compiling at start-up, slower steps
    "storage": "bf16",        # how the files hold the hidden states: a storage type of STORAGES
    # prepare-data's output kept in <workdir>/prepared-cache/, keyed by the dataset's and the tokenizer's
    # hashes and the settings it depends on: a later run of the same key skips it (server/prepared_cache.py)
    "prepared_cache": True,
    # prepare-data renders through a GPU-less `vllm launch render` server started with the model's server, so
    # that it runs while the model loads (server/render.py); off: through the model's server at /health. On by
    # default since it won on an H100 (docs/gpu.md, issue 35): a first run's tokens/s from /health to the last
    # file went from 0.46 to 0.83-0.89 of bare prefill's at 512 samples of an 8B model
    "render_server": True,
}

# -- how server mode stores the hidden states (docs/server-mode.md, "fp8 storage") ------------------
#: "bf16": vLLM's ExampleHiddenStatesConnector writes the states in the model's own dtype (bf16 for
#: the targets specrig serves). "fp8": hs-connectors >= 0.9.0's FP8HiddenStatesConnector writes them
#: as float8_e4m3fn with one float32 scale per token (hs_connectors==0.9.0 fp8_utils.py:88-110).
BF16, FP8 = "bf16", "fp8"
STORAGES = (BF16, FP8)
#: Bytes of one stored hidden value, by storage type; None: the model dtype's own (2 for bf16).
STORAGE_VALUE_BYTES = {BF16: None, FP8: 1}
#: fp8 storage's per-token overhead: `hidden_states_scales` [T, 1, 1], float32.
FP8_SCALE_BYTES = 4


def stored_bytes_per_token(storage, values_per_token, model_dtype_bytes):
    """Bytes the hidden states of one token take on disk under `storage` (a storage type of STORAGES):
    `values_per_token` (layers x hidden size) values, plus fp8's scale; token_ids not counted.
    (Positional parameters: this module stays in syntax any Python parses, see entry.py.)"""
    value_bytes = STORAGE_VALUE_BYTES[storage] or model_dtype_bytes
    return values_per_token * value_bytes + (FP8_SCALE_BYTES if storage == FP8 else 0)

#: Files the connector may hold in staging at once, per request in flight: about one per request and its lock
#: (server mode's preflight sizes the staging directory with it, and `inv extract --dry-run` too).
STAGING_MARGIN = 2

#: How long the supervisor (between attempts) and a stop wait for the GPUs to give back the memory of a
#: run's ended processes: the driver frees a dead process's memory a moment after it is gone
#: (docs/gpu-check.md).
GPU_RELEASE_S = 30

# -- how the supervisor runs the driver (hosts.yaml's `extract:` may set each one) -------------
SUPERVISOR_DEFAULTS = {
    "max_restarts": 3,          # restarts of retryable failures, per supervisor
    "backoff_s": 5.0,           # first restart delay, doubled each time
    "backoff_max_s": 300.0,
    "stall_timeout_s": 900.0,   # the stall bound's ceiling: no new phase, sample or file for this long is stalled
    "load_timeout_s": 3600.0,   # the same while the model loads
    "stall_restart": True,      # end a stalled attempt and restart it (counts as a restart); false: only mark it
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
    affected = (speculators_version is None
                or versions.Version(speculators_version).release[:2] <= LAST_REORDER_HAZARD)
    budget = max(MIN_BATCHED_TOKENS, max_length)
    tokens = batch_size * max_length
    return {"affected": affected, "tokens": tokens, "budget": budget,
            "ok": tokens <= budget or not affected, "max_batch_size": max(1, budget // max_length)}


# -- the drift analysis (remote/drift/ on a host; check-compat runs it on unpacked wheels) --------------
#: Read beside speculators >= 0.8 when installed, or fetched by check-compat at the version speculators
#: pins: its file backend builds the connector config specrig's launch sends.
HS_CONNECTORS = "hs-connectors"
#: Extension-module suffixes: such a module exists but has no source to read.
COMPILED_SUFFIXES = (".so", ".pyd")
#: Written by check-compat's wheel unpacker (specrig/drift/compat.py) beside the unpacked .py files: the
#: compiled modules of the wheel, one dotted name a line, since their files were not unpacked.
COMPILED_MANIFEST = ".specrig-compiled-modules"


# -- which extraction mode a speculators release takes (issue 10) ---------------------------------
# speculators <= 0.4 drives vLLM in-process (remote/run/extract_driver.py; verify's consumer analysis);
# 0.5-0.7 ship their data generation only as repository scripts, outside the wheel (nothing to run or
# check); from 0.8 on the wheel's CLI talks to a `vllm serve` with the extract_hidden_states method
# (docs/server-mode.md; verify checks remote/drift/server/). One rule, read by the host (verify,
# preflight, the supervisor) and the laptop (check-compat) alike. "mode", never "path": a path is a file's.
IN_PROCESS = "in-process"
REPOSITORY_SCRIPTS = "repository-scripts"
SERVER = "server"
#: The newest release (major, minor) of the in-process mode, and the oldest of the server mode.
LAST_IN_PROCESS = (0, 4)
FIRST_SERVER = (0, 8)


def extraction_mode(speculators_version):
    """The mode of a speculators release's text: IN_PROCESS, REPOSITORY_SCRIPTS or SERVER; None when the
    text is not a version (nothing to choose from). Only the release's first two numbers count:
    0.4.0.1 and 0.4.2rc1 are in-process, 0.8.0.dev3 is server."""
    try:
        release = versions.Version(speculators_version or "").release[:2]
    except versions.InvalidVersion:
        return None
    if release <= LAST_IN_PROCESS:
        return IN_PROCESS
    if release < FIRST_SERVER:
        return REPOSITORY_SCRIPTS
    return SERVER


# -- Slurm: a host that is a cluster's login node (issue 18; docs/slurm.md) ---------------------------
#: hosts.yaml's `scheduler:` values; a host naming none is one machine reached over SSH.
SLURM = "slurm"
SCHEDULERS = (SLURM,)
#: hosts.yaml's `slurm:` settings: each one's default (None: the cluster's own) and the sbatch option it
#: becomes (None: not an sbatch option). specrig/slurm_settings.py checks them, doctor's test job and the
#: submission read them.
SLURM_SETTINGS = {
    "partition": {"default": None, "sbatch": "--partition"},
    "account": {"default": None, "sbatch": "--account"},
    "qos": {"default": None, "sbatch": "--qos"},
    "gres": {"default": None, "sbatch": "--gres"},              # gpu:8, gpu:h100:8
    "time": {"default": None, "sbatch": "--time"},              # Slurm's formats (slurm/formats.py)
    "nodes": {"default": 1, "sbatch": "--nodes"},
    "cpus_per_task": {"default": None, "sbatch": "--cpus-per-task"},
    "mem": {"default": None, "sbatch": "--mem"},                # per node: 64G, 512000 (MB)
    "constraint": {"default": None, "sbatch": "--constraint"},
    "extra_sbatch": {"default": [], "sbatch": None},            # more options, as `--name=value` words
    "fabric_interface": {"default": None, "sbatch": None},      # NCCL/GLOO_SOCKET_IFNAME of multi-node jobs
}

# Where a verify report came from (its "cache": {"state", "why"}; `--json` shows it): the host's kept
# answer (remote/drift/answers.py), a fresh analysis kept for the next call, or one kept nowhere
# (no workdir, or --no-cache).
CACHE_HIT, CACHE_MISS, CACHE_BYPASSED = "hit", "miss", "bypassed"
