"""The contract's points in vLLM's extract_hidden_states method: the method's name (C1), its draft model
config (C2, and a vision-language target's text_config), the layer ids its proposer reads (C3), the engine
settings it refuses (C16).
"""
import ast

from drift import findings as F
from drift.classes import class_member
from drift.refs import ValueRef
from drift.server.context import HS_CONFIG, PROPOSER, SPECULATIVE_CONFIG, Problem, Skip, own_function, string_constants


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
                    provider=F.Location.of(module, alias), callee=module.name + ".SpeculativeMethod")]


def check_draft_model_config(ctx):
    module = ctx.need(SPECULATIVE_CONFIG, "speculative config")
    config_module = ctx.module(HS_CONFIG)
    for node in ast.walk(module.tree):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and ctx.launch.METHOD in string_constants(node.test)
                and any(isinstance(n, ast.Name) and n.id == "ExtractHiddenStatesConfig" for b in node.body
                        for n in ast.walk(b))):
            if config_module is not None and ctx.cls(config_module, "ExtractHiddenStatesConfig") is not None:
                return []
    return [Problem("SpeculativeConfig has no branch turning draft_model_config {\"hf_config\": {...}} into "
                    "an ExtractHiddenStatesConfig for the method: the layer ids specrig passes there are not read.",
                    provider=F.Location.of(module, module.tree.body[0]) if module.tree.body else None,
                    callee=module.name + ".SpeculativeConfig")]


def check_layer_ids_key(ctx):
    module = ctx.need(PROPOSER, "extract_hidden_states proposer")
    keys = ctx.launch.speculative_config([1])["draft_model_config"]["hf_config"]
    problems = []
    strings = set(string_constants(module.tree))
    for key in sorted(keys):
        if key not in strings:
            problems.append(Problem("The extract_hidden_states proposer never reads %r, the key specrig's launch "
                                    "puts the layer ids under." % key, provider=None,
                                    callee=module.name, detail=key))
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
                                        provider=F.Location.of(module, node), callee=module.name, detail=name))
        # if <...>.disable_padded_drafter_batch: raise
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Attribute)
                and any(isinstance(n, ast.Raise) for n in node.body)):
            name = node.test.attr
            if sent.get(name):
                problems.append(Problem("The method refuses %s=True, which specrig's launch sets." % name,
                                        provider=F.Location.of(module, node), callee=module.name, detail=name))
            elif name not in sent and _defaults_true(ctx, name):
                problems.append(Problem("The method refuses %s, which SpeculativeConfig turns on by default and "
                                        "specrig's launch does not turn off." % name,
                                        provider=F.Location.of(module, node), callee=module.name, detail=name))
    return problems


def _defaults_true(ctx, field):
    module = ctx.module(SPECULATIVE_CONFIG)
    cls = ctx.cls(module, "SpeculativeConfig") if module is not None else None
    member = class_member(ctx.index, cls, field) if cls is not None else None
    value = getattr(getattr(member, "node", None), "value", None)
    return isinstance(member, ValueRef) and isinstance(value, ast.Constant) and value.value is True


def check_vl_text_config(ctx):
    if not ctx.model:
        raise Skip("no model directory given")
    if not isinstance(ctx.model_config.get("text_config"), dict):
        raise Skip("the model's config has no text_config")
    module = ctx.need(HS_CONFIG, "ExtractHiddenStatesConfig")
    cls = ctx.cls(module, "ExtractHiddenStatesConfig")
    init = own_function(cls, "__init__") if cls is not None else None
    if init is None:
        raise Skip("ExtractHiddenStatesConfig.__init__ not read")
    if "get_text_config" in ast.dump(init):
        return []
    return [Problem("ExtractHiddenStatesConfig flattens the target's text_config to a dict: a vision-language "
                    "target fails config validation ('text_config ... does not have num_attention_heads', "
                    "vllm #39017, fixed by #38987).", provider=F.Location.of(module, init),
                    callee=cls.dotted + ".__init__", detail="text_config")]
