"""The CPU one request costs speculators' client before it leaves: openai's transform of `prompt=token_ids`,
against json.dumps of the same body (what the bare client sends), per prompt length.

The GPU run's profile (docs/gpu.md, "The fourth run") found generate-offline-data's one asyncio thread at
0.99 of a core, 78-79 % of it in openai's request-params transform (openai/_utils/_transform.py), which
walks the token list element by element. This times that call alone, on the machine it runs on, with
the client environment's own openai (speculators 0.9.0 passes the prompt so: vllm_client.py, the
`client.completions.create(..., prompt=token_ids, ...)` of generate_hidden_states_async):

    <speculators-0.9-python> benchmarks/gpu/client_request_cost.py [TOKENS ...]   (default 512 1301 2048)

It prints one JSON line per length: ms per request for each, their ratio, and the requests per second one
core can send at most for the transform alone.
"""
import asyncio
import json
import random
import sys
import time

from openai import __version__ as openai_version
from openai._utils._transform import async_maybe_transform
from openai.types import completion_create_params

REPEATS = 50


def body(n_tokens):
    rng = random.Random(n_tokens)
    return {"model": "m", "prompt": [rng.randrange(128256) for _ in range(n_tokens)], "max_tokens": 1, "stream": False}


async def transform_s(params):
    shape = completion_create_params.CompletionCreateParamsNonStreaming
    for _ in range(5):
        await async_maybe_transform(params, shape)
    started = time.perf_counter()
    for _ in range(REPEATS):
        await async_maybe_transform(params, shape)
    return (time.perf_counter() - started) / REPEATS


def dumps_s(params):
    started = time.perf_counter()
    for _ in range(REPEATS):
        json.dumps(params)
    return (time.perf_counter() - started) / REPEATS


def main(lengths):
    for n_tokens in lengths:
        params = body(n_tokens)
        ours, anchor = asyncio.run(transform_s(params)), dumps_s(params)
        print(json.dumps({"openai": openai_version, "tokens": n_tokens, "transform_ms": round(ours * 1000, 2),
                          "json_dumps_ms": round(anchor * 1000, 3), "ratio": round(ours / anchor, 1),
                          "requests_per_s_one_core_at_most": round(1 / ours, 1)}))


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [512, 1301, 2048])
