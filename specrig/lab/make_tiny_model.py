"""Create the runnable lab's tiny model and chat dataset, from nothing downloaded.

    <venv python> specrig/lab/make_tiny_model.py <home>

writes
    <home>/models/tiny-llama/     LlamaForCausalLM, random bf16 weights, a BPE tokenizer
                                  trained here with `tokenizers`, a chat template, an eos token
    <home>/data/tiny-chat.jsonl   {"conversations": [{"from": "human"|"gpt", "value": ...}]}
                                  lines, the ShareGPT shape speculators' preprocessing takes

Lab tooling run by the runnable venv's Python (torch, transformers, tokenizers). Deterministic:
the same seed gives the same files. The model's shape suits vLLM's CPU attention (head_dim 32)
and gives speculators' default layer choice four distinct layers ([2, 4, 5, 7] of 8).
"""
import json
import random
import sys
from pathlib import Path

SEED = 1234
CONVERSATIONS = 96
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML: speculators detects the assistant span from the text around "assistant".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MODEL_SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, max_position_embeddings=2048)
WORDS = ("the a model layer token state hidden draft verify speculate decode prefill cache block "
         "tensor batch sample engine worker schedule request answer question why how what when "
         "quick brown fox jumps over lazy dog river mountain cloud light shadow number seven "
         "eleven compute memory kernel attention head norm residual vector matrix gradient").split()


def conversations(rng):
    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40))).capitalize() + "."

    for _ in range(CONVERSATIONS):
        turns = []
        for _ in range(rng.randint(1, 3)):
            turns.append({"from": "human", "value": sentence()})
            turns.append({"from": "gpt", "value": " ".join(sentence() for _ in range(rng.randint(1, 4)))})
        yield {"conversations": turns}


def train_tokenizer(texts, vocab_size=512):
    """A byte-level BPE tokenizer trained on `texts`, with ChatML's special tokens and chat template
    (benchmarks/gpu/gpu_tools.py trains the GPU run's with it too)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main(home):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    rng = random.Random(SEED)
    rows = list(conversations(rng))
    data = home / "data" / "tiny-chat.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))

    texts = [turn["value"] for row in rows for turn in row["conversations"]]
    tokenizer = train_tokenizer(texts + ["<|im_start|>user\n", "<|im_start|>assistant\n"])
    out = home / "models" / "tiny-llama"
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)

    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=False, torch_dtype="bfloat16", **MODEL_SHAPE)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    print(json.dumps({"model": str(out), "data": str(data), "vocab_size": len(tokenizer),
                      "conversations": len(rows)}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_model.py <home>")
    main(Path(sys.argv[1]))
