"""Python's syntax trees as the analyzer reads them: the node classes and the parser of `_ast`, the
C module behind `ast`, and the walks the analyzer needs.

`ast` is a Python module over `_ast` (its unparser, NodeVisitor, the helpers) which also imports
contextlib: 1.2 ms to import alone on the lab host, 4.9 M of a cold verify's 333 M instructions, for
one function the analyzer needs rarely.
The analyzer's modules import this one as `ast`; `unparse`, for the defaults only it writes, imports
the real module when first called.
"""
from _ast import *  # noqa: F403 -- the node classes, as `ast` itself re-exports them
from _ast import AST, PyCF_ONLY_AST


def parse(source, filename="<unknown>"):
    """ast.parse(source, filename): the module's tree, or the SyntaxError it raises."""
    return compile(source, filename, "exec", PyCF_ONLY_AST)


def parse_file(path):
    """The tree of the Python file at `path`, or None where it cannot be read or parsed: an installed
    release's file missing or broken is what the reader reports, not a crash."""
    try:
        with open(path, encoding="utf-8") as handle:
            return parse(handle.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None


def unparse(node):
    """ast.unparse(node)."""
    import ast

    return ast.unparse(node)


def shape(node):
    """The node's structure as a hashable value, equal for two nodes when ast.dump is (positions and
    expression contexts left out): what `hasattr(x, ...)` is matched to a later `x.attr` by."""
    if isinstance(node, AST):
        return (type(node).__name__,) + tuple(shape(getattr(node, name, None)) for name in node._fields
                                               if name != "ctx")
    if isinstance(node, list):
        return tuple(shape(item) for item in node)
    return type(node).__name__, node


def walk(node):
    """What ast.walk gives, in its order (breadth first), but for expression contexts (children()),
    each node's fields read before it is given (a lazy part is parsed when ast.walk would parse it),
    in a fraction of its time: ast.walk's nested generators (iter_child_nodes, iter_fields) were a
    tenth of a verify."""
    todo = [node]
    for node in todo:  # the list grows while it is read: breadth first
        todo.extend(children(node))
        yield node


#: Fields that hold no node, by the class that has them (Python.asdl, 3.9 to 3.13): names, numbers,
#: flags, type comments. Not read for children: two getattr and isinstance calls a node saved.
_SCALAR_FIELDS = {
    "Name": ("id",), "Attribute": ("attr",), "Constant": ("value", "kind"), "arg": ("arg", "type_comment"),
    "keyword": ("arg",), "alias": ("name", "asname"), "FunctionDef": ("name", "type_comment"),
    "AsyncFunctionDef": ("name", "type_comment"), "ClassDef": ("name",), "ImportFrom": ("module", "level"),
    "Global": ("names",), "Nonlocal": ("names",), "ExceptHandler": ("name",), "Assign": ("type_comment",),
    "For": ("type_comment",), "AsyncFor": ("type_comment",), "With": ("type_comment",),
    "AsyncWith": ("type_comment",), "FormattedValue": ("conversion",), "comprehension": ("is_async",),
    "MatchSingleton": ("value",), "MatchAs": ("name",), "MatchStar": ("name",), "MatchClass": ("kwd_attrs",),
    "MatchMapping": ("rest",), "TypeIgnore": ("lineno", "tag"),
}
#: List fields whose items may be None rather than nodes: a `**mapping` in a dict display, a
#: keyword-only parameter without a default. Every other list field holds nodes only (Python.asdl,
#: 3.9 to 3.13), but for the lists of names _SCALAR_FIELDS leaves out.
_HOLES = {"Dict": ("keys",), "arguments": ("kw_defaults",)}
#: {node class: ((field, how it is read), ...)}, the fields children() reads, found from the first node
#: of the class it is given: a field is a list in every node of a class or in none.
_CHILD_FIELDS = {}
#: How children() reads a field: a node or None (or anything else, left out), a list of nodes, a list
#: that may hold None.
_NODE, _LIST, _LIST_WITH_HOLES = "node", "list", "list with holes"


def _child_fields(node):
    left_out, holes = {"ctx"}, set()
    for klass in type(node).__mro__:  # a lazy part's class (drift/parts.py) is its ast class's subclass
        left_out.update(_SCALAR_FIELDS.get(klass.__name__, ()))
        holes.update(_HOLES.get(klass.__name__, ()))
    fields = []
    for name in type(node)._fields:
        if name not in left_out:
            if not isinstance(getattr(node, name, None), list):
                fields.append((name, _NODE))
            else:
                fields.append((name, _LIST_WITH_HOLES if name in holes else _LIST))
    return tuple(fields)


def children(node):
    """ast.iter_child_nodes(node) as a list, made in one loop, without the node's expression context
    (`ctx`: one of three Load, Store, Del objects the parser shares, which no reader of a walk looks
    for; they were two fifths of a tree's nodes)."""
    fields = _CHILD_FIELDS.get(type(node))
    if fields is None:
        fields = _CHILD_FIELDS[type(node)] = _child_fields(node)
    found = []
    for name, read in fields:
        value = getattr(node, name, None)
        if read is _LIST:
            found += value
        elif read is _LIST_WITH_HOLES:
            found += [item for item in value if item is not None]
        elif isinstance(value, AST):
            found.append(value)
        elif isinstance(value, list):  # a list field the class's first node lacked (it read as None)
            found += [item for item in value if isinstance(item, AST)]
    return found
