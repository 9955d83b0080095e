"""Classes read from source: bases across modules, MRO, class and instance members."""
from __future__ import annotations

from drift import syntax as ast
from drift.parts import unparsed_text
from drift.records import record
from drift.refs import ClassRef, ExternalRef, FunctionRef, MaybeRef, MissingRef, Ref, UnknownRef, ValueRef
from drift.syntax import walk

#: Bases that add no attributes a caller could use and take no constructor arguments.
INERT_BASES = frozenset({
    "builtins.object", "abc.ABC", "typing.Protocol", "typing_extensions.Protocol", "typing.Generic",
    "typing_extensions.Generic",
})
#: Metaclasses that change neither construction nor attribute lookup.
INERT_METACLASSES = frozenset({"abc.ABCMeta", "builtins.type"})


@record
class ClassInfo:
    """The linearized MRO of one class, and its metaclass."""

    #: The class first, then ClassRefs of readable classes and ExternalRef/UnknownRef for bases
    #: that cannot be read (inert ones left out).
    mro: list[Ref]
    #: A metaclass that may change construction or attribute lookup, else None.
    metaclass: Ref | None = None

    def classes(self):
        return [entry for entry in self.mro if isinstance(entry, ClassRef)]


def _read_class_info(index, cls):
    bases = []
    for base in cls.node.bases:
        ref = index.resolve_in(cls.module, base) if _is_name_chain(base) else UnknownRef("<base>", "computed base")
        if isinstance(ref, ExternalRef) and ref.dotted in INERT_BASES:
            continue
        bases.append(ref)
    metaclass = None
    for keyword in cls.node.keywords:
        if keyword.arg == "metaclass":
            ref = index.resolve_in(cls.module, keyword.value) if _is_name_chain(keyword.value) else None
            if not (isinstance(ref, ExternalRef) and ref.dotted in INERT_METACLASSES):
                metaclass = ref or UnknownRef("<metaclass>", "computed metaclass")
    return ClassInfo(mro=[cls] + _merge([_mro_of(index, base) for base in bases] + [list(bases)]),
                     metaclass=metaclass)


def _is_name_chain(expr):
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    if isinstance(expr, ast.Subscript):
        return _is_name_chain(expr.value)
    return isinstance(expr, ast.Name)


def _key(entry):
    return id(entry.node) if isinstance(entry, ClassRef) else ("ext", entry.dotted)


def _mro_of(index, base):
    if isinstance(base, ClassRef):
        return list(info(index, base).mro)
    return [base]


def _merge(sequences):
    """C3 linearization; falls back to depth-first order when the hierarchy is inconsistent."""
    pending = [list(seq) for seq in sequences if seq]
    result = []
    while pending:
        for seq in pending:
            head = seq[0]
            if not any(_key(head) in [_key(e) for e in other[1:]] for other in pending):
                break
        else:
            seen = {_key(e) for e in result}
            for seq in pending:
                for entry in seq:
                    if _key(entry) not in seen:
                        seen.add(_key(entry))
                        result.append(entry)
            return result
        result.append(head)
        pending = [[e for e in seq if _key(e) != _key(head)] for seq in pending]
        pending = [seq for seq in pending if seq]
    return result


def info(index, cls):
    cache = index.class_infos
    key = id(cls.node)
    if key not in cache:
        cache[key] = None  # a class inheriting from itself through a cycle sees no bases
        cache[key] = _read_class_info(index, cls)
    return cache[key] or ClassInfo(mro=[cls])


def body_statements(body):
    """Statements of a class body, looking into if/try blocks."""
    for node in body:
        if isinstance(node, ast.If):
            yield from body_statements(node.body)
            yield from body_statements(node.orelse)
        elif isinstance(node, ast.Try):
            yield from body_statements(node.body)
            for handler in node.handlers:
                yield from body_statements(handler.body)
            yield from body_statements(node.orelse)
        else:
            yield node


def own_member(cls, name):
    """The statement in `cls`'s own body defining `name` as a class attribute, or None."""
    found = None
    for node in body_statements(cls.node.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            if not _is_overload(node) or found is None:
                found = node
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                found = node
        elif isinstance(node, ast.AnnAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name:
                found = node
    return found


def _is_overload(node):
    return any((isinstance(d, ast.Name) and d.id == "overload")
               or (isinstance(d, ast.Attribute) and d.attr == "overload") for d in node.decorator_list)


def member_ref(cls, node):
    if isinstance(node, ast.ClassDef):
        return ClassRef(cls.module, node, cls.qualname + "." + node.name)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return FunctionRef(cls.module, node, cls.qualname + "." + node.name, owner=cls)
    name = node.targets[0].id if isinstance(node, ast.Assign) else node.target.id
    return ValueRef(cls.module, node, cls.dotted + "." + name)


def class_member(index, cls, name, opaque_lacks=None):
    """`cls.name` looked up through the MRO.

    An unread base makes the answer unknown, unless `opaque_lacks(base dotted, name)`
    says that base certainly has no such attribute.
    """
    class_info = info(index, cls)
    for entry in class_info.mro:
        if isinstance(entry, ClassRef):
            node = own_member(entry, name)
            if node is not None:
                return member_ref(entry, node)
        elif opaque_lacks is not None and opaque_lacks(entry.dotted, name):
            continue
        else:
            return UnknownRef(cls.dotted + "." + name, "%s inherits from %s, which is not read" % (
                cls.qualname, entry.dotted))
    if class_info.metaclass is not None:
        return UnknownRef(cls.dotted + "." + name, "%s has a metaclass" % cls.qualname)
    return MissingRef(cls.dotted + "." + name)


def assigned_self_attributes(cls, name=None):
    """{name: first statement} of `self.<name> = ...` in any method of `cls`'s own body. With `name`, a
    method not parsed yet whose text names neither it nor setattr (ASCII text: a name is written as it
    is) is left unparsed, as it cannot assign it: `name`'s entry is the same."""
    found = {}
    for method in body_statements(cls.node.body):
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if name is not None:
            text = unparsed_text(method)
            if text is not None and text.isascii() and name not in text and "setattr" not in text:
                continue
        if not method.args.args:
            continue
        self_name = method.args.args[0].arg
        for node in walk(method):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                for attribute in _attribute_targets(target):
                    if isinstance(attribute.value, ast.Name) and attribute.value.id == self_name:
                        found.setdefault(attribute.attr, node)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
                    and node.args[0].id == self_name and isinstance(node.args[1], ast.Constant)
                    and isinstance(node.args[1].value, str)):
                found.setdefault(node.args[1].value, node)
    return found


def _attribute_targets(target):
    if isinstance(target, ast.Attribute):
        return [target]
    if isinstance(target, (ast.Tuple, ast.List)):
        result = []
        for element in target.elts:
            result.extend(_attribute_targets(element))
        return result
    return []


def instance_member(index, cls, name, opaque_lacks=None):
    """`instance.name` for an instance of `cls`: class members, then attributes its methods assign."""
    ref = class_member(index, cls, name, opaque_lacks)
    if not isinstance(ref, MissingRef):
        return ref
    for entry in info(index, cls).classes():
        node = assigned_self_attributes(entry, name).get(name)
        if node is not None:
            return ValueRef(entry.module, node, cls.dotted + "." + name)
    for hook in ("__getattr__", "__getattribute__"):
        found = class_member(index, cls, hook, opaque_lacks)
        if isinstance(found, FunctionRef):
            return MaybeRef(cls.module, cls.dotted + "." + name)
    return ref
