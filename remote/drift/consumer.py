"""What a consumer module touches in the provider: imports, calls, attribute reads.

Values are tracked only as far as the consumer's own code makes them certain:
a name bound by an import, a local or `self.<attr>` assigned exactly from a
provider constructor call (`self.scheduler = Scheduler(...)`). Anything else
is unknown and never reported on.
"""
from __future__ import annotations

from drift import syntax as ast
from drift.classes import instance_member
from drift.records import record
from drift.refs import ClassRef, ExternalRef, FunctionRef, ModuleRef, Ref
from drift.symbols import absolute_module, assignment_targets
from drift.syntax import children, walk


@record
class Instance:
    """An object certainly of provider class `cls`."""

    cls: ClassRef


@record
class BoundMethod:
    """`instance.method`: calls bind the method's first parameter."""

    function: FunctionRef
    cls: ClassRef


@record
class SelfOf:
    """`self` inside a method of the consumer's class `node`."""

    node: ast.ClassDef


@record
class ImportUse:
    node: ast.Import | ast.ImportFrom
    #: What the statement imports: "pkg.mod" or "pkg.mod.name".
    dotted: str
    ref: Ref
    #: Inside `try: ... except ImportError` or `if TYPE_CHECKING:`: absence is handled.
    guarded: bool


@record
class CallUse:
    node: ast.Call
    #: A provider Ref (function, class), a BoundMethod, or an ExternalRef.
    target: Ref | BoundMethod
    #: `functools.partial(target, ...)`: the arguments after the first are bound now, the rest at the call.
    partial: bool = False


@record
class AttributeUse:
    node: ast.Attribute
    #: The value the attribute is read from (ModuleRef, ClassRef or Instance).
    base: Ref | Instance
    ref: Ref


#: The nodes that are statements or hold them (an except clause, a match's case): the only nodes an
#: import can be in or under (match_case: Python 3.10 and later).
_STATEMENT_NODES = tuple(getattr(ast, name) for name in ("stmt", "excepthandler", "match_case") if hasattr(ast, name))
#: The nodes that open a scope of their own.
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
#: The nodes ConsumerModule._walk_scope looks at, and those Context._collect_locals binds names by.
_WALKED = _SCOPES + (ast.Call, ast.Attribute)
_BINDERS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Assign,
            ast.NamedExpr, ast.Global, ast.Nonlocal)
#: A call of it binds its first argument's callable to the arguments that follow (CallUse.partial).
PARTIAL = ExternalRef("functools.partial")
#: What an `except` clause catching these names also catches.
BROADER_ERRORS = {"ModuleNotFoundError": ("ImportError",), "ImportError": (), "TypeError": (), "AttributeError": ()}


def _handles(handler, error):
    """True when `handler` catches `error` (by name, a base of it, Exception or a bare except)."""
    if handler.type is None:
        return True
    caught = {error, "Exception", "BaseException"} | set(BROADER_ERRORS.get(error, ()))
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in caught for t in types)


def _handles_import_error(handler):
    # Lenient on purpose: `except ModuleNotFoundError` around a missing *name* still signals that the
    # consumer expects the import may fail.
    return _handles(handler, "ImportError") or _handles(handler, "ModuleNotFoundError")


class ConsumerModule:
    """One consumer module read against the provider; `through`: [(Index, names of its modules that import
    the provider)] of the consumers it may reach the provider through (specrig's driver takes vLLM's
    LoadConfig from speculators' module)."""

    def __init__(self, module, consumer_index, provider_index, through=()):
        self.module = module
        self.consumer_index = consumer_index
        self.provider = provider_index
        self.through = through
        self.imports = []
        self.calls = []
        self.attributes = []
        self._values = {}
        self._self_attributes = {}
        self._self_assignment_index = {}
        self._contexts = {}
        #: {id(scope node): _scope_nodes(it) as a list}: a function's scope is read for its names
        #: (Context) and then walked, a method's again for `self.<attr>`.
        self._scope_nodes = {}
        self._hasattr = set()
        self._type_error_guarded = set()
        self._attribute_error_guarded = set()
        self.touches_provider = False
        #: Every node of the module, in ast.walk's order (the rules read them too).
        self.nodes = list(walk(module.tree)) if module.tree is not None else []
        if module.tree is not None:
            self._collect_imports(module.tree, guarded=False)
            self._collect_hasattr()

    # ---- imports ----------------------------------------------------------------------------

    def translate(self, ref):
        """Map a consumer-side reference to a provider object into the provider's index, also where a
        consumer it goes through binds the name to one (a name of that consumer's own stays external)."""
        if isinstance(ref, ExternalRef):
            if self.provider.tree.owns(ref.dotted):
                return self.provider.resolve_dotted(ref.dotted)
            index = self._through(ref.dotted)
            if index is not None:
                found = index.resolve_dotted(ref.dotted)
                return self.translate(found) if isinstance(found, ExternalRef) else ref
        return ref

    def provider_value(self, ref):
        """`ref` when it is a provider object or external; None for the consumer's own objects."""
        module = getattr(ref, "module", None)
        if isinstance(ref, ModuleRef):
            return ref if self.provider.tree.owns(ref.name) else None
        if module is not None and not self.provider.tree.owns(module.name):
            return None
        return ref

    def _collect_imports(self, node, guarded):
        for child in children(node):
            if not isinstance(child, _STATEMENT_NODES):
                continue  # an expression: it holds no import
            if isinstance(child, ast.Try):
                handles = any(_handles_import_error(h) for h in child.handlers)
                before = len(self.imports)
                for statement in child.body:
                    self._collect_imports_in(statement, guarded or handles)
                # Alternatives (`try: from a import x` / `except ImportError: from b import x`): a handler
                # runs only where an import of the body fails, so when all of them resolve here, its own
                # imports are not run on this provider; where one fails, they are what runs.
                tried = self.imports[before:]
                resolved = bool(tried) and all(use.ref.exists for use in tried)
                for handler in child.handlers:
                    self._collect_imports_in(handler, guarded or (resolved and _handles_import_error(handler)))
                for part in child.orelse + child.finalbody:
                    self._collect_imports_in(part, guarded)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.body:
                    self._collect_imports_in(statement, True)
                for statement in child.orelse:
                    self._collect_imports_in(statement, guarded)
            else:
                self._collect_imports_in(child, guarded)

    def _collect_imports_in(self, node, guarded):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if self.provider.tree.owns(alias.name):
                    self.touches_provider = True
                    self.imports.append(ImportUse(node, alias.name, self.provider.resolve_module(alias.name),
                                                  guarded))
                elif self._through(alias.name) is not None:
                    self.touches_provider = True  # it may reach the provider through that consumer
        elif isinstance(node, ast.ImportFrom):
            source = absolute_module(self.module.package, node.level, node.module)
            if self._through(source) is not None:
                self.touches_provider = True
            elif self.provider.tree.owns(source):
                self.touches_provider = True
                module_ref = self.provider.resolve_module(source)
                if not isinstance(module_ref, ModuleRef):
                    self.imports.append(ImportUse(node, source, module_ref, guarded))
                    return
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    ref = self.provider.lookup(source, alias.name)
                    self.imports.append(ImportUse(node, source + "." + alias.name, ref, guarded))
        else:
            self._collect_imports(node, guarded)

    def _through(self, dotted):
        """The Index of the consumer one of whose modules importing the provider `dotted` is or is in, or None."""
        for index, modules in self.through:
            if any(dotted == module or dotted.startswith(module + ".") for module in modules):
                return index
        return None

    def _collect_hasattr(self):
        for node in self.nodes:
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr"
                    and len(node.args) == 2 and isinstance(node.args[1], ast.Constant)):
                self._hasattr.add((ast.shape(node.args[0]), node.args[1].value))
            elif isinstance(node, ast.Try):
                for error, guarded in (("TypeError", self._type_error_guarded),
                                       ("AttributeError", self._attribute_error_guarded)):
                    if any(_handles(h, error) for h in node.handlers):
                        guarded.update(id(n) for statement in node.body for n in walk(statement))

    def guarded_attribute(self, node):
        """True when the code expects the attribute may be absent: `hasattr(<same object>, "<attr>")`
        somewhere, or the read sits in `try: ... except AttributeError`."""
        return (ast.shape(node.value), node.attr) in self._hasattr or id(node) in self._attribute_error_guarded

    def guarded_call(self, node):
        """True when the call sits in `try: ... except TypeError`: the consumer copes with a mismatch."""
        return id(node) in self._type_error_guarded

    # ---- scopes -----------------------------------------------------------------------------

    def walk(self):
        """Evaluate every call and attribute read of the module; fills calls/attributes."""
        if self.module.tree is None:
            return
        top = Context(self, None, self.module.tree, None)
        self._walk_scope(self.module.tree, top, None)

    def _walk_scope(self, scope_node, context, class_node):
        for node in self.scope_nodes(scope_node):
            if not isinstance(node, _WALKED):
                continue  # most nodes: one check, not one per kind below
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                self_class = class_node if (class_node is not None and _is_instance_method(node)) else None
                self._walk_scope(node, Context(self, context, node, self_class), None)
            elif isinstance(node, ast.ClassDef):
                self._walk_scope(node, context, node)
            elif isinstance(node, ast.Call):
                target = context.evaluate(node.func)
                partial = target == PARTIAL and bool(node.args)
                if partial:
                    target = context.evaluate(node.args[0])
                if target is not None:
                    self.calls.append(CallUse(node, target, partial))
                context.evaluate(node)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                context.evaluate(node)

    def scope_nodes(self, scope_node):
        """The nodes of one scope (_scope_nodes), listed once."""
        key = id(scope_node)
        if key not in self._scope_nodes:
            self._scope_nodes[key] = _scope_nodes(scope_node)
        return self._scope_nodes[key]

    def record_attribute(self, node, base, ref):
        if id(node) not in self._values:
            self.attributes.append(AttributeUse(node, base, ref))

    def self_attribute(self, class_node, attr):
        """The certain value of `self.<attr>` in consumer class `class_node`, or None."""
        key = (id(class_node), attr)
        if key in self._self_attributes:
            return self._self_attributes[key]
        self._self_attributes[key] = None  # assignments that refer to themselves stay unknown
        values = [self._context_of(method, class_node).evaluate(value) if value is not None else None
                  for method, value in self._self_assignments(class_node).get(attr, ())]
        result = None
        if values and all(isinstance(v, Instance) for v in values) and len({id(v.cls.node) for v in values}) == 1:
            result = values[0]
        self._self_attributes[key] = result
        return result

    def _self_assignments(self, class_node):
        """{attr: [(method, assigned value or None when not a single plain assignment)]} of
        `self.<attr> = ...` in the class's instance methods, from one walk per class."""
        key = id(class_node)
        if key not in self._self_assignment_index:
            index = {}
            for method in class_node.body:
                if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not _is_instance_method(method):
                    continue
                self_name = method.args.args[0].arg
                for node in walk(method):
                    if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                        continue
                    for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                        single = isinstance(node, ast.Assign) and isinstance(target, ast.Attribute)
                        for element in assignment_targets(target):
                            if (isinstance(element, ast.Attribute) and isinstance(element.value, ast.Name)
                                    and element.value.id == self_name):
                                index.setdefault(element.attr, []).append(
                                    (method, node.value if single else None))
            self._self_assignment_index[key] = index
        return self._self_assignment_index[key]

    def _context_of(self, function, class_node):
        key = id(function)
        if key not in self._contexts:
            top = Context(self, None, self.module.tree, None)
            self._contexts[key] = Context(self, top, function, class_node)
        return self._contexts[key]


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_instance_method(node):
    if isinstance(node, ast.Lambda) or not node.args.args:
        return False
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Name) and decorator.id in ("staticmethod", "classmethod"):
            return False
    return True


def _scope_nodes(scope_node):
    """Nodes of one scope in source order, nested function and class bodies listed but not entered."""
    found = []
    stack = _children(scope_node)
    stack.reverse()
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, _SCOPES):
            # Decorators, defaults and bases are evaluated in the enclosing scope.
            inner = list(getattr(node, "decorator_list", []))
            if isinstance(node, ast.ClassDef):
                inner += node.bases + [k.value for k in node.keywords]
            else:
                inner += node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
        else:
            inner = children(node)
        inner.reverse()
        stack += inner
    return found


def _children(scope_node):
    if isinstance(scope_node, ast.Lambda):
        return [scope_node.body]
    return list(scope_node.body)


class Context:
    """One scope (module, function or lambda) of a consumer module: what its names certainly are."""

    def __init__(self, consumer, parent, node, self_class):
        self.consumer = consumer
        self.parent = parent
        self.node = node
        self.self_class = self_class
        self.bindings = {}
        self._evaluating = set()
        self.is_module = isinstance(node, ast.Module)
        if not self.is_module:
            self._collect_locals()

    def _collect_locals(self):
        args = self.node.args
        params = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
        for index, arg in enumerate(params):
            value = ("self",) if (index == 0 and self.self_class is not None) else ("unknown",)
            self.bindings.setdefault(arg.arg, []).append(value)
        handled = set()  # Name targets already bound by their Assign/NamedExpr
        for node in self.consumer.scope_nodes(self.node):
            if isinstance(node, ast.Name):  # the commonest node by far
                if isinstance(node.ctx, (ast.Store, ast.Del)) and id(node) not in handled:
                    self.bindings.setdefault(node.id, []).append(("unknown",))
                continue
            if not isinstance(node, _BINDERS):
                continue  # most other nodes: one check, not one per kind below
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bindings.setdefault(node.name, []).append(("unknown",))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    name = alias.asname or alias.name.partition(".")[0]
                    self.bindings.setdefault(name, []).append(("import", node, alias))
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    simple = isinstance(target, ast.Name)
                    for element in assignment_targets(target):
                        if isinstance(element, ast.Name):
                            handled.add(id(element))
                            value = ("expr", node.value) if simple else ("unknown",)
                            self.bindings.setdefault(element.id, []).append(value)
            elif isinstance(node, ast.NamedExpr):
                handled.add(id(node.target))
                self.bindings.setdefault(node.target.id, []).append(("expr", node.value))
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                for name in node.names:
                    self.bindings[name] = [("outer",)]

    def lookup(self, name):
        if self.is_module:
            consumer = self.consumer
            scope = consumer.consumer_index.scope(consumer.module.name)
            if name in scope.bindings:
                return consumer.provider_value(consumer.translate(consumer.consumer_index.lookup(
                    consumer.module.name, name)))
            for star in scope.stars:  # `from vllm.x import *` in the consumer
                if consumer.provider.tree.owns(star) and name in consumer.provider.star_exports(star, set()):
                    return consumer.provider.lookup(star, name)
            return None
        values = self.bindings.get(name)
        if values is None or values == [("outer",)]:
            return self.parent.lookup(name) if self.parent is not None else None
        if len(values) != 1:
            # Assigned more than once (or also a parameter): which value holds is flow-dependent.
            return None
        value = values[0]
        if value[0] == "self":
            return SelfOf(self.self_class)
        if value[0] == "import":
            return self._import_value(value[1], value[2])
        if value[0] == "expr":
            key = ("name", name)
            if key in self._evaluating:
                return None
            self._evaluating.add(key)
            try:
                return self.evaluate(value[1])
            finally:
                self._evaluating.discard(key)
        return None

    def _import_value(self, node, alias):
        consumer = self.consumer
        if isinstance(node, ast.Import):
            dotted = alias.name if alias.asname else alias.name.partition(".")[0]
            return consumer.translate(ExternalRef(dotted))
        source = absolute_module(consumer.module.package, node.level, node.module)
        if consumer.provider.tree.owns(source):
            return consumer.provider.lookup(source, alias.name) \
                if isinstance(consumer.provider.resolve_module(source), ModuleRef) else None
        if consumer.consumer_index.tree.owns(source):
            return consumer.provider_value(consumer.translate(consumer.consumer_index.lookup(source, alias.name)))
        return consumer.translate(ExternalRef(source + "." + alias.name))

    def evaluate(self, expr):
        key = id(expr)
        if key in self.consumer._values:
            return self.consumer._values[key]
        value = self._evaluate(expr)
        self.consumer._values[key] = value
        return value

    def _evaluate(self, expr):
        consumer = self.consumer
        if isinstance(expr, ast.Name):
            return self.lookup(expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.evaluate(expr.value)
            if base is None:
                return None
            if isinstance(base, SelfOf):
                return consumer.self_attribute(base.node, expr.attr)
            if isinstance(base, ExternalRef):
                return consumer.translate(ExternalRef(base.dotted + "." + expr.attr))
            if isinstance(base, (ModuleRef, ClassRef)):
                ref = consumer.provider.attribute(base, expr.attr)
                consumer.record_attribute(expr, base, ref)
                return ref
            if isinstance(base, Instance):
                ref = instance_member(consumer.provider, base.cls, expr.attr)
                consumer.record_attribute(expr, base, ref)
                if isinstance(ref, FunctionRef):
                    return BoundMethod(ref, base.cls)
                return None
            return None
        if isinstance(expr, ast.Call):
            target = self.evaluate(expr.func)
            if isinstance(target, ClassRef):
                return Instance(target)
            return None
        if isinstance(expr, ast.NamedExpr):
            return self.evaluate(expr.value)
        return None

