"""Name resolution across a package's modules without importing them.

What a dotted name refers to is found by reading module top levels: definitions,
assignments, imports (relative ones too), `from m import *` (with and without
`__all__`), package `__init__` re-export chains, and, as a last resort, a
module-level `__getattr__` that *may* provide any name.
"""
from __future__ import annotations

from drift import syntax as ast
from drift.classes import class_member
from drift.refs import ClassRef, ExternalRef, FunctionRef, MaybeRef, MissingRef, ModuleRef, UnknownRef, ValueRef


class Binding:
    """One top-level statement binding a name: `kind` is def, module, from, value.

    A plain class with slots, not a record: a verify makes a thousand (every top-level name of every
    module read), and a record's construction (its instance dict filled) costs six times as much.
    Nothing compares or hashes bindings, nor changes one once made."""

    __slots__ = ("kind", "node", "target", "conditional")

    def __init__(self, kind, node, target=None, conditional=False):
        self.kind = kind
        self.node = node
        #: module dotted name (kind "module"), (module, name) (kind "from"), value node (kind "value").
        self.target = target
        #: Bound in an `except` handler: a fallback, not the normal binding.
        self.conditional = conditional

    def __repr__(self):
        return "Binding(kind=%r, node=%r, target=%r, conditional=%r)" % (self.kind, self.node, self.target,
                                                                       self.conditional)


def absolute_module(package, level, module):
    """The absolute dotted name of `from <level dots><module> import ...` inside `package`."""
    if level == 0:
        return module or ""
    parts = package.split(".") if package else []
    if level > 1:
        parts = parts[:len(parts) - (level - 1)]
    base = ".".join(parts)
    if module:
        return base + "." + module if base else module
    return base


class Scope:
    """The top-level bindings of one module (statements under if/try/with included)."""

    def __init__(self, module):
        self.module = module
        self.bindings = {}
        self.stars = []
        #: Literal __all__ entries and the modules whose __all__ is added to it.
        self.all_names = None
        self.all_from = []
        self.all_dynamic = False
        self.has_getattr = False
        if module is not None and module.tree is not None:
            self._collect(module.tree.body, conditional=False)

    def _bind(self, name, binding):
        self.bindings.setdefault(name, []).append(binding)

    def _collect(self, body, conditional):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._bind(node.name, Binding("def", node, None, conditional))
                if node.name == "__getattr__" and not isinstance(node, ast.ClassDef):
                    self.has_getattr = True
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self._bind(alias.asname, Binding("module", node, alias.name, conditional))
                    else:
                        top = alias.name.partition(".")[0]
                        self._bind(top, Binding("module", node, top, conditional))
            elif isinstance(node, ast.ImportFrom):
                source = absolute_module(self.module.package, node.level, node.module)
                for alias in node.names:
                    if alias.name == "*":
                        self.stars.append(source)
                    else:
                        self._bind(alias.asname or alias.name,
                                   Binding("from", node, (source, alias.name), conditional))
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in _target_names(target):
                        if name == "__all__":
                            self._collect_all(node)
                        else:
                            self._bind(name, Binding("value", node, node.value, conditional))
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                self._collect_all_call(node.value)
            elif isinstance(node, ast.If):
                self._collect(node.body, conditional)
                self._collect(node.orelse, conditional)
            elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
                self._collect(node.body, conditional)
                for handler in node.handlers:
                    self._collect(handler.body, True)
                self._collect(node.orelse, conditional)
                self._collect(node.finalbody, conditional)
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                self._collect(node.body, conditional)
                if isinstance(node, ast.For):
                    for name in _target_names(node.target):
                        self._bind(name, Binding("value", node, None, conditional))

    def _collect_all(self, node):
        value = node.value
        if value is None:
            return
        if isinstance(node, ast.Assign) or isinstance(node, ast.AnnAssign):
            self.all_names = []
        if self.all_names is None:
            self.all_names = []
        self._add_all_expr(value)

    def _add_all_expr(self, value):
        if isinstance(value, (ast.List, ast.Tuple)):
            for element in value.elts:
                if isinstance(element, ast.Constant) and isinstance(element.value, str):
                    self.all_names.append(element.value)
                else:
                    self.all_dynamic = True
        elif isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
            self._add_all_expr(value.left)
            self._add_all_expr(value.right)
        elif isinstance(value, ast.Attribute) and value.attr == "__all__":
            self.all_from.append(value.value)
        else:
            self.all_dynamic = True

    def _collect_all_call(self, call):
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id == "__all__"):
            return
        if self.all_names is None:
            self.all_names = []
        if func.attr == "extend" and call.args:
            self._add_all_expr(call.args[0])
        elif func.attr == "append" and call.args:
            self._add_all_expr(ast.List(elts=[call.args[0]], ctx=ast.Load()))
        else:
            self.all_dynamic = True

    def public_names(self):
        return [name for name in self.bindings if not name.startswith("_")]


def assignment_targets(target):
    """The single targets of an assignment target: `a, (b, *c) = ...` gives a, b, c."""
    if isinstance(target, (ast.Tuple, ast.List)):
        result = []
        for element in target.elts:
            result.extend(assignment_targets(element))
        return result
    if isinstance(target, ast.Starred):
        return assignment_targets(target.value)
    return [target]


def _target_names(target):
    return [node.id for node in assignment_targets(target) if isinstance(node, ast.Name)]


def preferred(bindings):
    """The binding that holds at run time in the normal case: the last one outside `except` handlers."""
    normal = [b for b in bindings if not b.conditional]
    return (normal or bindings)[-1]


class Index:
    """Resolves dotted names in one SourceTree."""

    def __init__(self, tree):
        self.tree = tree
        self._scopes = {}
        #: ClassInfo per class node id, filled by drift.classes.
        self.class_infos = {}

    def scope(self, dotted):
        if dotted not in self._scopes:
            self._scopes[dotted] = Scope(self.tree.module(dotted))
        return self._scopes[dotted]

    def resolve_module(self, dotted):
        """The module `dotted`, or MissingRef/ExternalRef."""
        if not self.tree.owns(dotted):
            return ExternalRef(dotted)
        if self.tree.exists(dotted):
            return ModuleRef(dotted)
        # Not even a parent's module-level __getattr__ makes `import a.b` work.
        return MissingRef(dotted)

    def resolve_dotted(self, dotted):
        """Resolve a full dotted path: the longest existing module prefix, then attributes."""
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            module_name = ".".join(parts[:cut])
            ref = self.resolve_module(module_name)
            if isinstance(ref, ExternalRef):
                return ExternalRef(dotted)
            if isinstance(ref, ModuleRef):
                for attr in parts[cut:]:
                    ref = self.attribute(ref, attr)
                return ref
        return MissingRef(dotted)

    def lookup(self, module_name, name, _seen=None):
        """What `name` is in module `module_name` (as `from module_name import name` would see it)."""
        seen = _seen if _seen is not None else set()
        key = (module_name, name)
        if key in seen:
            return UnknownRef(module_name + "." + name, "circular re-export")
        seen.add(key)
        module = self.tree.module(module_name)
        dotted = module_name + "." + name
        if module is not None and module.tree is None:
            return UnknownRef(dotted, "%s could not be parsed by this Python" % module.relpath)
        scope = self.scope(module_name)
        if name in scope.bindings:
            return self._resolve_binding(scope, name, preferred(scope.bindings[name]), seen)
        for star in scope.stars:
            if not self.tree.owns(star):
                # The names an external module exports are unknown: it may provide this one.
                return UnknownRef(dotted, "may come from `from %s import *`" % star)
            if name in self.star_exports(star, set()):
                return self.lookup(star, name, seen)
        if self.tree.exists(dotted):
            return ModuleRef(dotted)
        if scope.has_getattr:
            return MaybeRef(module, dotted)
        return MissingRef(dotted)

    def star_exports(self, module_name, seen):
        """The names `from module_name import *` binds: __all__, or its public names (and theirs)."""
        if module_name in seen:
            return set()
        seen.add(module_name)
        scope = self.scope(module_name)
        if scope.all_names is not None and not scope.all_dynamic:
            names = set(scope.all_names)
            for part in scope.all_from:
                ref = self._resolve_expression(scope, part)
                if isinstance(ref, ModuleRef):
                    names |= self.star_exports(ref.name, seen)
            return names
        names = set(scope.public_names())
        for star in scope.stars:
            if self.tree.owns(star):
                names |= {n for n in self.star_exports(star, seen) if not n.startswith("_")}
        return names

    def _resolve_binding(self, scope, name, binding, seen):
        module = scope.module
        if binding.kind == "def":
            node = binding.node
            if isinstance(node, ast.ClassDef):
                return ClassRef(module, node, node.name)
            return FunctionRef(module, node, node.name)
        if binding.kind == "module":
            return self.resolve_module(binding.target)
        if binding.kind == "from":
            source, imported = binding.target
            if not self.tree.owns(source):
                return ExternalRef(source + "." + imported)
            found = self.lookup(source, imported, seen)
            if isinstance(found, (MissingRef, MaybeRef)) and self.tree.exists(source + "." + imported):
                return ModuleRef(source + "." + imported)
            return found
        value = binding.target
        if isinstance(value, (ast.Name, ast.Attribute)):
            alias = self._resolve_expression(scope, value, seen)
            if not isinstance(alias, (MissingRef, UnknownRef)):
                return alias
        return ValueRef(module, binding.node, module.name + "." + name)

    def _resolve_expression(self, scope, expr, seen=None):
        """A Name or Attribute chain evaluated in a module's top-level scope."""
        if isinstance(expr, ast.Name):
            if expr.id in scope.bindings or scope.stars:
                return self.lookup(scope.module.name, expr.id, set() if seen is None else seen)
            return ExternalRef("builtins." + expr.id)
        if isinstance(expr, ast.Attribute):
            base = self._resolve_expression(scope, expr.value, seen)
            return self.attribute(base, expr.attr)
        if isinstance(expr, ast.Subscript):
            return self._resolve_expression(scope, expr.value, seen)
        return UnknownRef("<expression>", "not a name")

    def resolve_in(self, module, expr):
        """Evaluate a Name/Attribute chain written in `module`'s top level (base classes, decorators)."""
        return self._resolve_expression(self.scope(module.name), expr)

    def attribute(self, ref, attr):
        """`ref.attr` for module and external references (classes: see classes.py)."""
        if isinstance(ref, ModuleRef):
            if self.tree.module(ref.name) is None and self.tree.is_namespace(ref.name):
                return self.resolve_module(ref.name + "." + attr)
            return self.lookup(ref.name, attr)
        if isinstance(ref, ExternalRef):
            return ExternalRef(ref.dotted + "." + attr)
        if isinstance(ref, (MissingRef, MaybeRef, UnknownRef)):
            return UnknownRef(ref.dotted + "." + attr, "base is not known")
        if isinstance(ref, ClassRef):
            return class_member(self, ref, attr)
        return UnknownRef(getattr(ref, "dotted", "?") + "." + attr, "value of unknown type")
