"""specrig's extraction driver: EAGLE-3 hidden states through speculators' generator API.

    <python> remote/run/extract_driver.py <args.json>   </dev/null

A long-running program (not an RPC command): launched detached by the supervisor, by
`inv smoke`, or by hand. With its package run/driver/, the one part of remote/ allowed to import
torch, vLLM and speculators, and only inside functions: vLLM spawns its workers, which re-import
this file (and so every module it imports at its top).

args.json (an object; only the first three are required):
  model                 str        local model directory (config.json, tokenizer, weights); a launch
                                   gives a Hugging Face repo id's snapshot directory (remote/base/hfcache.py)
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
  shard_index           int|null   one shard of a sharded run (both or neither): only the global
  shard_count           int|null   sample indices i with i % shard_count == shard_index; files
                                   keep the global index, so the shards' outputs merge as they are
  model_id              str|null   the repo id `model` was found by (recorded for people, not read)

Output (the layout speculators' Eagle3SampleFileDataset reads; it takes every file under the
directory whose name ends in "pt", so nothing else here does): data_{i}.pt holding
{"input_ids": long[seq], "hidden_states": [bf16[seq, hidden] per layer], "loss_mask": long[seq]},
data_config.json (speculators' DataGenerationConfig plus a "specrig" section fixing the settings
a resume must share; a shard's also "dataset_samples", the whole dataset's count, and its
num_samples is the shard's). A sample is written to a hidden temporary name and renamed into place.

Resume: a rerun with the same settings finds the first missing or unloadable sample (of its
shard, for a shard) and goes on from there; samples after it are rewritten in place, never
duplicated. Different settings on an existing output directory are refused.

A finished output directory started again is done at once, without loading the model.
The batch-size refusal (contract.reorder_hazard) applies to speculators <= 0.4.

Heartbeat (rewritten atomically every HEARTBEAT_S seconds of run/driver/heartbeat.py and at every
phase change):
  {"phase": "loading|extracting|writing|done|failed", "samples_done", "samples_total",
   "tokens_per_s", "eta_s", "last_error", "updated_at" (unix time), "pid"}
  (for a shard, samples_done and samples_total count the shard's samples)

Exit status: 0 done; 1 failed (the traceback on stderr, vLLM's and speculators' frames intact; a
sample write that failed for want of space says only "extract_driver: disk full: <output_dir>: <free>
free, a sample needs about <size>; <exception>"); 2 bad arguments or a refused setting (the reason
on stderr); 3 another driver holds output_dir.

The parts are the modules of run/driver/ (arguments, heartbeat, output, model, extraction); this file
is the program: the import path, main(), the exit statuses.
"""
import os
import sys
import traceback

# Started by path, so sys.path[0] is remote/run/: make it remote/, where the shared modules and
# the stage packages are, exactly as for a call through entry.py.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from run.driver.arguments import Locked, Refused, load_arguments
from run.driver.extraction import extract
from run.driver.heartbeat import Heartbeat
from run.driver.output import DiskFull

EXIT_FAILED, EXIT_USAGE, EXIT_LOCKED = 1, 2, 3


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
        heartbeat.fail("refused: %s" % refusal)
        sys.stderr.write("extract_driver: refused: %s\n" % refusal)
        return EXIT_LOCKED if isinstance(refusal, Locked) else EXIT_USAGE
    except DiskFull as full:
        # The figures say it all; the writer's traceback would only bury them.
        heartbeat.fail("disk full: %s" % full)
        sys.stderr.write("extract_driver: disk full: %s\n" % full)
        return EXIT_FAILED
    except BaseException as exc:  # reported whole, then the process ends
        heartbeat.fail("%s: %s" % (type(exc).__name__, exc))
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
