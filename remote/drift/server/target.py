"""The contract's points in the target model's classes: whether the inner model stores the last layer's
output (C15), whether the class implements SupportsEagle3.
"""
import ast

from drift import findings as F
from drift.classes import info
from drift.model_interface import inner_class, unimplemented_members
from drift.refs import ClassRef
from drift.server.context import INTERFACES, Problem, Skip, own_function


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
            forward = own_function(entry, "forward")
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
            provider=F.Location.of(inner.module, forward), callee=inner.dotted, detail=architecture.split(" ")[0],
            severity=severity,
            advice="leave out the last layer (include_last_layer: false, ids below L), or use a vLLM whose model "
                   "captures it"))
    return problems


def check_eagle3_interface(ctx):
    module = ctx.need(INTERFACES, "model interfaces")
    protocol = ctx.cls(module, "SupportsEagle3")
    if protocol is None:
        raise Skip("vLLM has no SupportsEagle3")
    problems = []
    for _architecture, cls in ctx.model_classes():
        missing = unimplemented_members(ctx.index, cls, protocol)
        if missing:
            problems.append(Problem("%s does not implement SupportsEagle3 (it lacks %s): the model runner refuses "
                                    "the method ('Model does not support EAGLE3 interface')."
                                    % (cls.node.name, ", ".join(missing)), provider=F.Location.of(cls.module, cls.node),
                                    callee=cls.dotted, detail="SupportsEagle3"))
    return problems
