"""The run: preprocessing, the resume settings, data_config.json, and the generate/write loop."""
import json
import os

from base import atomic
from base.contract import PHASE_DONE, PHASE_EXTRACTING, PHASE_WRITING
from run.driver.arguments import Refused
from run.driver.model import derived_model_dir, make_generator
from run.driver.output import OutputDir, remove_temporaries, sample_is_whole

#: Settings that must be equal for a resume to continue the same sequence of samples.
RESUME_KEYS = ("model", "dataset", "layer_ids", "max_length", "seed", "max_samples", "load_format", "hf_overrides",
               "shard_index", "shard_count")
#: Recorded in data_config.json only for one shard of a sharded run: one host's output stays as it was.
SHARD_KEYS = ("shard_index", "shard_count")


def shard_indices(total, args):
    """The global sample indices this driver extracts: all of them, or (one shard of a sharded run)
    those i with i % shard_count == shard_index. Strided, so every shard's size is known from the
    dataset's alone and differs from another's by one at most; files keep the global index."""
    if args.get("shard_count") is None:
        return list(range(total))
    return list(range(args["shard_index"], total, args["shard_count"]))


def extract(args, heartbeat):
    output = OutputDir(args["output_dir"], args["writes_in_flight"])
    output.lock()
    previous_layers = check_resumable(args)
    remove_temporaries(output.path)
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
    mine = shard_indices(total, args)
    if previous_layers and output.first_missing(mine, len(previous_layers)) == len(mine):
        # A finished run started again: nothing to extract, no model to load.
        heartbeat.begin_extraction(len(mine), len(mine))
        heartbeat.update(phase=PHASE_DONE, samples_done=len(mine), eta_s=0)
        return len(mine)
    generator = make_generator(args, model_dir)
    layers = len(generator.layer_ids)
    write_data_config(args, generator, total, len(mine))

    start = output.first_missing(mine, layers)
    heartbeat.begin_extraction(start, len(mine))
    heartbeat.update(phase=PHASE_EXTRACTING)
    for first in range(start, len(mine), args["batch_size"]):
        indices = mine[first:first + args["batch_size"]]
        rows = [dataset[i] for i in indices]
        results = generator.generate([row["input_ids"].tolist() for row in rows])
        if len(results) != len(rows):
            raise RuntimeError("generate() returned %d results for %d sequences" % (len(results), len(rows)))
        for index, row, result in zip(indices, rows, results):
            sample = whole_sample(index, row, result, layers)
            output.submit(index, sample, lambda s: heartbeat.sample_written(s["input_ids"].shape[0]))
    heartbeat.update(phase=PHASE_WRITING)
    output.drain()
    # Done before the generator goes: its __del__ shuts vLLM's workers down, which takes seconds.
    heartbeat.update(phase=PHASE_DONE, samples_done=len(mine), eta_s=0)
    return len(mine)


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


def write_data_config(args, generator, dataset_samples, num_samples):
    """speculators' config of the output (num_samples: the samples this directory gets), with a
    "specrig" section: the resume settings, and for a shard the whole dataset's sample count."""
    from speculators.data_generation.config_generator import DataGenerationConfig

    config = DataGenerationConfig.from_generator(
        generator=generator, train_data_path=args["dataset"], seq_length=args["max_length"],
        cache_dir=os.path.join(args["output_dir"], ".cache"), num_samples=num_samples,
        max_samples=args["max_samples"], seed=args["seed"]).to_dict()
    config["specrig"] = resume_settings(args, generator.layer_ids)
    if args.get("shard_count") is not None:
        config["specrig"]["dataset_samples"] = dataset_samples
    atomic.write_json(os.path.join(args["output_dir"], "data_config.json"), config)


def resume_settings(args, layer_ids):
    settings = {key: args[key] for key in RESUME_KEYS if key not in SHARD_KEYS or args[key] is not None}
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
