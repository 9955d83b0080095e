"""vLLM's own residual stream of a model at the given layer ids, extraction off (issue 29: the states check
where the hidden-states connector refuses the model, MLA on vLLM 0.26):

    vllm_forward.py MODEL DATA N OUT_DIR IDS     (IDS: comma-separated, e.g. 2,4,5,8)

The model is loaded by vLLM's offline LLM in this process (V1 multiprocessing off, eager, no torch.compile,
no prefix caching), forward hooks on its decoder layers read what each hands to the next, hidden_states +
residual (the sum vLLM itself captures as an aux state, deepseek_v2.py DeepseekV2Model.forward), and each of
the first N chats of DATA (its chat template, at most MAX_TOKENS tokens) is one prefill (max_tokens=1).
Written as the connector writes: OUT_DIR/hs_{i}.safetensors with token_ids and hidden_states [tokens,
len(IDS), hidden] in bf16, id k the output of decoder layer k-1, so that gpu_tools.py reference checks them.
"""
import json
import os
import sys
import time

MAX_TOKENS = 2048
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


def decoder_layers(model):
    """The text model's decoder layers: KimiK25ForConditionalGeneration keeps it in language_model."""
    inner = getattr(model, "language_model", model)
    return inner.model.layers


def prompts(tokenizer, data, n):
    out = []
    with open(data) as handle:
        for line in handle:
            if len(out) == n:
                break
            turns = json.loads(line)["conversations"]
            messages = [{"role": ROLES[turn["from"]], "content": turn["value"]} for turn in turns]
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"][:MAX_TOKENS])
    return out


def main(model_dir, data, n, out_dir, layer_ids):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model in this process: the hooks' store is ours
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model hands vLLM a function
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    started = time.time()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chats = prompts(tokenizer, data, n)
    llm = LLM(model=model_dir, enforce_eager=True, compilation_config={"mode": 0}, enable_prefix_caching=False,
              max_model_len=MAX_TOKENS + 16, max_num_batched_tokens=MAX_TOKENS + 16, max_num_seqs=1,
              gpu_memory_utilization=0.5, seed=0)
    loaded = time.time()
    memory = memory_after_load(llm, torch)
    store = {}

    def hook(index):
        def keep(module, inputs, output):
            store.setdefault(index + 1, (output[0] + output[1]).detach().to("cpu", torch.bfloat16))
        return keep

    def register(model):
        layers = decoder_layers(model)
        for index, layer in enumerate(layers):
            if index + 1 in layer_ids:
                layer.register_forward_hook(hook(index))
        return len(layers)

    num_layers = llm.apply_model(register)[0]
    os.makedirs(out_dir, exist_ok=True)
    once = SamplingParams(max_tokens=1, temperature=0.0)
    tokens = 0
    for i, ids in enumerate(chats):
        store.clear()
        llm.generate([{"prompt_token_ids": ids}], once, use_tqdm=False)
        states = torch.stack([store[k][:len(ids)] for k in layer_ids], dim=1)
        save_file({"token_ids": torch.tensor(ids, dtype=torch.int64), "hidden_states": states.contiguous()},
                  os.path.join(out_dir, "hs_%d.safetensors" % i))
        tokens += len(ids)
    print(json.dumps({"files": len(chats), "tokens": tokens, "layer_ids": layer_ids, "num_hidden_layers": num_layers,
                      "load_s": round(loaded - started, 1), "forward_s": round(time.time() - loaded, 1),
                      "memory": memory}))


def memory_after_load(llm, torch):
    """What the engine holds on the GPU once loaded (in this process: V1 multiprocessing off): the figures
    behind sizing.py's runtime allowance. The peak minus what stays allocated is the start-up's transient (the
    profile run's activations); what stays is the weights and the KV cache, whose share vLLM's cache config says."""
    gib = 2.0 ** 30
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    cache = getattr(config, "cache_config", None)
    free, total = torch.cuda.mem_get_info()
    return {"allocated_gib": round(torch.cuda.memory_allocated() / gib, 3),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / gib, 3),
            "reserved_gib": round(torch.cuda.memory_reserved() / gib, 3),
            "device_used_gib": round((total - free) / gib, 3),
            "kv_blocks": getattr(cache, "num_gpu_blocks", None), "block_size": getattr(cache, "block_size", None)}


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit("usage: vllm_forward.py MODEL DATA N OUT_DIR IDS")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], [int(k) for k in sys.argv[5].split(",")])
