"""The target model as the generator sees it: hf_overrides merged, GPUs counted, generator built."""
import json
import os

from base import atomic


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
    if args.get("collective_safe"):  # --collective-safe: no custom all-reduce (the env has NCCL_P2P_DISABLE=1)
        generator_module.ParallelConfig = functools.partial(generator_module.ParallelConfig,
                                                            disable_custom_all_reduce=True)
    return VllmHiddenStatesGenerator(
        model_path=model_dir,
        layer_ids=args["layer_ids"],
        # +1: the generator keeps max_model_len - 1 tokens (room for the one decode token).
        max_model_len=args["max_length"] + 1,
        gpu_memory_utilization=args["gpu_memory_utilization"],
        tensor_parallel_size=args["tensor_parallel_size"] or visible_gpus(),
    )
