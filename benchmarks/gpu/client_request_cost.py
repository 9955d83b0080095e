"""The CPU one request costs speculators' client before it leaves, and the bytes it sends: speculators' own
generate_hidden_states_async (data_generation/vllm_client.py, as installed: patched or not) through openai
and httpx2 into an in-memory transport that answers as vLLM does, against json.dumps of the same body (what
a bare client pays).

The GPU run's profile (docs/gpu.md, "The fourth run") found generate-offline-data's one asyncio thread at
0.99 of a core, 78-79 % of it in openai's request-params transform (openai/_utils/_transform.py), which
walks `prompt=token_ids` element by element. The patch client-token-ids-in-extra-body (patchset
speculators-0.8-0.9-client) sends the same JSON with the ids in extra_body; run this before and after
`inv apply-patches` to see the cost go and the bytes stay:

    <speculators-0.9-python> benchmarks/gpu/client_request_cost.py [TOKENS ...]   (default 512 1301 2048)

One JSON line per length: whether the installed client is patched, the request's ms (the whole call, the
response's parsing included) and json.dumps's, their ratio, the requests per second one core can send at
most, and the sha256 of the request body (equal before and after: tests/patching/test_client_patch_lab.py).
"""
import asyncio
import hashlib
import json
import random
import sys
import time

import httpx2
import openai
from speculators.data_generation import vllm_client

REPEATS = 50
MODEL = "m"


def token_ids(n_tokens):
    rng = random.Random(n_tokens)
    return [rng.randrange(128256) for _ in range(n_tokens)]


class Answering:
    """The transport's handler: keeps the last request's body, answers as vLLM's completion endpoint does
    for max_tokens=1 with return_token_ids (the prompt's ids back, kv_transfer_params naming the file)."""

    def __init__(self):
        self.body = None

    def __call__(self, request):
        self.body = request.content
        prompt = json.loads(self.body)["prompt"]
        return httpx2.Response(200, json={
            "id": "cmpl-0", "object": "text_completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "text": "x", "finish_reason": "length", "logprobs": None,
                         "prompt_token_ids": prompt, "token_ids": [1]}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1},
            "kv_transfer_params": {"hidden_states_path": "/dev/null/hs_0.safetensors"}})


def patched():
    """Whether the installed client sends the ids in extra_body (the patch's marker is in its source)."""
    with open(vllm_client.__file__, encoding="utf-8") as handle:
        return '"prompt": token_ids' in handle.read()


async def request_s(ids, answering):
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="none",
                                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(answering)))
    item = {"input_ids": ids}
    for _ in range(5):
        await vllm_client.generate_hidden_states_async(client, MODEL, item)
    started = time.perf_counter()
    for _ in range(REPEATS):
        await vllm_client.generate_hidden_states_async(client, MODEL, item)
    elapsed = (time.perf_counter() - started) / REPEATS
    await client.close()
    return elapsed


def dumps_s(ids):
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1, "return_token_ids": True}
    started = time.perf_counter()
    for _ in range(REPEATS):
        json.dumps(body)
    return (time.perf_counter() - started) / REPEATS


def measure(n_tokens):
    ids, answering = token_ids(n_tokens), Answering()
    ours, anchor = asyncio.run(request_s(ids, answering)), dumps_s(ids)
    return {"openai": openai.__version__, "patched": patched(), "tokens": n_tokens,
            "request_ms": round(ours * 1000, 3), "json_dumps_ms": round(anchor * 1000, 3),
            "ratio": round(ours / anchor, 1), "requests_per_s_one_core_at_most": round(1 / ours, 1),
            "body_sha256": hashlib.sha256(answering.body).hexdigest(), "body_bytes": len(answering.body)}


if __name__ == "__main__":
    for length in [int(arg) for arg in sys.argv[1:]] or [512, 1301, 2048]:
        print(json.dumps(measure(length)), flush=True)
