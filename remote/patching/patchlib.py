"""Editing Python source by its own structure: find nodes with `ast`, change only their characters.

Used by the data edits (patchedits.py) and by patchset scripts, which define
`state(source) -> State` and `apply(source) -> str` with these helpers.
Standard library only, Python 3.9 (no ast positions on `alias` nodes there).
"""
import ast
import re
import textwrap


class State:
    """Where one patch stands on a file's text: pending, applied or conflict (with why)."""

    PENDING = "pending"
    APPLIED = "applied"
    CONFLICT = "conflict"

    def __init__(self, name, reason=""):
        if name not in (self.PENDING, self.APPLIED, self.CONFLICT):
            raise ValueError("unknown patch state %r" % (name,))
        self.name = name
        self.reason = reason

    def __eq__(self, other):
        return isinstance(other, State) and (self.name, self.reason) == (other.name, other.reason)

    def __repr__(self):
        return "State(%r, %r)" % (self.name, self.reason)


PENDING = State(State.PENDING)
APPLIED = State(State.APPLIED)


def conflict(reason):
    return State(State.CONFLICT, reason)


class Source:
    """A file's text with `ast` positions (1-based lines, UTF-8 byte columns) mapped to text offsets."""

    def __init__(self, text):
        self.text = text
        self.tree = ast.parse(text)
        self._line_starts = [0]
        for line in text.splitlines(keepends=True):
            self._line_starts.append(self._line_starts[-1] + len(line))
        self._by_type = None

    def nodes(self, kind):
        """Every node of the tree of type `kind` (one walk of the tree, shared by all edits)."""
        if self._by_type is None:
            self._by_type = {}
            for node in ast.walk(self.tree):
                self._by_type.setdefault(type(node), []).append(node)
        return self._by_type.get(kind, [])

    def offset(self, lineno, col):
        start = self._line_starts[lineno - 1]
        line = self.text[start:self._line_starts[lineno]] if lineno < len(self._line_starts) else self.text[start:]
        return start + len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))

    def start(self, node):
        return self.offset(node.lineno, node.col_offset)

    def end(self, node):
        return self.offset(node.end_lineno, node.end_col_offset)

    def line_start(self, offset):
        return self.text.rfind("\n", 0, offset) + 1

    def line_end(self, offset):
        """Offset just past the newline ending the line holding `offset` (or the end of text)."""
        newline = self.text.find("\n", offset)
        return len(self.text) if newline < 0 else newline + 1

    def indentation(self, offset):
        start = self.line_start(offset)
        line = self.text[start:self.line_end(offset)]
        return line[:len(line) - len(line.lstrip(" \t"))]


_parsed = {}


def parse(text):
    """The Source of `text`, parsed once per engine run however many patches look at it."""
    if text not in _parsed:
        if len(_parsed) >= 16:
            _parsed.clear()
        _parsed[text] = Source(text)
    return _parsed[text]


def replace_spans(text, edits):
    """Apply (start, end, replacement) edits, which must not overlap, to text."""
    for start, end, replacement in sorted(edits, key=lambda e: e[0], reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def dotted_name(node):
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _names(node, wanted):
    name = dotted_name(node)
    return name is not None and (name == wanted or name.endswith("." + wanted))


def find_calls(source, callee):
    """Calls whose callee, as written, is `callee` or ends with `.callee`; in source order."""
    calls = [node for node in source.nodes(ast.Call) if _names(node.func, callee)]
    return sorted(calls, key=source.start)


def find_class(source, name):
    """The top-level or nested classes named `name`."""
    return [node for node in source.nodes(ast.ClassDef) if node.name == name]


def keyword(call, name):
    return next((kw for kw in call.keywords if kw.arg == name), None)


def _items(source, nodes):
    return sorted(nodes, key=source.start)


def _append_item(source, opener_end, items, new_item):
    """An edit adding `new_item` at the end of a bracketed, comma-separated list.

    `opener_end` is the offset just past the opening bracket; `items` the list's
    nodes. One item per line with a trailing comma gets a new line of the same
    indentation; otherwise `, new_item` follows the last item.
    """
    text = source.text
    if not items:
        return (opener_end, opener_end, new_item)
    last_end = source.end(items[-1])
    after = re.match(r"[ \t]*,[ \t]*(#[^\n]*)?\n", text[last_end:])
    last_start = source.start(items[-1])
    if after and not text[source.line_start(last_start):last_start].strip():
        insert_at = last_end + after.end()
        return (insert_at, insert_at, "%s%s,\n" % (source.indentation(last_start), new_item))
    return (last_end, last_end, ", " + new_item)


def _remove_item(source, items, index):
    """An edit removing items[index] from a comma-separated list, with its comma, keeping the layout."""
    text = source.text
    node = items[index]
    start, end = source.start(node), source.end(node)
    comma = re.match(r"[ \t]*,", text[end:])
    after_comma = end + comma.end() if comma else end
    line_start = source.line_start(start)
    rest = re.match(r"[ \t]*(#[^\n]*)?(\n|$)", text[after_comma:])
    if not text[line_start:start].strip() and rest:
        # The item is alone on its line(s): drop the whole lines.
        return (line_start, after_comma + rest.end(), "")
    if index + 1 < len(items):
        return (start, source.start(items[index + 1]), "")
    if index > 0:
        return (source.end(items[index - 1]), end, "")
    return (start, after_comma, "")


def call_items(call):
    return list(call.args) + list(call.keywords)


def remove_keyword_edit(source, call, name):
    items = _items(source, call_items(call))
    return _remove_item(source, items, items.index(keyword(call, name)))


def add_keyword_edit(source, call, name, value):
    items = _items(source, call_items(call))
    opener = source.text.index("(", source.end(call.func)) + 1
    return _append_item(source, opener, items, "%s=%s" % (name, value))


def has_base(cls, base):
    return any(_names(node, base) or ast.dump(node) == ast.dump(ast.parse(base, mode="eval").body)
               for node in cls.bases)


def add_base_edit(source, cls, base):
    """Append `base` to the class's bases (before any `metaclass=`-style keyword)."""
    if cls.bases:
        bases = _items(source, cls.bases)
        if cls.keywords:
            end = source.end(bases[-1])
            return (end, end, ", " + base)
        return _append_item(source, None, bases, base)
    name_match = re.compile(r"class\s+%s\s*" % re.escape(cls.name)).match(source.text, source.start(cls))
    after_name = name_match.end()
    if source.text[after_name] == "(":
        if cls.keywords:
            return (after_name + 1, after_name + 1, base + ", ")
        return (after_name + 1, after_name + 1, base)
    return (after_name, after_name, "(%s)" % base)


def binds_name(source, name):
    """Whether a module-level statement binds `name` (import, assignment, def or class)."""
    for node in source.tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return True
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def add_import_edit(source, module, name):
    """`from module import name` on a new line after the last module-level import; None if `name` is bound."""
    if binds_name(source, name):
        return None
    imports = [node for node in source.tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    same_module = [node for node in imports if isinstance(node, ast.ImportFrom) and node.module == module]
    anchor = (same_module or imports or [None])[-1]
    at = source.line_end(source.end(anchor) - 1) if anchor is not None else _after_docstring(source)
    return (at, at, "from %s import %s\n" % (module, name))


def _after_docstring(source):
    body = source.tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        return source.line_end(source.end(body[0]) - 1)
    return 0


def defines(cls, name):
    """Whether the class body defines `name` (a def, or an assignment)."""
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
    return False


def add_members_edit(source, cls, members):
    """Insert `members` (dedented source of defs) at the end of the class body, indented like it."""
    last = cls.body[-1]
    at = source.line_end(source.end(last) - 1)
    indent = source.indentation(source.start(cls.body[0]))
    block = textwrap.indent(textwrap.dedent(members).strip("\n") + "\n", indent)
    newline = "" if source.text[:at].endswith("\n") else "\n"
    return (at, at, newline + "\n" + block)


def one_class(source, name):
    """(class node, None) when exactly one class is named `name`, else (None, conflict state)."""
    found = find_class(source, name)
    if len(found) != 1:
        return None, conflict("expected exactly one class %s, found %d" % (name, len(found)))
    return found[0], None


def class_members_state(source_text, class_name, members, base=None):
    """State of "class has `base` among its bases and defines `members`": all there, none, or partly (conflict)."""
    source = parse(source_text)
    cls, problem = one_class(source, class_name)
    if problem:
        return problem
    wanted = [(name, defines(cls, name)) for name in members]
    if base:
        wanted.append(("base " + base, has_base(cls, base)))
    present = [name for name, found in wanted if found]
    if len(present) == len(wanted):
        return APPLIED
    if not present:
        return PENDING
    return conflict("class %s has %s but not %s" % (class_name, ", ".join(present),
                                                   ", ".join(name for name, found in wanted if not found)))


def add_to_class(source_text, class_name, members, base=None, import_from=None):
    """The text with `members` (source of defs) appended to the class, and `base` (imported from
    `import_from` when that module does not bind it yet) added to its bases."""
    source = parse(source_text)
    cls, _ = one_class(source, class_name)
    edits = [add_members_edit(source, cls, members)]
    if base:
        edits.append(add_base_edit(source, cls, base))
        if import_from:
            edits.append(add_import_edit(source, import_from, base))
    return replace_spans(source.text, [edit for edit in edits if edit])
