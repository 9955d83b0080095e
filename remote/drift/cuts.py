"""Where a module's text is cut into parts (drift/parts.py): each top-level def and class, and each
method of a class, found in the text without a parse.

Where the parts are cut is found in the text: a line starts a part when, outside strings and
comments (masked first), it begins with `def`, `async def`, `class` or a decorator at the part's
indentation, and the part ends before the next line at that indentation or less (closing brackets
and string lines aside). A cut this reading gets wrong is caught by a parse: what is left around the
parts must parse (else the whole module is parsed at once, as before), and each part must parse to
exactly the one statement it was cut for (else it is taken from a parse of the whole module).
Checked against ast.parse on every module of vLLM 0.11, 0.16 and 0.33, speculators and hs-connectors:
the same nodes, fields and positions (5,600 files).
"""
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
#: A quote or a comment's `#`: on a line before a triple quote, where masked() lets the regex read on.
_QUOTE_OR_COMMENT = re.compile(r"['\"#]")
_PART_START = re.compile(r"(?:async\s+def|def|class)\b|@")
_DEFINITION = re.compile(r"(?:async\s+def|def|class)\s+([A-Za-z_][A-Za-z0-9_]*)")
#: What a masked string's characters become (no quote, bracket or `#` that could mislead the cutting),
#: but the first of each later line's, which says the line goes on a statement: it never starts or
#: ends a part, however far left a string's text sits.
STRING_MARK, CONTINUED_MARK = "\x01", "\x02"
#: A line that may start a part (a def, a class or a decorator, at any indentation), with the newline
#: before it. The line-matching patterns here start at the newline, not at a MULTILINE `^`: the regex
#: finds a newline in C, where `^` is tried at every character (five times slower over a module).
_CANDIDATE = re.compile(r"\n([ \t]*)(?:(?:async[ \t]+)?def\b|class\b|@)")
#: What the first character of a line that does not count for the cutting may be (MaskedLines.counted).
_NOT_COUNTED = ")]}#" + CONTINUED_MARK
#: {indent: _shallow(indent)}, {(lowest, indent): _starting(lowest, indent)}: compiled when first used.
_SHALLOW = {}
_STARTING = {}


def masked(text):
    """`text` with the characters of its strings that span lines as STRING_MARK (newlines and their
    later lines' indentation kept, each later line's first character CONTINUED_MARK): no line of
    theirs can pass for code. Comments and one-line strings are left as they are: a line starting
    with `#` or a quote is never a def, and code_end() reads a comment off the few lines where it
    matters.

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
        if _QUOTE_OR_COMMENT.search(text, start, quotes) is None:
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
        if text.find("\n", quotes, end) >= 0:
            first, *rest = text[quotes:end].split("\n")
            # A string's later lines keep their indentation: a docstring's text is as deep as its code.
            out += [text[copied:quotes], STRING_MARK * len(first), "\n"]
            out.append("\n".join([piece[:len(piece) - len(words)] + (CONTINUED_MARK + STRING_MARK * (len(words) - 1)
                                                                    if words else "")
                                  for piece in rest for words in (piece.lstrip(" \t"),)]))
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
    """Where one def or class lies: its lines (0-based, end excluded: up to the next line of code no
    deeper than it, the blank and comment lines before that line included), the line of its
    `def`/`class`, and the offsets in the text where those lines start (`*_at`; a part that runs to
    the text's end ends at len(text) + 1, as though a newline ended the text)."""

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


class MaskedLines:
    """The masked text of a module (masked), its lines read by their offsets: none is listed.

    With mask=False the text is read as it is: a string's line may then pass for a def or end a part,
    which the parse that checks every cut finds (drift/parts.py reads the module again masked), but
    nine modules of ten have no such line, and masking is a fifth of reading a module by parts."""

    def __init__(self, text, *, mask=True):
        self.masked = masked(text) if mask else text

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
        closing bracket, not a string's later line (CONTINUED_MARK). A string's first line counts (a
        statement may start with one)."""
        masked = self.masked
        if masked[first_char] in _NOT_COUNTED:
            return None  # a closing bracket, a comment's line, a string's later line
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
        return [part for part in parts if part.definition is not None]

    def last_code_line(self, part):
        """(line, offset) where `part`'s code ends: after its last line that is neither blank nor a
        comment (the lines after it are the part's too, as the cutting ends it: a parse reads them as
        it reads blank lines)."""
        end, end_at = part.end, part.end_at
        while end - 1 > part.definition:
            previous = self.previous(end_at)
            if _has_code(self.line(previous)):
                break
            end, end_at = end - 1, previous
        return end, end_at

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
