"""specrig's extraction driver: EAGLE-3 hidden states through speculators' generator API.

    <python> remote/run/extract_driver.py <args.json>   </dev/null

A long-running program (not an RPC command): launched detached by the supervisor, by
`inv smoke`, or by hand. The one remote/ module allowed to import torch, vLLM and speculators,
and only inside functions: vLLM spawns its workers, which re-import this file.

args.json (an object; only the first three are required):
  model                 str        local model directory (config.json, tokenizer, weights)
  dataset               str        local .json/.jsonl conversations, or "sharegpt" / "ultrachat"
                                   (speculators' own names, when the host can reach the hub)
  output_dir            str        where data_{i}.pt, data_config.json, token_freq.torch go
  layer_ids             [int]|null layers to capture; null: speculators' default choice
  tensor_parallel_size  int|null   null: all visible GPUs (1 on a CPU host)
  max_length            int        tokens per sample after the chat template (default 2048)
  batch_size            int        samples per generate() call (default 8)
  seed                  int        dataset shuffle seed (default 0)
  max_samples           int|null   take at most this many conversations (default: all)
  load_format           str|null   vLLM load format; "dummy" gives random weights (smoke runs)
  hf_overrides          obj|null   merged into the model's config.json, in a derived model
                                   directory beside output_dir (smoke runs shrink the model);
                                   a null value removes the key (quantization_config)
  heartbeat             str|null   progress file (default <output_dir>/heartbeat.json)
  writes_in_flight      int        samples being written at once, at most (default 4)
  gpu_memory_utilization float     passed to the generator (default 0.8)
  cpu_kvcache_space_gib int        VLLM_CPU_KVCACHE_SPACE when unset (default 1; CPU hosts only)
  preprocess_procs      int        processes for speculators' preprocessing (default 1)

Output (the layout speculators' Eagle3SampleFileDataset reads; it takes every file under the
directory whose name ends in "pt", so nothing else here does): data_{i}.pt holding
{"input_ids": long[seq], "hidden_states": [bf16[seq, hidden] per layer], "loss_mask": long[seq]},
data_config.json (speculators' DataGenerationConfig plus a "specrig" section fixing the settings
a resume must share). A sample is written to a hidden temporary name and renamed into place.

Resume: a rerun with the same settings finds the first missing or unloadable sample and goes on
from there; samples after it are rewritten in place, never duplicated. Different settings on an
existing output directory are refused.

A finished output directory started again is done at once, without loading the model.
The batch-size refusal (contract.reorder_hazard) applies to speculators <= 0.4.

Heartbeat (rewritten atomically every HEARTBEAT_S seconds and at every phase change):
  {"phase": "loading|extracting|writing|done|failed", "samples_done", "samples_total",
   "tokens_per_s", "eta_s", "last_error", "updated_at" (unix time), "pid"}

Exit status: 0 done; 1 failed (the traceback on stderr, vLLM's and speculators' frames intact);
2 bad arguments or a refused setting (the reason on stderr); 3 another driver holds output_dir.
"""
import json
import os
import sys
import threading
import time
import traceback

# Started by path, so sys.path[0] is remote/run/: make it remote/, where the shared modules and
# the stage packages are, exactly as for a call through entry.py.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import atomic  # noqa: E402
import pkgmeta  # noqa: E402
from contract import DRIVER_DEFAULTS, DRIVER_REQUIRED, reorder_hazard  # noqa: E402

HEARTBEAT_S = 2.0
EXIT_FAILED, EXIT_USAGE, EXIT_LOCKED = 1, 2, 3
DEFAULTS, REQUIRED = DRIVER_DEFAULTS, DRIVER_REQUIRED
#: Settings that must be equal for a resume to continue the same sequence of samples.
RESUME_KEYS = ("model", "dataset", "layer_ids", "max_length", "seed", "max_samples", "load_format", "hf_overrides")
SAMPLE_PREFIX, SAMPLE_SUFFIX = "data_", ".pt"


class Refused(Exception):
    """Arguments the driver will not run with; the message says which and why."""

    exit_status = EXIT_USAGE


class Locked(Refused):
    """Another driver is writing the same output directory."""

    exit_status = EXIT_LOCKED


def sample_name(index):
    return "%s%d%s" % (SAMPLE_PREFIX, index, SAMPLE_SUFFIX)


# ----------------------------------------------------------------------------- arguments
def load_arguments(path):
    try:
        with open(path, encoding="utf-8") as handle:
            given = json.load(handle)
    except (OSError, ValueError) as exc:
        raise Refused("cannot read arguments file %r: %s" % (path, exc))
    if not isinstance(given, dict):
        raise Refused("arguments file %r holds %s, not a JSON object" % (path, type(given).__name__))
    unknown = sorted(set(given) - set(DEFAULTS) - set(REQUIRED))
    if unknown:
        raise Refused("unknown argument(s) %r; known: %s" % (unknown, ", ".join(REQUIRED + tuple(DEFAULTS))))
    missing = [key for key in REQUIRED if not given.get(key)]
    if missing:
        raise Refused("missing required argument(s) %r" % missing)
    args = dict(DEFAULTS, **given)
    for key in ("max_length", "batch_size", "writes_in_flight", "preprocess_procs", "cpu_kvcache_space_gib"):
        if not isinstance(args[key], int) or isinstance(args[key], bool) or args[key] < 1:
            raise Refused("%s=%r: give a positive integer" % (key, args[key]))
    for key in ("tensor_parallel_size", "max_samples"):
        value = args[key]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise Refused("%s=%r: give a positive integer or null" % (key, value))
    if not isinstance(args["seed"], int):
        raise Refused("seed=%r: give an integer" % (args["seed"],))
    layer_ids = args["layer_ids"]
    if layer_ids is not None:
        if (not isinstance(layer_ids, list) or not layer_ids
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layer_ids)):
            raise Refused("layer_ids=%r: give a non-empty list of layer indices, or null" % (layer_ids,))
        if len(set(layer_ids)) != len(layer_ids) or layer_ids != sorted(layer_ids):
            # The worker captures layers in model order into one list per distinct layer.
            raise Refused("layer_ids=%r: give distinct indices in increasing order, e.g. %r"
                          % (layer_ids, sorted(set(layer_ids))))
    if args["hf_overrides"] is not None and not isinstance(args["hf_overrides"], dict):
        raise Refused("hf_overrides=%r: give a JSON object of config.json keys" % (args["hf_overrides"],))
    if not os.path.isdir(args["model"]):
        raise Refused("model=%r is not a directory on this host" % (args["model"],))
    dataset = args["dataset"]
    if dataset.endswith((".json", ".jsonl")) and not os.path.isfile(dataset):
        raise Refused("dataset=%r does not exist on this host" % (dataset,))
    installed = pkgmeta.versions(("speculators",))["speculators"]
    hazard = reorder_hazard(installed, args["batch_size"], args["max_length"])
    if not hazard["ok"]:
        raise Refused(
            "batch_size=%d x max_length=%d = %d tokens exceeds vLLM's per-step budget max(8192, max_length)=%d "
            "that speculators <= 0.4 configures (installed: %s): the batch would be split across scheduler "
            "steps and hidden states attached to the wrong samples (silent corruption); use batch_size <= %d"
            % (args["batch_size"], args["max_length"], hazard["tokens"], hazard["budget"], installed or "unknown",
               hazard["max_batch_size"]))
    args["output_dir"] = os.path.abspath(args["output_dir"])
    args["model"] = os.path.abspath(args["model"])
    if args["heartbeat"] is None:
        args["heartbeat"] = os.path.join(args["output_dir"], "heartbeat.json")
    return args


# ----------------------------------------------------------------------------- progress
class Heartbeat:
    """The progress file, rewritten by a thread every HEARTBEAT_S and at each phase change."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.state = {"phase": "loading", "samples_done": 0, "samples_total": None, "tokens_per_s": None,
                      "eta_s": None, "last_error": None, "pid": os.getpid()}
        self.started = None
        self.done_at_start = 0
        self.tokens = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def start(self):
        self.write()
        self.thread.start()

    def update(self, **fields):
        with self.lock:
            self.state.update(fields)
        if "phase" in fields:
            self.write()

    def begin_extraction(self, done, total):
        with self.lock:
            self.started = time.time()
            self.done_at_start = done
            self.state.update(samples_done=done, samples_total=total)

    def sample_written(self, tokens):
        with self.lock:
            self.state["samples_done"] += 1
            self.tokens += tokens

    def write(self):
        with self.lock:
            state = dict(self.state, updated_at=time.time())
            if self.started is not None:
                elapsed = max(time.time() - self.started, 1e-6)
                made = state["samples_done"] - self.done_at_start
                state["tokens_per_s"] = round(self.tokens / elapsed, 1)
                left = (state["samples_total"] or 0) - state["samples_done"]
                state["eta_s"] = round(left * elapsed / made, 1) if made else None
        atomic.write_json(self.path, state)

    def _beat(self):
        while not self.stopped.wait(HEARTBEAT_S):
            try:
                self.write()
            except OSError:
                pass  # a full disk shows up as a failed sample write; keep beating

    def stop(self):
        self.stopped.set()
        self.write()


# ----------------------------------------------------------------------------- output directory
class OutputDir:
    """data_{i}.pt files, their bounded background writer, the lock, and resume."""

    def __init__(self, path, writes_in_flight):
        import concurrent.futures

        import torch

        if hasattr(torch.serialization, "set_crc32_options"):
            # CRC32 of every record caps torch.save near 300 MiB/s (one core); torch.load does not
            # check it, and the resume check loads every sample anyway.
            torch.serialization.set_crc32_options(False)

        self.path = path
        os.makedirs(path, exist_ok=True)
        self.lock_handle = None
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=writes_in_flight,
                                                          thread_name_prefix="sample-writer")
        self.slots = threading.BoundedSemaphore(writes_in_flight)
        self.errors = []

    def lock(self):
        import fcntl

        self.lock_handle = open(os.path.join(self.path, ".specrig-driver.lock"), "w")
        try:
            fcntl.flock(self.lock_handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise Locked("output_dir=%r is being written by another driver" % self.path)

    def remove_temporaries(self):
        for name in os.listdir(self.path):
            if name.startswith("." + SAMPLE_PREFIX) and ".tmp." in name:
                os.unlink(os.path.join(self.path, name))

    def first_missing(self, total, layers):
        """Index of the first sample that is absent or fails to load with the right shapes."""
        for index in range(total):
            if not self.loads(index, layers):
                return index
        return total

    def loads(self, index, layers):
        import torch

        path = os.path.join(self.path, sample_name(index))
        if not os.path.exists(path):
            return False
        try:
            sample = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
            return sample_is_whole(sample, layers)
        except Exception:  # noqa: BLE001 - any failure to load means: extract it again
            return False

    def submit(self, index, sample, on_written):
        """Write in the background; blocks while writes_in_flight writes are pending."""
        if self.errors:
            raise self.errors[0]
        self.slots.acquire()
        future = self.pool.submit(self._write, index, sample)

        def finished(done):
            self.slots.release()
            if done.exception() is not None:
                self.errors.append(done.exception())
            else:
                on_written(sample)

        future.add_done_callback(finished)

    def _write(self, index, sample):
        import torch


        final = os.path.join(self.path, sample_name(index))
        # Hidden and not *.pt: training lists every *.pt under the directory.
        temp = os.path.join(self.path, ".%s.tmp.%d" % (sample_name(index), os.getpid()))
        try:
            torch.save(sample, temp)
            os.replace(temp, final)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise

    def drain(self):
        self.pool.shutdown(wait=True)
        if self.errors:
            raise self.errors[0]


def sample_is_whole(sample, layers):
    if not isinstance(sample, dict) or not {"input_ids", "hidden_states", "loss_mask"} <= set(sample):
        return False
    length = sample["input_ids"].shape[0]
    states = sample["hidden_states"]
    return (sample["loss_mask"].shape == (length,) and isinstance(states, list) and len(states) == layers
            and all(state.dim() == 2 and state.shape[0] == length for state in states))


# ----------------------------------------------------------------------------- the model
def derived_model_dir(args):
    """The model directory with hf_overrides merged into config.json, or the model itself.

    A directory of links plus a rewritten config.json: both transformers (speculators reads the
    layer count with AutoConfig) and vLLM then see the same overridden config, on any version.
    """
    if not args["hf_overrides"]:
        return args["model"]
    # Beside output_dir, not in it: training reads every file under output_dir whose name ends in "pt".
    derived = args["output_dir"].rstrip(os.sep) + ".model-with-overrides"
    os.makedirs(derived, exist_ok=True)
    for name in os.listdir(args["model"]):
        link = os.path.join(derived, name)
        if name != "config.json" and not os.path.lexists(link):
            os.symlink(os.path.join(args["model"], name), link)
    with open(os.path.join(args["model"], "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    atomic.write_json(os.path.join(derived, "config.json"), merge(config, args["hf_overrides"]))
    return derived


def merge(base, overrides):
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        elif value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def visible_gpus():
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def make_generator(args, model_dir):
    import functools

    import speculators.data_generation.vllm_hidden_states_generator as generator_module
    from speculators.data_generation import VllmHiddenStatesGenerator

    if args["load_format"]:
        # The generator builds LoadConfig() itself; give it ours through its own module namespace.
        generator_module.LoadConfig = functools.partial(generator_module.LoadConfig,
                                                        load_format=args["load_format"])
    return VllmHiddenStatesGenerator(
        model_path=model_dir,
        layer_ids=args["layer_ids"],
        # +1: the generator keeps max_model_len - 1 tokens (room for the one decode token).
        max_model_len=args["max_length"] + 1,
        gpu_memory_utilization=args["gpu_memory_utilization"],
        tensor_parallel_size=args["tensor_parallel_size"] or visible_gpus(),
    )


def write_data_config(args, generator, num_samples):
    from speculators.data_generation.config_generator import DataGenerationConfig

    config = DataGenerationConfig.from_generator(
        generator=generator, train_data_path=args["dataset"], seq_length=args["max_length"],
        cache_dir=os.path.join(args["output_dir"], ".cache"), num_samples=num_samples,
        max_samples=args["max_samples"], seed=args["seed"]).to_dict()
    config["specrig"] = resume_settings(args, generator.layer_ids)
    atomic.write_json(os.path.join(args["output_dir"], "data_config.json"), config)


def resume_settings(args, layer_ids):
    settings = {key: args[key] for key in RESUME_KEYS}
    settings["layer_ids"] = list(layer_ids)
    return settings


def check_resumable(args):
    """Refuse to continue an output directory started with other settings; else the layers it
    captured (None for a new directory)."""
    path = os.path.join(args["output_dir"], "data_config.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        previous = json.load(handle).get("specrig") or {}
    wanted = {key: args[key] for key in RESUME_KEYS}
    differing = sorted(key for key in RESUME_KEYS
                       if key != "layer_ids" and previous.get(key) != wanted[key])
    if args["layer_ids"] is not None and previous.get("layer_ids") != args["layer_ids"]:
        differing.append("layer_ids")
    if differing:
        raise Refused("output_dir=%r holds samples made with other settings (%s: %s); use a new output_dir "
                      "or the same settings" % (args["output_dir"], ", ".join(differing),
                                               ", ".join("%r != %r" % (previous.get(k), wanted[k])
                                                         for k in differing)))
    return previous.get("layer_ids")


# ----------------------------------------------------------------------------- the run
def extract(args, heartbeat):
    output = OutputDir(args["output_dir"], args["writes_in_flight"])
    output.lock()
    previous_layers = check_resumable(args)
    output.remove_temporaries()
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE") is None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args["cpu_kvcache_space_gib"])  # read by CPU vLLM only

    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    model_dir = derived_model_dir(args)
    dataset, _ = load_and_preprocess_dataset(
        target_model_path=model_dir, train_data_path=args["dataset"], seq_length=args["max_length"],
        build_dataset_num_proc=args["preprocess_procs"], seed=args["seed"], max_samples=args["max_samples"],
        # Not *.pt: speculators' training takes every file under output_dir ending in "pt" for a sample.
        token_freq_path=os.path.join(args["output_dir"], "token_freq.torch"),
        cache_dir=os.path.join(args["output_dir"], ".cache"))
    total = len(dataset)
    if previous_layers and output.first_missing(total, len(previous_layers)) == total:
        # A finished run started again: nothing to extract, no model to load.
        heartbeat.begin_extraction(total, total)
        heartbeat.update(phase="done", samples_done=total, eta_s=0)
        return total
    generator = make_generator(args, model_dir)
    layers = len(generator.layer_ids)
    write_data_config(args, generator, total)

    start = output.first_missing(total, layers)
    heartbeat.begin_extraction(start, total)
    heartbeat.update(phase="extracting")
    for first in range(start, total, args["batch_size"]):
        indices = list(range(first, min(first + args["batch_size"], total)))
        rows = [dataset[i] for i in indices]
        results = generator.generate([row["input_ids"].tolist() for row in rows])
        if len(results) != len(rows):
            raise RuntimeError("generate() returned %d results for %d sequences" % (len(results), len(rows)))
        for index, row, result in zip(indices, rows, results):
            sample = whole_sample(index, row, result, layers)
            output.submit(index, sample, lambda s: heartbeat.sample_written(s["input_ids"].shape[0]))
    heartbeat.update(phase="writing")
    output.drain()
    # Done before the generator goes: its __del__ shuts vLLM's workers down, which takes seconds.
    heartbeat.update(phase="done", samples_done=total, eta_s=0)
    return total


def whole_sample(index, row, result, layers):
    """The saved record; refuses a result whose shapes say the states belong elsewhere."""
    sample = {"input_ids": result["input_ids"], "hidden_states": result["hidden_states"],
              "loss_mask": row["loss_mask"][: result["input_ids"].shape[0]].clone()}
    if result["input_ids"].tolist() != row["input_ids"].tolist():
        raise RuntimeError("sample %d: generate() returned other input_ids than it was given" % index)
    if not sample_is_whole(sample, layers):
        raise RuntimeError("sample %d: %d tokens but hidden states of shapes %s for %d layers" % (
            index, result["input_ids"].shape[0], [tuple(h.shape) for h in result["hidden_states"]], layers))
    return sample


def main(argv):
    if len(argv) != 1:
        sys.stderr.write("usage: extract_driver.py <args.json>\n")
        return EXIT_USAGE
    try:
        args = load_arguments(argv[0])
    except Refused as refusal:
        sys.stderr.write("extract_driver: refused: %s\n" % refusal)
        return EXIT_USAGE
    # A custom tokenizer loaded without trust_remote_code asks on stdin and would wait forever.
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.makedirs(args["output_dir"], exist_ok=True)
    heartbeat = Heartbeat(args["heartbeat"])
    heartbeat.start()
    try:
        total = extract(args, heartbeat)
    except Refused as refusal:
        heartbeat.update(phase="failed", last_error="refused: %s" % refusal)
        heartbeat.stop()
        sys.stderr.write("extract_driver: refused: %s\n" % refusal)
        return refusal.exit_status
    except BaseException as exc:  # noqa: BLE001 - reported whole, then the process ends
        heartbeat.update(phase="failed", last_error="%s: %s" % (type(exc).__name__, exc))
        heartbeat.stop()
        traceback.print_exc()
        sys.stderr.flush()
        return EXIT_FAILED
    heartbeat.stop()
    sys.stderr.write("extract_driver: done: %d samples in %s\n" % (total, args["output_dir"]))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: vLLM's executor threads and the generator's __del__ must not hang the exit.
    os._exit(code)
