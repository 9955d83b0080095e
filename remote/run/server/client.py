"""speculators' two CLI steps of server-mode extraction: their argv, their share of the dataset, and
what their logs say (stdlib only). docs/server-mode.md §6-7 has the flags and lines, with sources.

    prepare-data           renders and tokenizes the conversations through the server's render
                           endpoint into a datasets directory (arrow shards + state.json)
    generate-offline-data  one request per sample; the server's connector writes the states into the
                           staging path and the client moves each file to <output>/hs_{i}.safetensors

Both run as `<python> -m speculators <step> ...` in the client's environment (hosts.yaml `python`):
speculators/__main__.py exists in 0.8.0 to 0.9.0, and `-m` needs no console script on PATH.
"""
import re

from base.prepared import client_ranks, shard_indices

#: generate-offline-data's last words on samples it gave up on (0.8.0-0.9.0
#: cli/generate_offline_data.py: `Skipped {n} samples due to errors: [i, ...]`).
SKIPPED_LINE = re.compile(r"Skipped (\d+) samples due to errors: \[([0-9, ]*)\]")
#: Each sample given up on, as it happens (`Skipping sample %d due to error: ...`).
SKIPPING_LINE = re.compile(r"Skipping sample (\d+) due to error")


def endpoint(port, host="127.0.0.1"):
    """The server's base URL as prepare-data takes it (`--render-endpoint`, no /v1)."""
    return "http://%s:%d" % (host, port)


def prepare_argv(python, *, model, dataset, output, port, seq_length, max_samples=None, seed=None):
    """`speculators prepare-data`: the conversations rendered by the server into `output`."""
    argv = [python, "-m", "speculators", "prepare-data", "--model", model, "--data", dataset,
            "--render-endpoint", endpoint(port), "--output", output, "--seq-length", str(seq_length)]
    if max_samples is not None:
        argv += ["--max-samples", str(max_samples)]
    if seed is not None:
        argv += ["--seed", str(seed)]
    return argv


def generate_argv(python, *, model, prepared, output, port, concurrency, request_timeout, max_retries,
                  max_samples=None, world_size=None, rank=None):
    """`speculators generate-offline-data`: one file per sample of this shard into `output`.

    `--model` is the string the server serves (its --model): the client checks the two agree.
    No `--fail-on-error`: one bad sample would end a long run; the supervisor keeps its own account
    of skipped samples instead. No `--validate-outputs`: it loads every file with torch in the
    client, while the supervisor checks each file without torch after the run (outputs.py).
    """
    argv = [python, "-m", "speculators", "generate-offline-data", "--model", model,
            "--endpoint", endpoint(port) + "/v1", "--preprocessed-data", prepared, "--output", output,
            "--concurrency", str(concurrency), "--request-timeout", str(request_timeout),
            "--max-retries", str(max_retries)]
    if max_samples is not None:
        argv += ["--max-samples", str(max_samples)]
    if world_size:
        argv += ["--world-size", str(world_size), "--rank", str(rank or 0)]
    return argv


def generate_argvs(python, *, clients, concurrency, world_size=None, rank=None, **common):
    """generate_argv of each of this host's `clients` processes. One process's event loop is the limit on a
    fast GPU (docs/gpu.md, "The fourth run"), so the share can be split between several: client k is
    speculators' own rank rank*clients+k of world_size*clients (client_ranks), and the `concurrency`
    requests in flight are shared out between them. One client: the share's own --world-size/--rank."""
    if clients == 1:
        return [generate_argv(python, concurrency=concurrency, world_size=world_size, rank=rank, **common)]
    world, ranks = client_ranks(world_size, rank, clients)
    return [generate_argv(python, concurrency=concurrency // clients + (1 if k < concurrency % clients else 0),
                          world_size=world, rank=sub_rank, **common)
            for k, sub_rank in enumerate(ranks)]


def plan_share(plan, num_samples):
    """shard_indices of a server-mode plan (plan.py make) over `num_samples` rows: the share its clients write.
    A plan made before --clients has no "clients": one process."""
    return shard_indices(num_samples, plan["max_samples"], plan["world_size"], plan["rank"], plan.get("clients", 1))


def skipped(log_text):
    """The indices generate-offline-data reported skipped, sorted: its `Skipping sample` lines and its
    last `Skipped ...` summary (a summary line wrapped by the log's handler still leaves the former)."""
    found = set(int(i) for i in SKIPPING_LINE.findall(log_text))
    summaries = SKIPPED_LINE.findall(log_text)
    if summaries:
        found.update(int(i) for i in summaries[-1][1].replace(" ", "").split(",") if i)
    return sorted(found)

