"""What speculators needs of the served model class, checked against the provider's model code.

The model class comes from the architecture name in the model directory's
config.json through vLLM's model registry source. What is needed is read from
the consumer: the interface-check functions it calls on the model (provider
functions whose body is `isinstance(model, SomeProtocol)`), the attributes it
reads on the model once the check passed, and those it reads, through a
function bound with `types.MethodType`, on objects taken from the model.
A model directory with custom code (`auto_map`) needs `trust_remote_code=True`
on every Hugging Face loader the consumer points at it.
"""
import re

from drift import findings as F
from drift import syntax as ast
from drift.classes import class_member, info, instance_member
from drift.refs import ClassRef, ExternalRef, FunctionRef, MissingRef, ValueRef
from drift.signatures import Unchecked
from drift.syntax import walk

#: Where vLLM's registry of architecture names lives, relative to the provider package.
REGISTRY_MODULE = "model_executor.models.registry"
#: Hugging Face loaders that read a model directory (and run its custom code when trusted).
HF_LOADER = r"^transformers\.(?:[\w.]+\.)?Auto\w+\.from_pretrained$"
#: The public API of torch.nn.Module, the one external base of every vLLM model: an attribute
#: outside it that the model's own source does not define is not there (submodules are
#: assigned in __init__, which is read).
NN_MODULE_API = frozenset("""
T_destination add_module apply bfloat16 buffers call_super_init children compile cpu cuda double
dump_patches eval extra_repr float forward get_buffer get_extra_state get_parameter get_submodule half
ipu load_state_dict modules mtia named_buffers named_children named_modules named_parameters parameters
register_backward_hook register_buffer register_forward_hook register_forward_pre_hook
register_full_backward_hook register_full_backward_pre_hook register_load_state_dict_post_hook
register_load_state_dict_pre_hook register_module register_parameter register_state_dict_post_hook
register_state_dict_pre_hook requires_grad_ set_extra_state set_submodule share_memory state_dict to
to_empty train training type xpu zero_grad
""".split())
NN_MODULE = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})


def model_base_lacks(base, name):
    """Whether `base`, an unread base class of a model, certainly has no attribute `name`: the `opaque_lacks`
    of drift.classes for model classes, whose one unread base is torch.nn.Module (NN_MODULE_API)."""
    return base in NN_MODULE and name not in NN_MODULE_API


def registry(index):
    """{architecture: (module, class)} read from the registry's dict literals."""
    package = index.tree.packages[0]
    module = index.tree.module(package + "." + REGISTRY_MODULE)
    if module is None or module.tree is None:
        return None, None
    entries = {}
    for node in walk(module.tree):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values):
            if (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Tuple)
                    and len(value.elts) == 2
                    and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts)):
                entries.setdefault(key.value, (value.elts[0].value, value.elts[1].value))
    return entries, module


def interface_checked(index, function):
    """The protocol class a `supports_x(model)` function tests with isinstance, or None."""
    params = function.node.args.posonlyargs + function.node.args.args
    if not params:
        return None
    for node in walk(function.node):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                and len(node.args) == 2 and isinstance(node.args[0], ast.Name)
                and node.args[0].id == params[0].arg and isinstance(node.args[1], (ast.Name, ast.Attribute))):
            found = index.resolve_in(function.module, node.args[1])
            if isinstance(found, ClassRef):
                return found
    return None


def protocol_members(index, protocol):
    """Names a runtime isinstance() check of `protocol` requires (its and its protocol bases' members)."""
    names = []
    for cls in info(index, protocol).classes():
        for node in cls.node.body:
            name = None
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = node.name
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                name = node.target.id
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
            if name and not (name.startswith("__") and name.endswith("__")) and name not in names:
                names.append(name)
    return names


def unimplemented_members(index, cls, protocol):
    """The members of `protocol` (a runtime-checkable Protocol class) that model class `cls` lacks: [] when
    `cls` implements it, by subclassing it or by defining every member itself."""
    if any(entry == protocol for entry in info(index, cls).classes()):
        return []
    missing = []
    for name in protocol_members(index, protocol):
        if isinstance(class_member(index, cls, name, opaque_lacks=lambda base, n: True), MissingRef):
            # No unread base (torch.nn.Module) can provide a member of a vLLM protocol.
            missing.append(name)
    return missing


def inner_class(index, cls, attribute):
    """The class of `self.<attribute>` as the model's own __init__ constructs it, or None."""
    for entry in info(index, cls).classes():
        for method in entry.node.body:
            if not isinstance(method, ast.FunctionDef) or not method.args.args:
                continue
            self_name = method.args.args[0].arg
            for node in walk(method):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Attribute) and node.targets[0].attr == attribute
                        and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == self_name):
                    return _constructed(index, cls, entry.module, node.value, self_name)
    return None


def _constructed(index, cls, module, value, self_name):
    """The class `value` (code in `module`, a method of `cls`) certainly constructs, or None.

    `Class(...)`; `self.method(...)` whose every return constructs the same class;
    `self.model_cls(...)` where `model_cls` is a class attribute naming a class.
    Members are looked up on `cls`, the model class itself, so that subclasses' overrides count.
    """
    if not isinstance(value, ast.Call) or not isinstance(value.func, (ast.Name, ast.Attribute)):
        return None
    func = value.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == self_name):
        found = index.resolve_in(module, func)
        return found if isinstance(found, ClassRef) else None
    member = class_member(index, cls, func.attr)
    if isinstance(member, FunctionRef) and member.node.args.args:
        inner_self = member.node.args.args[0].arg
        returns = [n.value for n in walk(member.node) if isinstance(n, ast.Return) and n.value is not None]
        classes = [_constructed(index, cls, member.module, r, inner_self) for r in returns]
        if classes and all(c is not None and c == classes[0] for c in classes):
            return classes[0]
    if isinstance(member, ValueRef) and isinstance(getattr(member.node, "value", None), (ast.Name, ast.Attribute)):
        found = index.resolve_in(member.module, member.node.value)
        return found if isinstance(found, ClassRef) else None
    return None


class ModelUses:
    """What a consumer function does with the model it checks: attribute reads, objects it takes from it."""

    def __init__(self, function, model_name, consumer_tree):
        self.reads = []       # [(path tuple, attribute node)] e.g. (("model",), node)
        self.assigned = set()  # paths the consumer sets itself, e.g. ("model", "_extension")
        aliases = {model_name: ()}
        for node in walk(function):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name)
                    and node.value.value.id in aliases):
                aliases[node.targets[0].id] = aliases[node.value.value.id] + (node.value.attr,)
        for node in walk(function):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                path = aliases[node.value.id] + (node.attr,)
                if isinstance(node.ctx, ast.Store):
                    self.assigned.add(path)
                else:
                    self.reads.append((path, node))
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "MethodType"
                    and len(node.args) == 2 and isinstance(node.args[0], ast.Name)
                    and isinstance(node.args[1], ast.Name) and node.args[1].id in aliases):
                bound = _module_function(consumer_tree, node.args[0].id)
                if bound is not None and bound.args.args:
                    self_name = bound.args.args[0].arg
                    prefix = aliases[node.args[1].id]
                    for inner in walk(bound):
                        if (isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name)
                                and inner.value.id == self_name):
                            path = prefix + (inner.attr,)
                            if isinstance(inner.ctx, ast.Store):
                                self.assigned.add(path)
                            else:
                                self.reads.append((path, inner))


def _module_function(tree, name):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _enclosing_function(tree, target):
    """The innermost function whose lines hold `target`."""
    best = None
    for node in walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.lineno <= target.lineno <= node.end_lineno
                and (best is None or node.lineno >= best.lineno)):
            best = node
    return best


def check_model(analysis, model):
    index = analysis.provider
    config = model.get("config") or {}
    custom = [name for name, content in (("config.json", config),
                                         ("tokenizer_config.json", model.get("tokenizer_config") or {}))
              if content.get("auto_map")]
    if custom:
        _check_trust_remote_code(analysis, custom)
    architectures = config.get("architectures") or []
    if not architectures:
        return
    entries, registry_module = registry(index)
    for consumer in analysis.modules:
        for use in consumer.calls:
            if not isinstance(use.target, FunctionRef) or not use.node.args:
                continue
            protocol = interface_checked(index, use.target)
            if protocol is None:
                continue
            for architecture in architectures:
                cls = _model_class(analysis, consumer, use, entries, registry_module, architecture)
                if cls is not None:
                    _check_class(analysis, consumer, use, protocol, cls)


def _model_class(analysis, consumer, use, entries, registry_module, architecture):
    index = analysis.provider
    if entries is None:
        analysis.skip(consumer.module, use.node, architecture, "the provider has no model registry to read")
        return None
    if architecture not in entries:
        analysis.skip(consumer.module, use.node, architecture, "vLLM's registry does not list this architecture")
        return None
    module_name, class_name = entries[architecture]
    found = index.lookup(registry_module.package + "." + module_name, class_name)
    if not isinstance(found, ClassRef):
        analysis.skip(consumer.module, use.node, architecture,
                      "registry names %s.%s, which was not found" % (module_name, class_name))
        return None
    return found


def _check_class(analysis, consumer, use, protocol, cls):
    index = analysis.provider
    location = F.Location(consumer.module, use.node.lineno)
    provider = F.Location.of(cls.module, cls.node)
    missing = unimplemented_members(index, cls, protocol)
    if missing:
        analysis.add(F.ModelInterface(consumer=location, callee=cls.dotted, detail=protocol.qualname,
                                      provider=provider, missing_members=missing,
                                      checked_by="%s()" % use.target.qualname))
    argument = use.node.args[0]
    function = _enclosing_function(consumer.module.tree, use.node)
    if function is None or not isinstance(argument, ast.Name):
        return
    uses = ModelUses(function, argument.id, consumer.module.tree)
    classes = {(): cls}
    for path, node in sorted(uses.reads, key=lambda item: len(item[0])):
        if path in uses.assigned or path[:-1] not in classes:
            continue
        owner = classes[path[:-1]]
        if owner is None:
            continue
        found = instance_member(index, owner, path[-1], opaque_lacks=model_base_lacks)
        if isinstance(found, MissingRef):
            analysis.add(F.ModelAttribute(consumer=F.Location(consumer.module, node.lineno), callee=cls.dotted,
                                          detail=".".join(path), provider=F.Location.of(owner.module, owner.node)))
            classes[path] = None
        elif path not in classes:
            classes[path] = inner_class(index, owner, path[-1])
            if classes[path] is None and any(p[:len(path)] == path and len(p) > len(path) for p, _ in uses.reads):
                analysis.skip(consumer.module, node, "%s.%s" % (cls.dotted, ".".join(path)),
                              "the model's source does not construct it from a class that can be read")


def _loader_name(analysis, use):
    """(callee, display name) when `use` calls something that loads the model directory, else None.

    That is a Hugging Face Auto* loader, or a provider callable taking `trust_remote_code`
    (vLLM's ModelConfig): either runs the directory's custom code only when trusted.
    """
    if isinstance(use.target, ExternalRef):
        if re.match(HF_LOADER, use.target.dotted):  # compiled (and cached by re) for a model with custom code only
            return use.target.dotted, ".".join(use.target.dotted.split(".")[-2:])
        return None
    try:
        signature = analysis.signature_for(use.target)
    except Unchecked:
        return None
    if signature is None or signature.parameter("trust_remote_code") is None:
        return None
    return signature.callee, signature.callee.rpartition(".")[2]


def _check_trust_remote_code(analysis, custom):
    for consumer in analysis.modules:
        for use in consumer.calls:
            loader = _loader_name(analysis, use)
            if loader is None:
                continue
            callee, display = loader
            call = use.node
            if isinstance(use.target, ExternalRef) and call.args and isinstance(call.args[0], ast.Constant):
                continue  # a hub id written in the code, not the model directory
            if any(k.arg is None for k in call.keywords):
                analysis.skip(consumer.module, call, callee, "keyword arguments passed with **")
                continue
            trust = next((k.value for k in call.keywords if k.arg == "trust_remote_code"), None)
            if trust is not None and not isinstance(trust, ast.Constant):
                analysis.skip(consumer.module, call, callee, "trust_remote_code is computed")
                continue
            if trust is None or trust.value is not True:
                analysis.add(F.TrustRemoteCode(consumer=F.Location(consumer.module, call.lineno),
                                               callee=callee, detail=consumer.module.name,
                                               loaded=" and ".join(custom), display=display))
