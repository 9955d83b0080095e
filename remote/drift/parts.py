"""A module's source parsed by parts: each top-level def and class, and each method, when first used.

The analysis asks a provider module for a few names, a class for its constructor and a few methods;
vLLM's modules are large (the scheduler's is 100 kB) and parsing them whole was most of a verify.
So the module is parsed with every top-level def and class replaced by a `pass` at its place, and
each of those becomes a node of the same class (LazyFunctionDef, LazyClassDef …) holding its name
and line: the first read of any other attribute parses its lines and fills the node in. A class
parsed that way holds its methods as such nodes in turn. Code that walks a tree sees the same nodes,
fields and line numbers as ast.parse gives.

Where the parts are cut is found in the text: a line starts a part when, outside strings and
comments (masked first), it begins with `def`, `async def`, `class` or a decorator at the part's
indentation, and the part ends before the next line at that indentation or less (closing brackets
and string lines aside). A cut this reading gets wrong is caught by a parse: what is left around the
parts must parse (else the whole module is parsed at once, as before), and each part must parse to
exactly the one statement it was cut for (else it is taken from a parse of the whole module).
Checked against ast.parse on every module of vLLM 0.11, 0.16 and 0.33, speculators and hs-connectors:
the same nodes, fields and positions (5,600 files).
"""
import ast
import re


def _compiled_when_used(*pattern):
    """A function giving re.compile(*pattern), compiled on the first call: a compile is 0.5-2 M
    instructions of Python, and the regexes made so may serve no module of a verify."""
    compiled = []

    def get():
        if not compiled:
            compiled.append(re.compile(*pattern))
        return compiled[0]

    return get


#: Strings (any prefix, triple-quoted or not) and comments, in the order Python's tokenizer meets them.
_STRINGS_AND_COMMENTS = _compiled_when_used(
    r"#[^\n]*"
    r"|[rRbBuUfF]{0,2}(?:'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''"
    r'|"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""'
    r"|'[^'\\\n]*(?:\\.[^'\\\n]*)*'"
    r'|"[^"\\\n]*(?:\\.[^"\\\n]*)*")', re.DOTALL)
#: A triple-quoted string, or a run of anything else (code, comments, one-line strings) up to the next:
#: the regex walks the text in C, and Python sees a handful of matches a module, not every string.
_TRIPLE_OR_RUN = _compiled_when_used(
    r"(?P<triple>'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''"
    r'|"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*""")'
    r"|(?:[^'\"#]+|#[^\n]*|'(?!'')[^'\\\n]*(?:\\.[^'\\\n]*)*'"
    r'|"(?!"")[^"\\\n]*(?:\\.[^"\\\n]*)*")+', re.DOTALL)
_PART_START = re.compile(r"(?:async\s+def|def|class)\b|@")
_DEFINITION = re.compile(r"(?:async\s+def|def|class)\s+([A-Za-z_][A-Za-z0-9_]*)")
#: What a masked string's characters become (no quote, bracket or `#` that could mislead the cutting).
STRING_MARK = "\x01"
#: A line that may start a part (a def, a class or a decorator, at any indentation), with the newline
#: before it. The line-matching patterns here start at the newline, not at a MULTILINE `^`: the regex
#: finds a newline in C, where `^` is tried at every character (five times slower over a module).
_CANDIDATE = re.compile(r"\n([ \t]*)(?:(?:async[ \t]+)?def\b|class\b|@)")
#: {indent: _shallow(indent)}, {(lowest, indent): _starting(lowest, indent)}: compiled when first used.
_SHALLOW = {}
_STARTING = {}


def _masked(text):
    """`text` with the characters of its strings that span lines as STRING_MARK (newlines and their
    later lines' indentation kept): no line of theirs can pass for code. Comments and one-line
    strings are left as they are: a line starting with `#` or a quote is never a def, and code_end()
    reads a comment off the few lines where it matters.

    What _TRIPLE_OR_RUN.sub() would give (its matches in order: runs of code, comments and one-line
    strings kept as they are, triple-quoted strings masked), without running it over the whole text:
    only a `'''` or `\"\"\"` can start a string that spans lines (a backslash-newline inside a one-line
    string aside), so the regex is run only from the start of a line holding one of those, where its
    scan is between tokens as it would have been: before that line's newline no comment, one-line
    string or triple-quoted string can be open (none of the last starts there; a backslash before the
    newline, which might continue a one-line string, has the regex run from the last match's end
    instead). Where nothing but code precedes the quotes on their line, and the string ends, not even
    that: the string ends at the first of its quotes not escaped by a backslash, as the regex reads
    it. The regex scanned all 650 kB of vLLM a verify reads, about a tenth of a cold verify."""
    out = []
    copied = position = 0  # text[:copied] is in out; `position` is where the regex's scan is between matches
    singles, doubles = text.find("'''"), text.find('"""')
    while True:
        if 0 <= singles < position:
            singles = text.find("'''", position)
        if 0 <= doubles < position:
            doubles = text.find('"""', position)
        quotes = doubles if singles < 0 or 0 <= doubles < singles else singles
        if quotes < 0:
            break
        newline = text.rfind("\n", position, quotes)
        start = position if newline < 0 else newline + 1
        if start > position and "\\" in text[max(position, start - 3):start - 1]:
            start = position  # a backslash ends the line before: the scan from the last match on
        end = -1
        if not any(character in text[start:quotes] for character in "'\"#"):
            end = _string_end(text, quotes)
        if end < 0:  # something else on the line before it, or no end: the regex itself from `start`
            match = _TRIPLE_OR_RUN().search(text, start)
            if match is None:
                break
            position = match.end()
            if match.lastgroup != "triple":
                continue  # a run: kept as it is, the scan goes on from its end
            quotes, end = match.start(), position
        position = end
        if "\n" in text[quotes:end]:
            first, *rest = text[quotes:end].split("\n")
            # A string's later lines keep their indentation: a docstring's text is as deep as its code.
            out += [text[copied:quotes], "\n".join([STRING_MARK * len(first)] + [_masked_string_line(piece) for piece in rest])]
            copied = end
    out.append(text[copied:])
    return "".join(out)


def _string_end(text, start):
    """Where the triple-quoted string opening at `start` ends (after its closing quotes), as
    _TRIPLE_OR_RUN's `triple` reads it: at the first of its quotes after the opening that no
    backslash escapes (an odd run of them before); -1 when it does not end."""
    quotes = text[start:start + 3]
    body = start + 3
    find = body
    while True:
        closing = text.find(quotes, find)
        if closing < 0:
            return -1
        backslash = closing
        while backslash > body and text[backslash - 1] == "\\":
            backslash -= 1
        if (closing - backslash) % 2 == 0:
            return closing + 3
        find = closing + 1  # the first quote is escaped: the scan goes on after it


def _masked_string_line(piece):
    text = piece.lstrip(" \t")
    return piece[:len(piece) - len(text)] + STRING_MARK * len(text)


def code_end(line):
    """How long a (masked) line is without its comment and trailing blanks."""
    if "#" not in line:
        return len(line.rstrip())  # no comment: the regex's answer, without it
    for match in _STRINGS_AND_COMMENTS().finditer(line):
        if match.group().startswith("#"):
            return len(line[:match.start()].rstrip())
    return len(line.rstrip())


def _has_code(line):
    """code_end(line) > 0."""
    return bool(code_end(line))


class Part:
    """Where one def or class lies: its lines (0-based, end excluded), the line of its `def`/`class`,
    and the offsets in the text where those lines start (`*_at`; a part that runs to the text's end
    ends at len(text) + 1, as though a newline ended the text)."""

    __slots__ = ("start", "end", "definition", "name", "kind", "indent", "start_at", "end_at", "definition_at")

    def __init__(self, start, start_at, end, end_at, indent):
        self.start, self.start_at, self.end, self.end_at, self.indent = start, start_at, end, end_at, indent
        self.definition = self.definition_at = self.name = self.kind = None

    def define(self, number, at, text):
        """Note line `number` (at offset `at`) as the part's def or class line when `text` is one; True if it is."""
        found = _DEFINITION.match(text)
        if found:
            self.definition, self.definition_at = number, at
            self.name, self.kind = found.group(1), found.group().split()[0]
        return bool(found)


def _shallow(indent):
    """A line indented `indent` or less that is not blank, with the newline before it: what
    `\n[ \t]{0,indent}[^ \t\r\n]` matches, written so that a deeper line (most lines of a class)
    fails at once, where that regex's repeat gives back its blanks one by one before failing."""
    pattern = _SHALLOW.get(indent)
    if pattern is None:
        pattern = _SHALLOW[indent] = re.compile(
            r"\n[^ \t\r\n]" if indent == 0 else r"\n(?![ \t]{%d}|[ \t]*(?:[\r\n]|$))" % (indent + 1))
    return pattern


def _starting(lowest, indent):
    """A line indented `lowest` to `indent` that _PART_START matches at (a def, a class, a decorator),
    with the newline before it; the indentation is its group 1."""
    pattern = _STARTING.get((lowest, indent))
    if pattern is None:  # a deeper line fails at its lookahead (see _shallow)
        pattern = _STARTING[lowest, indent] = re.compile(
            r"\n(?![ \t]{%d})([ \t]{%d,%d})(?:(?:async[^\S\n]+def|def|class)\b|@)" % (indent + 1, lowest, indent))
    return pattern


class _Lines:
    """The masked text of a module (_masked), its lines read by their offsets: none is listed."""

    def __init__(self, text):
        self.masked = _masked(text)

    def line(self, at):
        """The line starting at offset `at`, without its newline."""
        end = self.masked.find("\n", at)
        return self.masked[at:end if end >= 0 else len(self.masked)].rstrip("\r\n")

    def previous(self, at):
        """Where the line before the one at `at` starts (`at` may be len(text) + 1, the end)."""
        return self.masked.rfind("\n", 0, at - 1) + 1

    def next(self, at):
        """Where the line after the one at `at` starts (len(text) + 1 after the last)."""
        end = self.masked.find("\n", at)
        return end + 1 if end >= 0 else len(self.masked) + 1

    def counted(self, start, first_char):
        """The text of the line at `start` (its first character at `first_char`) when it counts for the
        cutting, else None: a line that opens a statement, not a comment, not after a backslash, not a
        closing bracket. A line inside a string counts (a statement may start with one): a part cut
        there leaves text that does not parse around it."""
        masked = self.masked
        if masked[first_char] in ")]}#":
            return None  # a closing bracket, a comment's line
        if masked[max(0, start - 3):start].rstrip("\r\n").endswith("\\"):
            previous = self.line(self.previous(start))
            if previous[:code_end(previous)].endswith("\\"):
                return None  # a backslash continuation (not one a comment ends with)
        end = masked.find("\n", first_char)
        return masked[first_char:end if end >= 0 else len(masked)].rstrip()

    def cuts(self, begin, first, end, last, indent, outer=None):
        """The parts at `indent` among lines first..last-1 (from offset `begin` to offset `end`; `last`
        None: to the text's end), each without its trailing blank lines. With `outer` (a class's indentation, `indent` its body's first
        def's), a def, class or decorator line deeper than `outer` and shallower than `indent` puts the
        parts at its depth instead.

        The lines indented `indent` or less that count (counted()) are read in order. While no part is
        open, only a def, class or decorator line can change anything, one at `indent` or between
        `outer` and it: the search skips to the next such line in C, past the rest (most of a module);
        an open part is ended by the next line that counts, whatever it is."""
        masked = self.masked
        any_line = _shallow(indent)
        part_line = _starting(indent if outer is None else outer + 1, indent)
        parts, current = [], None
        counted_at, number = begin, first  # line numbers are counted on from here
        search = max(begin - 1, 0)  # where the next line's newline is looked for
        at_text_start = begin == 0
        while True:
            if at_text_start:  # the text's first line, which has no newline before it
                at_text_start = False
                start = first_char = 0
                while first_char <= indent and masked[first_char:first_char + 1] in (" ", "\t"):
                    first_char += 1
                if first_char > indent or first_char >= min(end, len(masked)) or masked[first_char] in "\r\n":
                    continue
            elif current is None:
                match = part_line.search(masked, search, end)
                if match is None:
                    break
                start, first_char = match.start() + 1, match.end(1)
                search = start
            else:
                match = any_line.search(masked, search, end)
                if match is None:
                    break
                start = match.start() + 1
                if indent:  # the line's indentation: `indent` blanks at most (the lookahead)
                    head = masked[start:start + indent + 1]
                    first_char = start + len(head) - len(head.lstrip(" \t"))
                else:
                    first_char = start
                search = start
            text = self.counted(start, first_char)
            if text is None:
                continue
            number += masked.count("\n", counted_at, start)
            counted_at = start
            depth = first_char - start
            starts = _PART_START.match(text)
            if starts and outer is not None and outer < depth < indent:
                return self.cuts(begin, first, end, last, depth, outer)
            starts = starts and depth == indent
            if current is not None:
                if current.definition is None and starts:
                    current.define(number, start, text)
                    continue  # a decorator's own lines, or its def
                current.end, current.end_at = number, start
                parts.append(current)
                current = None
            if starts:
                current = Part(number, start, last, end, indent)
                current.define(number, start, text)
        if current is not None:
            if last is None:  # the text's last line: counted only for a part that reaches it
                current.end = number + masked.count("\n", counted_at) + 1
            parts.append(current)
        return [self._trimmed(part) for part in parts if part.definition is not None]

    def _trimmed(self, part):
        while part.end - 1 > part.definition:
            previous = self.previous(part.end_at)
            if _has_code(self.line(previous)):
                break
            part.end, part.end_at = part.end - 1, previous
        return part

    def body_indent(self, part):
        """The indentation of the first def, class or decorator line in a class part's body (None when
        there is none): its methods' indentation, unless a shallower one follows (cuts() then says so)."""
        after = self.masked.find("\n", part.definition_at)  # the newline that ends the class's line
        if after < 0:
            return None
        for match in _CANDIDATE.finditer(self.masked, after, part.end_at):
            if len(match.group(1)) > part.indent:
                return len(match.group(1))
        return None


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
        self._masked = None
        self._whole = None
        #: A tree with lazy parts went out: from then on, a part that cannot be read is PartUnreadable.
        self._handed_out = False

    def tree(self):
        """The module's tree with its defs and classes left lazy (SyntaxError as ast.parse raises it)."""
        self._masked = _Lines(self.text)
        parts = self._masked.cuts(0, 0, len(self.text) + 1, None, 0)
        if not parts:
            return self._parse_whole()
        try:
            module = ast.parse(self._with_passes(parts, 0, len(self.text) + 1), filename=self.filename)
        except SyntaxError:
            return self._parse_whole()
        if not self._replace(module.body, parts):
            return self._parse_whole()
        self._handed_out = True
        return module

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
                if self._masked is None or not self._handed_out:
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
        parsed = self._parse_part(part)
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
            at, following = following, self._masked.next(following)
            end = code_end(self._masked.line(at))
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

    def _parse_part(self, part):
        """The part's one statement, parsed at its own lines (a class's methods as parts); None when
        the part does not parse to exactly that statement."""
        if part.indent and not part.start:
            return None
        methods = []
        if part.kind == "class":
            methods = self._methods(part)
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
                # The class ended at its last method's `pass`; it ends where that method's text does.
                node.end_lineno, node.end_col_offset = last.end, self._end_column(last)
        return node

    def _end_column(self, part):
        """Where the code of `part`'s last line ends, in UTF-8 bytes as ast counts (a comment left out)."""
        at = self._masked.previous(part.end_at)
        return len(self.text[at:part.end_at - 1][:code_end(self._masked.line(at))].encode("utf-8"))

    def _methods(self, part):
        """The methods of a class part, cut at its body's indentation."""
        indent = self._masked.body_indent(part)
        if indent is None:
            return []
        return self._masked.cuts(self._masked.next(part.definition_at), part.definition + 1, part.end_at, part.end,
                                 indent, part.indent)

    def _from_whole(self, part):
        """The part's node in the whole module's parse (a cut the text misread)."""
        for node in ast.walk(self._parse_whole()):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    and node.lineno == part.definition + 1 and node.col_offset == part.indent):
                return node
        raise PartUnreadable("%s: line %d is not where the reading by parts put a %s"
                             % (self.filename, part.definition + 1, part.kind))
