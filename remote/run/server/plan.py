"""A server-mode run's plan: the three commands and what the supervisor checks (stdlib only).

Made once when a run is launched and again when it is resumed (a fix of specrig or of the host's
environments applies to the next attempt), from the driver's arguments (contract.DRIVER_DEFAULTS
and SERVER_DEFAULTS keys) and the two environments: `python`, speculators' (the client steps), and
`server_python`, vLLM's (hosts.yaml; the same interpreter by default). Stored in run.json as
"server"; the supervisor (server/workload.py) reads nothing else. The supervisor moves it to another
port before an attempt whose server's port is taken (for_attempt): the port, the server's --port and
the client steps' endpoints change together.
"""
import json
import os
import socket

from base import atomic, contract, pkgmeta, server_command
from base import nodes as node_layout
from base.failure import RemoteFailure
from base.server_command import PlanError
from drift.server import startup
from run.server import client, prepared_cache, render

#: The failure kind of a port taken when a process bound it (classify_rules.json).
PORT_TAKEN = "port-taken"
#: Free ports the kernel is asked for before a move gives up (each is bound again as vLLM binds it).
FREE_PORT_TRIES = 5
#: Which activation a stored layer id is, on this path (docs/server-mode.md §3 and §12, measured on
#: vLLM 0.32: id k is the output of decoder layer k-1 within bf16 rounding).
LAYER_CONVENTION = ("id k = the input of decoder layer k (the output of layer k-1, before the final "
                    "norm); 0 = the embeddings; L = the last layer's output")


def overridden(config, overrides):
    """config.json as the server sees it under --hf-overrides (nested dicts merged; None removes a key):
    the layer count and the hidden size of the files follow it (inv smoke shrinks the model so)."""
    merged = dict(config)
    for key, value in (overrides or {}).items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = overridden(merged[key], value)
        else:
            merged[key] = value
    return merged


def settings_of(driver_args):
    """The driver's arguments over the defaults of both paths."""
    settings = dict(contract.DRIVER_DEFAULTS)
    settings.update(contract.SERVER_DEFAULTS)
    settings.update({k: v for k, v in driver_args.items() if v is not None})
    return settings


def staging_dir(settings, key):
    """The connector's staging directory: `staging`, else <out>/.specrig-staging/<key> (the run id, or
    a multi-node job's id: every node's connector writes the same directory)."""
    return os.path.abspath(os.path.expanduser(settings["staging"] or os.path.join(
        settings["output_dir"], ".specrig-staging", key)))


def make(run_path, run_id, driver_args, *, client_python, server_python=None, nodes=None):
    """The plan of run `run_id` in `run_path` ({"server_argv", "prepare_argv", "generate_argvs", ...});
    `nodes`: this node's part of a multi-node job (server/nodes.py record), whose workers run the server
    alone (no client steps: None). What the plan holds is gathered a module at a time: the settings here;
    the model's layers and the connector (base/server_command.py); the server's environment; the server's
    command, the render server's, the prepared data's key, the client steps'. PlanError refuses the model
    first, then the clients, the storage, the server's environment."""
    settings = settings_of(driver_args)
    model, out = settings["model"], settings["output_dir"]
    staging = staging_dir(settings, nodes["job_id"] if nodes else run_id)
    prepared_dir = os.path.join(run_path, "prepared")
    server_python_path = os.path.expanduser(server_python or client_python)
    serve_program = os.path.join(run_path, "code", "run", "server", "vllm_serve.py")
    sharded = settings["shard_count"] is not None
    clients = not nodes or nodes["role"] == node_layout.HEAD
    storage = settings["storage"]
    extra = server_extra_args(settings, driver_args)
    try:
        config = overridden(server_command.read_model_config(model), settings["hf_overrides"])
        layers, layer_ids = server_command.resolve_layer_ids({"model_config": config,
                                                               "layer_ids": settings["layer_ids"]})
    except (OSError, ValueError) as exc:
        raise PlanError("model %s: %s" % (model, exc)) from None
    # What speculators' training reads by default (launch_vllm.py's choice): other ids must be told to it.
    training_layer_ids = server_command.default_layer_ids(layers)
    hidden_size = server_command.text_config(config).get("hidden_size")
    connector = server_command.kv_transfer_config(staging, storage=storage)["kv_connector"]
    if not 1 <= settings["clients"] <= settings["concurrency"]:
        raise PlanError("clients %r: a whole number from 1 to the concurrency (%d): each client process keeps "
                        "at least one request in flight" % (settings["clients"], settings["concurrency"]))
    if storage not in contract.STORAGES:
        raise PlanError("storage %r: expected one of %s" % (storage, ", ".join(contract.STORAGES)))
    distribution, vllm_dir, vllm_version = server_command.server_environment(server_python, storage)
    # What this vLLM's own source asks of the command (drift/server/startup.py): --enable-scale-out where the
    # parser has it, and the flags turning off settings it refuses at start-up with the connector.
    decided = startup.installed_launch_settings(vllm_package_dir=vllm_dir, distribution=distribution,
                                                version=vllm_version)
    server_argv = server_command.server_argv({
        "model": model, "python": server_python_path,
        "distribution": distribution, "enable_scale_out": decided["enable_scale_out"],
        "num_hidden_layers": layers, "layer_ids": layer_ids, "hidden_states_path": staging,
        "writer_threads": settings["writer_threads"], "storage": storage,
        "tensor_parallel_size": settings["tensor_parallel_size"],
        "port": settings["port"], "host": "127.0.0.1",
        "extra_args": extra + [entry["flag"] for entry in decided["startup_flags"]]})
    if nodes:
        server_argv = node_layout.server_argv(
            server_argv, nodes, distribution=distribution, invocation=server_command.INVOCATIONS[distribution][0],
            serve_program=serve_program)
    # The GPU-less render server prepare-data renders through while the model loads (render.py), its port
    # added at each attempt; None: prepare-data renders through the model's server at /health.
    render_argv = render.server_argv(server_argv, python=server_python_path, program=serve_program,
                                     model=model) if clients and settings["render_server"] else None
    # What the prepared data's cache key hashes (prepared_cache.py); None: no cache (turned off, or a worker).
    key = prepared_cache.key_of(settings, vllm_version) if clients and settings["prepared_cache"] else None
    prepare_argv = client.prepare_argv(
        client_python, model=model, dataset=settings["dataset"], output=prepared_dir, port=settings["port"],
        seq_length=settings["max_length"], max_samples=settings["max_samples"],
        seed=settings["seed"]) if clients else None
    generate_argvs = client.generate_argvs(
        client_python, clients=settings["clients"], model=model, prepared=prepared_dir, output=out,
        port=settings["port"], concurrency=settings["concurrency"], request_timeout=settings["request_timeout"],
        max_retries=settings["max_retries"], max_samples=settings["max_samples"],
        world_size=settings["shard_count"] if sharded else None, rank=settings["shard_index"]) if clients else None
    return {
        "vllm_version": vllm_version, "port": settings["port"], "staging": staging, "prepared": prepared_dir,
        "out": out,
        "num_hidden_layers": layers, "layer_ids": layer_ids, "layer_convention": LAYER_CONVENTION,
        "training_layer_ids": training_layer_ids,
        "startup_flags": decided["startup_flags"],
        # How the files hold the states, and the connector that writes them (docs/server-mode.md, "fp8 storage").
        "storage": storage, "connector": connector, "hidden_size": hidden_size,
        "max_samples": settings["max_samples"], "allow_skipped": bool(settings["allow_skipped"]),
        "world_size": settings["shard_count"] if sharded else 1, "rank": settings["shard_index"] if sharded else 0,
        "clients": settings["clients"],
        "server_argv": server_argv, "prepare_argv": prepare_argv, "render_argv": render_argv,
        "prepared_key": key, "generate_argvs": generate_argvs,
    }


def server_extra_args(settings, driver_args):
    """The server's flags of the driver's own settings (load format, overrides, memory, batching, eager,
    collective_safe), passed after its command's (server_command.server_argv's extra_args)."""
    extra = []
    if settings["load_format"]:
        extra += ["--load-format", settings["load_format"]]
    if settings["hf_overrides"]:
        extra += ["--hf-overrides", json.dumps(settings["hf_overrides"])]
    if driver_args.get("gpu_memory_utilization") is not None:
        extra += ["--gpu-memory-utilization", str(settings["gpu_memory_utilization"])]
    if settings["max_num_batched_tokens"]:
        extra += ["--max-num-batched-tokens", str(settings["max_num_batched_tokens"])]
    if settings["enforce_eager"]:
        extra += ["--enforce-eager"]
    if settings["collective_safe"]:  # with NCCL_P2P_DISABLE=1 in the env: vLLM #33041's workaround
        extra += ["--disable-custom-all-reduce"]
    return extra


def of_run(run_path, run_id, driver_args, *, client_python, server_python, nodes):
    """A launched or resumed run's plan (make) when this python's speculators takes the server path
    (>= 0.8), or the run is a node of a multi-node job (a worker runs vLLM alone: its python needs no
    speculators); else None. RemoteFailure bad-argument for a plan that cannot be made."""
    speculators = pkgmeta.versions(("speculators",))["speculators"]
    if not nodes and contract.extraction_mode(speculators) != contract.SERVER:
        return None
    try:
        return make(run_path, run_id, driver_args, client_python=client_python, server_python=server_python,
                    nodes=nodes)
    except PlanError as exc:
        raise RemoteFailure("bad-argument", str(exc)) from None


def with_value(argv, flag, value):
    """`argv` with the word after `flag` replaced by `value`."""
    changed = list(argv)
    changed[changed.index(flag) + 1] = value
    return changed


def on_port(server_plan, port):
    """The plan with its server on `port`: "port", the server's --port, prepare-data's --render-endpoint and
    each generate-offline-data's --endpoint (client.endpoint); the rest as it was."""
    endpoint = client.endpoint(port)
    return dict(server_plan, port=port, server_argv=with_value(server_plan["server_argv"], "--port", str(port)),
                prepare_argv=server_plan["prepare_argv"] and with_value(server_plan["prepare_argv"],
                                                                        "--render-endpoint", endpoint),
                generate_argvs=server_plan["generate_argvs"] and [
                    with_value(argv, "--endpoint", endpoint + "/v1") for argv in server_plan["generate_argvs"]])


def for_attempt(supervisor, entry):
    """The plan attempt `entry` runs: the run's (run.json "server"); or, when its server's port is taken now,
    or this supervisor's previous attempt failed for a port taken at the server's own bind (port-taken
    naming no port, or this one: its holder won a race for it once), the plan on a free port (on_port). A
    move is recorded: run.json's plan, the attempt's `port_moved` (status.json), a line in driver.log.
    vLLM's other ports need no move: it picks them anew at each start."""
    server_plan = supervisor.record["server"]
    port = server_plan["port"]
    last = supervisor.previous_failure or {}
    raced = last.get("kind") == PORT_TAKEN and last.get("port") in (None, port)
    probe = port_free(port)
    if probe["ok"] and not raced:
        return server_plan
    why = probe["detail"] if not probe["ok"] else "its server could not bind 127.0.0.1:%d at attempt %s (%s)" % (
        port, last.get("attempt"), PORT_TAKEN)
    for _ in range(FREE_PORT_TRIES):
        new_port = render.free_port()
        if port_free(new_port)["ok"]:
            break
    else:
        supervisor.log_marker("attempt %d: %s; no free port found to move to: the server tries it again"
                              % (entry["attempt"], why))
        return server_plan
    moved = on_port(server_plan, new_port)
    supervisor.record["server"] = moved
    atomic.write_json(supervisor.run.file("run.json"), supervisor.record)
    entry["port_moved"] = {"from": port, "to": new_port, "why": why}
    supervisor.log_marker("attempt %d: %s: the vLLM server moves to port %d (run.json's server.port; the client "
                          "steps' endpoints with it)" % (entry["attempt"], why, new_port))
    return moved


def port_free(port):
    """Nothing listens on 127.0.0.1:`port`: the server binds it there. Probed as vLLM binds it, with
    SO_REUSEADDR (vllm==0.26.0 vllm/entrypoints/openai/api_server.py:582-586): the connections a server
    that just ended leaves in TIME_WAIT do not keep the next one from the port, a listener does."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("127.0.0.1", port))
    except OSError as exc:
        return {"name": "port", "ok": False, "detail": "127.0.0.1:%d is taken (%s)" % (port, exc.strerror or exc),
                "advice": "stop what listens there (`ss -ltnp 'sport = :%d'` names it), or pass --port" % port}
    finally:
        probe.close()
    return {"name": "port", "ok": True, "detail": "127.0.0.1:%d is free" % port, "advice": None}
