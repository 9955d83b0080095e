"""A module's source parsed by parts: each top-level def and class, and each method, when first used.

The analysis asks a provider module for a few names, a class for its constructor and a few methods;
vLLM's modules are large (the scheduler's is 100 kB) and parsing them whole was most of a verify.
So the module is parsed with every top-level def and class replaced by a `pass` at its place, and
each of those becomes a node of the same class (LazyFunctionDef, LazyClassDef …) holding its name
and line: the first read of any other attribute parses its lines and fills the node in. A class
parsed that way holds its methods as such nodes in turn. Code that walks a tree sees the same nodes,
fields and line numbers as ast.parse gives.

Where the text is cut into parts: drift/cuts.py.
"""
from drift import syntax as ast
from drift.cuts import MaskedLines, code_end


def unparsed_text(node):
    """The text of a def or class (its lines, decorators first) whose body is not parsed yet, else None:
    where a look at the text can tell that its body holds no node of some kind, the body need not be
    parsed (a name, in ASCII text, is written as it is)."""
    fields = node.__dict__
    if "_source" not in fields:
        return None
    part = fields["_part"]
    return fields["_source"].text[part.start_at:part.end_at - 1]


class PartUnreadable(Exception):
    """A part, once looked into, could not be read though the rest of its module was: this Python
    parses the module by parts but not whole (newer syntax inside a def). The analysis is then run
    again with whole modules (drift/verify.py), where such a module counts as unreadable, as always."""


LAZY = {}


#: A def's fields its header holds. Read before any other, they are parsed from the header's lines
#: alone (a call is checked against a def's signature, and one of vLLM's scheduler's methods is 580
#: lines); the body and the end's position come with the first read of another field.
HEADER_FIELDS = frozenset(("decorator_list", "args", "returns", "type_comment", "type_params"))


def _lazy_class(base):
    def __getattr__(self, name):  # only for attributes not yet set: the first read parses the part
        if name.startswith("__") or self.__dict__.get("_filled"):
            raise AttributeError(name)
        if name in HEADER_FIELDS and "_header" not in self.__dict__ and base is not ast.ClassDef:
            self._source.fill_header(self)
            if name in self.__dict__:
                return self.__dict__[name]
        self._source.fill(self)
        return getattr(self, name)

    return type("Lazy" + base.__name__, (base,), {"__getattr__": __getattr__})


for _base in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
    LAZY[_base] = _lazy_class(_base)
KINDS = {"def": ast.FunctionDef, "async": ast.AsyncFunctionDef, "class": ast.ClassDef}
#: How many lines from a def's line its header is looked for in (vLLM's longest are some 40).
HEADER_LINES = 80


class PartedSource:
    """The text of one module and the parse of its parts; `tree()` is the module's ast.Module."""

    def __init__(self, text, filename):
        self.text = text
        self.filename = filename
        #: The text's lines as the cuts read them first, unmasked; masked, when a cut read so failed its
        #: parse, and for the positions no parse checks (where a class's code ends).
        self._lines = MaskedLines(text, mask=False)
        self._masked_lines = None
        self._whole = None
        #: A tree with lazy parts went out: from then on, a part that cannot be read is PartUnreadable.
        self._handed_out = False

    @property
    def _masked(self):
        if self._masked_lines is None:
            self._masked_lines = MaskedLines(self.text)
        return self._masked_lines

    def tree(self):
        """The module's tree with its defs and classes left lazy (SyntaxError as ast.parse raises it)."""
        for careful in (False, True):  # the masked lines are made only if the first reading fails
            lines = self._masked if careful else self._lines
            parts = lines.cuts(0, 0, len(self.text) + 1, None, 0)
            if not parts:
                return self._parse_whole()
            if not self._cut_soundly(parts, lines):
                continue
            try:
                module = ast.parse(self._with_passes(parts, 0, len(self.text) + 1), filename=self.filename)
            except SyntaxError:
                continue
            if self._replace(module.body, parts):
                self._handed_out = True
                return module
        return self._parse_whole()

    def _cut_soundly(self, parts, lines):
        """False when `parts` were cut from the unmasked text and one holds an odd number of `\"\"\"` or
        `\'\'\'`: it may end inside a string, at a line of it the parse would take for code (a comment
        there ends the string unseen). Stray quotes, in a comment or another string, only make the
        masked text read."""
        if lines is not self._lines:
            return True  # masked: no string's line passes for code
        count = self.text.count
        for quotes in ('"""', "'''"):
            if quotes in self.text:  # most modules write one kind only
                for part in parts:
                    if count(quotes, part.start_at, part.end_at) % 2:
                        return False
        return True

    def _with_passes(self, parts, begin, end):
        """The lines from offset `begin` to offset `end` (excluded, its newline too), each of `parts`
        (among them) a `pass` at its indentation on its first line, its other lines blank. Made of
        slices of the text: no line is listed."""
        text, pieces, copied = self.text, [], begin
        for part in parts:
            # A part's lines keep their newlines, but for the last line of the lines asked for.
            pieces += [text[copied:part.start_at], " " * part.indent + "pass",
                       "\n" * (part.end - part.start - (part.end_at >= end))]
            copied = part.end_at
        pieces.append(text[copied:end - 1])
        return "".join(pieces)

    @staticmethod
    def _prefix(part):
        """What goes before a part's lines, parsed alone: a blank line for each line before it (its nodes
        keep their positions), the last a `class _:` for a method (its indentation needs one)."""
        return "\n" * (part.start - 1) + "class _:\n" if part.indent else "\n" * part.start

    def _parse_whole(self):
        if self._whole is None:
            try:
                self._whole = ast.parse(self.text, filename=self.filename)
            except SyntaxError as exc:
                if not self._handed_out:
                    raise  # from tree(): the module is unreadable, as it would be parsed whole
                raise PartUnreadable("%s: %s" % (self.filename, exc)) from None
        return self._whole

    def _replace(self, body, parts):
        """Put a lazy node in place of each part's `pass`; False when a `pass` is not where it should be."""
        at = {(node.lineno, node.col_offset): index for index, node in enumerate(body) if isinstance(node, ast.Pass)}
        for part in parts:
            index = at.get((part.start + 1, part.indent))
            if index is None:
                return False
            node = ast.AST.__new__(LAZY[KINDS[part.kind]])
            node.__dict__.update(name=part.name, lineno=part.definition + 1, col_offset=part.indent,
                                 _source=self, _part=part)
            body[index] = node
        return True

    def fill(self, node):
        """Parse `node`'s part and give the node its fields (a class's methods lazy in turn); the header's,
        when fill_header() gave them, are kept: they may be in use already."""
        part = node.__dict__["_part"]
        parsed = self._parse_part(part, self._lines)
        if parsed is None and part.kind == "class":  # its methods cut again, from the masked lines
            parsed = self._parse_part(part, self._masked)
        if parsed is None:
            parsed = self._from_whole(part)
        fields = node.__dict__
        for name, value in parsed.__dict__.items():
            fields.setdefault(name, value)
        fields["_filled"] = True
        del fields["_source"], fields["_part"]
        fields.pop("_header", None)

    def fill_header(self, node):
        """Give a def's node its header's fields (HEADER_FIELDS), parsed from the header's lines with a
        `pass` for a body; where the header cannot be read alone, none (fill() gives them all)."""
        node.__dict__["_header"] = True  # tried: once only
        parsed = self._parse_header(node.__dict__["_part"])
        if parsed is not None:
            for name in HEADER_FIELDS.intersection(parsed.__dict__):
                node.__dict__[name] = parsed.__dict__[name]

    def _parse_header(self, part):
        """The def of `part` parsed from its lines up to the first line whose code ends with the colon
        that ends its header, `pass` after that colon; None when no such line gives exactly that def,
        with exactly that `pass` for a body (a body on the header's line, a colon in a default).
        The lines are the file's up to that colon: the header's nodes and their positions are the
        whole part's."""
        if part.indent and not part.start:
            return None
        prefix = self._prefix(part)
        following = part.definition_at
        for number in range(part.definition, min(part.end, part.definition + HEADER_LINES)):
            at, following = following, self._lines.next(following)
            end = code_end(self._lines.line(at))
            line = self.text[at:following - 1]
            if not line[:end].endswith(":"):
                continue
            try:
                module = ast.parse(prefix + self.text[part.start_at:at] + line[:end] + " pass", filename=self.filename)
            except SyntaxError:
                continue
            body = module.body[0].body if part.indent else module.body
            if len(module.body) != 1 or len(body) != 1:
                continue
            node = body[0]
            if (type(node) is KINDS[part.kind] and node.name == part.name and node.lineno == part.definition + 1
                    and len(node.body) == 1 and type(node.body[0]) is ast.Pass
                    and (node.body[0].lineno, node.body[0].col_offset) == (number + 1, len(line[:end].encode("utf-8")) + 1)):
                return node
        return None

    def _parse_part(self, part, lines):
        """The part's one statement, parsed at its own lines (a class's methods as parts, cut from
        `lines`); None when the part does not parse to exactly that statement."""
        if part.indent and not part.start:
            return None
        methods = []
        if part.kind == "class":
            methods = self._methods(part, lines)
            if not self._cut_soundly(methods, lines):
                return None
        text = self._prefix(part) + self._with_passes(methods, part.start_at, part.end_at)
        try:
            module = ast.parse(text, filename=self.filename)
        except SyntaxError:
            return None
        body = module.body[0].body if part.indent else module.body
        if len(module.body) != 1 or len(body) != 1:
            return None
        node = body[0]
        if type(node) is not KINDS[part.kind] or node.name != part.name or node.lineno != part.definition + 1:
            return None
        if methods:
            if not self._replace(node.body, methods):
                return None
            last = methods[-1]
            if node.body[-1].__dict__.get("_part") is last:
                # The class ended at its last method's `pass`; it ends where that method's code does.
                node.end_lineno, node.end_col_offset = self._code_end(last)
        return node

    def _code_end(self, part):
        """(line, column) where `part`'s code ends, the column in UTF-8 bytes as ast counts (a comment
        left out). No parse checks it: read from the text as it is only where no `#` is on the lines
        read, for a `#` on a line of a string that spans lines would pass for a comment."""
        lines = self._lines
        end, end_at = lines.last_code_line(part)
        at = lines.previous(end_at)
        if "#" in self.text[at:part.end_at]:
            lines = self._masked
            end, end_at = lines.last_code_line(part)
            at = lines.previous(end_at)
        return end, len(self.text[at:end_at - 1][:code_end(lines.line(at))].encode("utf-8"))

    @staticmethod
    def _methods(part, lines):
        """The methods of a class part, cut from `lines` at its body's indentation."""
        indent = lines.body_indent(part)
        if indent is None:
            return []
        return lines.cuts(lines.next(part.definition_at), part.definition + 1, part.end_at, part.end, indent,
                          part.indent)

    def _from_whole(self, part):
        """The part's node in the whole module's parse (a cut the text misread)."""
        for node in ast.walk(self._parse_whole()):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    and node.lineno == part.definition + 1 and node.col_offset == part.indent):
                return node
        raise PartUnreadable("%s: line %d is not where the reading by parts put a %s"
                             % (self.filename, part.definition + 1, part.kind))
