"""Call signatures read from source, and binding a call's arguments to them.

A signature comes from a `def` (decorators permitting), from a class's
`__init__` found through its MRO, or is synthesized for dataclasses the way
`dataclasses` and pydantic do it: fields in MRO order, ClassVar left out,
InitVar kept, `field(init=False)` left out, `kw_only`, `KW_ONLY`, defaults from
`= value`, `field(default=/default_factory=)` and pydantic `Field(default)`.
Class decorators count as dataclass makers when they are `dataclass` itself or
a function marked `@dataclass_transform` / calling `dataclass` (vLLM's `@config`).
"""
from __future__ import annotations

import sys

from drift import syntax as ast
from drift.classes import body_statements, info, own_member
from drift.records import record, replace
from drift.refs import ClassRef, ExternalRef, FunctionRef
from drift.source import Module
from drift.syntax import walk

POSITIONAL_ONLY = "positional-only"
POSITIONAL_OR_KEYWORD = "positional-or-keyword"
VAR_POSITIONAL = "var-positional"
KEYWORD_ONLY = "keyword-only"
VAR_KEYWORD = "var-keyword"

DATACLASS_MAKERS = frozenset({"dataclasses.dataclass", "pydantic.dataclasses.dataclass"})
DATACLASS_TRANSFORM = frozenset({"typing.dataclass_transform", "typing_extensions.dataclass_transform"})
FIELD_SPECIFIERS = frozenset({"dataclasses.field", "pydantic.Field", "pydantic.fields.Field", "msgspec.field"})
#: External bases whose subclasses get a dataclass-like __init__ from their annotated fields.
STRUCT_BASES = frozenset({"msgspec.Struct"})
#: Decorators that leave a function's parameters as they are.
TRANSPARENT_DECORATORS = frozenset({
    "builtins.staticmethod", "builtins.classmethod", "builtins.property", "functools.cached_property",
    "functools.cache", "functools.lru_cache", "functools.wraps", "abc.abstractmethod", "typing.overload",
    "typing.override", "typing_extensions.override", "typing_extensions.deprecated", "warnings.deprecated",
    "torch.inference_mode", "torch.no_grad", "torch.compiler.disable", "contextlib.contextmanager",
    "typing.final", "typing_extensions.final",
})
#: Class decorators that change neither construction nor attributes.
INERT_CLASS_DECORATORS = frozenset({
    "typing.runtime_checkable", "typing_extensions.runtime_checkable", "functools.total_ordering",
    "typing.final", "typing_extensions.final", "enum.unique",
})


class Unchecked(Exception):
    """The signature cannot be known from source; `reason` says why (shown in the report)."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


@record
class Parameter:
    name: str
    #: POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_POSITIONAL, KEYWORD_ONLY or VAR_KEYWORD.
    kind: str
    #: Source text of the default, None when the parameter is required.
    default: str | None
    #: Where it is declared (a dataclass field's statement), for pointing at it.
    module: Module | None = None
    node: ast.AST | None = None

    @property
    def required(self):
        return self.default is None and self.kind not in (VAR_POSITIONAL, VAR_KEYWORD)

    def as_json(self):
        return {"name": self.name, "kind": self.kind, "default": self.default}


@record
class Signature:
    """The parameters a callable accepts, with where its declaration is in the provider's source."""

    #: Dotted path of the callable (for a constructor: the class called).
    callee: str
    parameters: list[Parameter]
    module: Module
    #: The `def` or, for a synthesized `__init__`, the class.
    node: ast.AST
    #: "function", "method", "constructor", "dataclass", "struct" or "object" (no __init__ anywhere).
    origin: str

    def without_first(self):
        """The signature as seen through an instance or class: the first parameter is bound."""
        parameters = list(self.parameters)
        if parameters and parameters[0].kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD):
            parameters = parameters[1:]
        return replace(self, parameters=parameters)

    def parameter(self, name):
        for parameter in self.parameters:
            if parameter.name == name:
                return parameter
        return None


def _text(node):
    """ast.unparse(node), None for None. A default is mostly a constant or a name (two hundred of them
    in a verify), which simple_text() writes at a tenth of ast.unparse's cost."""
    if node is None:
        return None
    text = simple_text(node)
    return ast.unparse(node) if text is None else text


#: How ast.unparse begins a lambda without parameters: Python 3.9 and 3.10 write a space before the colon.
_LAMBDA = "lambda: " if sys.version_info >= (3, 11) else "lambda : "

#: Constants whose repr() is what ast.unparse writes (floats: finite ones only; a str: without a u prefix).
_REPR_CONSTANTS = frozenset((str, int, bool, bytes, type(None)))


def simple_text(node):
    """What ast.unparse(node) writes, for a constant, a name, a dotted name, a negative number, a call of
    a (dotted) name without arguments, a tuple or list of constants and (dotted) names, and a lambda
    without parameters returning one of those; None for anything else. Checked against ast.unparse on
    every default and field of 36 vLLM releases on Python 3.9 to 3.13. (The lambda: vLLM's LoadConfig
    has `default_factory=lambda: [...]`, and ast.unparse would cost a verify ast's import.)"""
    kind = type(node)
    if kind is ast.Lambda:
        parameters = node.args
        if (parameters.posonlyargs or parameters.args or parameters.vararg or parameters.kwonlyargs
                or parameters.kwarg or type(node.body) is ast.Lambda):
            return None
        body = simple_text(node.body)
        return None if body is None else _LAMBDA + body
    if kind is ast.Constant:
        value = node.value
        if node.kind is None and (type(value) in _REPR_CONSTANTS or (type(value) is float and value - value == 0)):
            return repr(value)
        return None
    if kind is ast.Name:
        return node.id
    if kind is ast.Attribute:
        if type(node.value) in (ast.Name, ast.Attribute):
            base = simple_text(node.value)
            return None if base is None else base + "." + node.attr
        return None
    if kind is ast.Call:
        if not node.args and not node.keywords and type(node.func) in (ast.Name, ast.Attribute):
            function = simple_text(node.func)
            return None if function is None else function + "()"
        return None
    if kind is ast.UnaryOp:
        operand = node.operand
        if (type(node.op) is ast.USub and type(operand) is ast.Constant and type(operand.value) in (int, float)
                and operand.kind is None):
            value = simple_text(operand)
            return None if value is None else "-" + value
        return None
    if kind is ast.Tuple or kind is ast.List:
        items = []
        for element in node.elts:
            if type(element) not in (ast.Constant, ast.Name, ast.Attribute):
                return None
            item = simple_text(element)
            if item is None:
                return None
            items.append(item)
        if kind is ast.List:
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return None


def _decorator_ref(index, module, decorator):
    expr = decorator.func if isinstance(decorator, ast.Call) else decorator
    while isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return index.resolve_in(module, expr)
    return None


def function_signature(index, ref, *, origin="function"):
    """The signature of a function or method definition (self included)."""
    node = ref.node
    for decorator in node.decorator_list:
        found = _decorator_ref(index, ref.module, decorator)
        if isinstance(found, ExternalRef) and found.dotted in TRANSPARENT_DECORATORS:
            continue
        if isinstance(found, ExternalRef) and found.dotted.endswith((".setter", ".getter", ".deleter")):
            continue
        raise Unchecked("%s is decorated with %s, which may change its parameters"
                        % (ref.dotted, ast.unparse(decorator)))
    args = node.args
    parameters = []
    positional = list(args.posonlyargs) + list(args.args)
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = POSITIONAL_ONLY if i < len(args.posonlyargs) else POSITIONAL_OR_KEYWORD
        parameters.append(Parameter(arg.arg, kind, _text(default), ref.module, arg))
    if args.vararg is not None:
        parameters.append(Parameter(args.vararg.arg, VAR_POSITIONAL, None, ref.module, args.vararg))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        parameters.append(Parameter(arg.arg, KEYWORD_ONLY, _text(default), ref.module, arg))
    if args.kwarg is not None:
        parameters.append(Parameter(args.kwarg.arg, VAR_KEYWORD, None, ref.module, args.kwarg))
    return Signature(callee=ref.dotted, parameters=parameters, module=ref.module, node=node, origin=origin)


def method_kind(index, ref):
    """'static', 'class' or 'instance' for a method definition."""
    for decorator in ref.node.decorator_list:
        found = _decorator_ref(index, ref.module, decorator)
        if isinstance(found, ExternalRef):
            if found.dotted == "builtins.staticmethod":
                return "static"
            if found.dotted == "builtins.classmethod":
                return "class"
    return "instance"


def _returns_argument_unchanged(node):
    """A decorator like vLLM 0.11's `config`: its body only returns its first parameter."""
    params = node.args.posonlyargs + node.args.args
    statements = [s for s in node.body
                  if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return (bool(params) and len(statements) == 1 and isinstance(statements[0], ast.Return)
            and isinstance(statements[0].value, ast.Name) and statements[0].value.id == params[0].arg)


def _is_dataclass_maker(index, function):
    """(is a maker, extra field specifiers) for a decorator function read from source."""
    specifiers = set()
    maker = False
    for decorator in function.node.decorator_list:
        found = _decorator_ref(index, function.module, decorator)
        if isinstance(found, ExternalRef) and found.dotted in DATACLASS_TRANSFORM:
            maker = True
            if isinstance(decorator, ast.Call):
                for keyword in decorator.keywords:
                    if keyword.arg == "field_specifiers" and isinstance(keyword.value, ast.Tuple):
                        for element in keyword.value.elts:
                            spec = index.resolve_in(function.module, element)
                            specifiers.add(getattr(spec, "dotted", None))
    if not maker:
        for node in walk(function.node):
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
                called = index.resolve_in(function.module, node.func)
                if isinstance(called, ExternalRef) and called.dotted in DATACLASS_MAKERS:
                    maker = True
    return maker, specifiers


@record
class DataclassOptions:
    """What a dataclass maker's decorator says: its init= and kw_only= flags, the calls that declare fields."""

    init: bool = True
    kw_only: bool = False
    specifiers: frozenset = FIELD_SPECIFIERS


def dataclass_options(index, cls):
    """DataclassOptions when a class decorator makes `cls` a dataclass, else None.

    Raises Unchecked for a class decorator whose effect is unknown.
    """
    options = None
    for decorator in cls.node.decorator_list:
        found = _decorator_ref(index, cls.module, decorator)
        maker, specifiers = False, set()
        if isinstance(found, ExternalRef) and found.dotted in INERT_CLASS_DECORATORS:
            continue
        if isinstance(found, ExternalRef) and found.dotted in DATACLASS_MAKERS:
            maker = True
        elif isinstance(found, FunctionRef):
            maker, specifiers = _is_dataclass_maker(index, found)
            if not maker and not _returns_argument_unchanged(found.node):
                raise Unchecked("%s is decorated with %s, which may replace its constructor"
                                % (cls.dotted, ast.unparse(decorator)))
        else:
            raise Unchecked("%s is decorated with %s, which may replace its constructor"
                            % (cls.dotted, ast.unparse(decorator)))
        if maker:
            flags = {}
            if isinstance(decorator, ast.Call):
                for keyword in decorator.keywords:
                    if keyword.arg in ("init", "kw_only") and isinstance(keyword.value, ast.Constant):
                        flags[keyword.arg] = bool(keyword.value.value)
            options = DataclassOptions(specifiers=FIELD_SPECIFIERS | specifiers, **flags)
    return options


def _annotation_head(annotation):
    """'ClassVar', 'InitVar', 'KW_ONLY' or another name heading an annotation."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value.split("[", 1)[0].rpartition(".")[2].strip()
    if isinstance(annotation, ast.Subscript):
        annotation = annotation.value
    if isinstance(annotation, ast.Attribute):
        return annotation.attr
    if isinstance(annotation, ast.Name):
        return annotation.id
    return ""


def _dataclass_fields(index, cls, options, fields):
    """Add `cls`'s own fields to `fields` ({name: Parameter}, in order; redefinition keeps the place)."""
    kw_only = options.kw_only
    for node in body_statements(cls.node.body):
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        head = _annotation_head(node.annotation)
        if head == "ClassVar":
            continue
        if head == "KW_ONLY":
            kw_only = True
            continue
        name = node.target.id
        default, field_kw_only, in_init = _field_default(index, cls, node.value, options)
        if not in_init:
            fields.pop(name, None)
            continue
        kind = KEYWORD_ONLY if (kw_only if field_kw_only is None else field_kw_only) else POSITIONAL_OR_KEYWORD
        fields[name] = Parameter(name, kind, default, cls.module, node)


def _field_default(index, cls, value, options):
    """(default text or None, kw_only or None, part of __init__) of a field's assigned value."""
    if value is None:
        return None, None, True
    if isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute)):
        called = index.resolve_in(cls.module, value.func)
        if getattr(called, "dotted", None) in options.specifiers:
            keywords = {k.arg: k.value for k in value.keywords if k.arg}
            default = None
            if "default" in keywords:
                default = keywords["default"]
            elif value.args and "pydantic" in called.dotted:
                default = value.args[0]
            if isinstance(default, ast.Constant) and default.value is Ellipsis:
                default = None  # pydantic: Field(...) marks the field required
            text = _text(default)
            if text is None and "default_factory" in keywords:
                text = "%s()" % _text(keywords["default_factory"])
            in_init = True
            if isinstance(keywords.get("init"), ast.Constant) and keywords["init"].value is False:
                in_init = False
            kw_only = None
            if isinstance(keywords.get("kw_only"), ast.Constant):
                kw_only = bool(keywords["kw_only"].value)
            return text, kw_only, in_init
    return _text(value), None, True


def dataclass_signature(index, cls, options):
    """The `__init__` dataclasses/pydantic synthesize for `cls`."""
    fields = {}
    class_info = info(index, cls)
    for entry in reversed(class_info.mro):
        if not isinstance(entry, ClassRef):
            raise Unchecked("%s inherits from %s, which is not read: its fields are unknown"
                            % (cls.dotted, entry.dotted))
        entry_options = options if entry is cls else dataclass_options(index, entry)
        if entry_options is not None:
            _dataclass_fields(index, entry, entry_options, fields)
    ordered = [p for p in fields.values() if p.kind == POSITIONAL_OR_KEYWORD]
    ordered += [p for p in fields.values() if p.kind == KEYWORD_ONLY]
    return Signature(callee=cls.dotted, parameters=ordered, module=cls.module, node=cls.node, origin="dataclass")


def _is_struct(index, cls):
    return any(isinstance(e, ExternalRef) and e.dotted in STRUCT_BASES for e in info(index, cls).mro)


def struct_signature(index, cls):
    """The `__init__` msgspec generates: the annotated fields of every Struct class in the MRO, in order."""
    fields = {}
    for entry in reversed(info(index, cls).mro):
        if not isinstance(entry, ClassRef) or not _is_struct(index, entry):
            continue  # a plain mixin's annotations are not fields
        if dataclass_options(index, entry) is not None:
            raise Unchecked("%s is both a msgspec Struct and a dataclass" % entry.dotted)
        kw_only = any(k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                      for k in entry.node.keywords)
        _dataclass_fields(index, entry, DataclassOptions(kw_only=kw_only), fields)
    ordered = [p for p in fields.values() if p.kind == POSITIONAL_OR_KEYWORD]
    ordered += [p for p in fields.values() if p.kind == KEYWORD_ONLY]
    return Signature(callee=cls.dotted, parameters=ordered, module=cls.module, node=cls.node, origin="struct")


def constructor_signature(index, cls):
    """What `cls(...)` accepts, found through the MRO; raises Unchecked when source cannot tell."""
    class_info = info(index, cls)
    if class_info.metaclass is not None:
        raise Unchecked("%s has a metaclass, which may change how it is constructed" % cls.dotted)
    for entry in class_info.mro:
        if isinstance(entry, ExternalRef) and entry.dotted in STRUCT_BASES:
            return struct_signature(index, cls)
        if not isinstance(entry, ClassRef):
            raise Unchecked("%s takes its constructor from %s, which is not read" % (cls.dotted, entry.dotted))
        init = own_member(entry, "__init__")
        options = dataclass_options(index, entry)
        if init is not None and isinstance(init, (ast.FunctionDef, ast.AsyncFunctionDef)):
            method = FunctionRef(entry.module, init, entry.qualname + ".__init__", owner=entry)
            return replace(function_signature(index, method, origin="constructor").without_first(), callee=cls.dotted)
        if init is not None:
            raise Unchecked("%s.__init__ is not a plain method" % entry.dotted)
        if own_member(entry, "__new__") is not None:
            raise Unchecked("%s defines __new__" % entry.dotted)
        if options is not None and options.init:
            return replace(dataclass_signature(index, entry, options), callee=cls.dotted)
    return Signature(callee=cls.dotted, parameters=[], module=cls.module, node=cls.node, origin="object")


@record
class Problem:
    """One way a call does not fit a signature."""

    #: A finding kind of drift.findings.SIGNATURE_KINDS.
    kind: str
    #: The finding's detail: the keyword, the parameter, the number of positional arguments given.
    detail: str
    #: The consumer's AST node to point at (the keyword, or the call).
    node: ast.AST
    #: The callee's Parameter involved, when there is one.
    parameter: Parameter | None = None


def bind(signature, call, partial=False):
    """Problems binding `call`'s arguments to `signature` (empty when it fits or cannot be decided);
    `partial`: `call` is `functools.partial(callable, ...)`, whose missing arguments come later."""
    problems = []
    params = signature.parameters
    positional_params = [p for p in params if p.kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD)]
    keyword_only = [p for p in params if p.kind == KEYWORD_ONLY]
    var_positional = any(p.kind == VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind == VAR_KEYWORD for p in params)
    arguments = call.args[1:] if partial else call.args
    starred = any(isinstance(a, ast.Starred) for a in arguments)
    double_starred = any(k.arg is None for k in call.keywords)
    given = [a for a in arguments if not isinstance(a, ast.Starred)]
    if not starred and len(given) > len(positional_params) and not var_positional:
        extra = given[len(positional_params)]
        if keyword_only:
            problems.append(Problem("keyword-only-positional", keyword_only[0].name, extra, keyword_only[0]))
        else:
            problems.append(Problem("too-many-positional", str(len(given)), extra))
    filled = {p.name for p in positional_params[:len(given)]}
    # A parameter already reported as passed the wrong way is not reported missing too.
    filled |= {p.parameter.name for p in problems if p.parameter is not None}
    by_name = {p.name: p for p in params if p.kind in (POSITIONAL_OR_KEYWORD, KEYWORD_ONLY)}
    for keyword in call.keywords:
        if keyword.arg is None:
            continue
        param = by_name.get(keyword.arg)
        if param is not None:
            filled.add(param.name)
            continue
        if var_keyword:
            continue
        positional_only = next((p for p in params if p.kind == POSITIONAL_ONLY and p.name == keyword.arg), None)
        if positional_only is not None:
            problems.append(Problem("positional-only-keyword", keyword.arg, keyword, positional_only))
            filled.add(positional_only.name)
        else:
            problems.append(Problem("unexpected-keyword", keyword.arg, keyword))
    if not double_starred and not partial:
        candidates = keyword_only if starred else positional_params + keyword_only
        for param in candidates:
            if param.required and param.name not in filled:
                problems.append(Problem("missing-argument", param.name, call, param))
    return problems
