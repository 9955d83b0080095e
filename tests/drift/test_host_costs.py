"""Where a cold verify's host work was cut (docs/benchmarks.md, issue 30), what it gives is what it gave."""
from __future__ import annotations

import ast

from drift.classes import assigned_self_attributes
from drift.parts import PartedSource, unparsed_text
from drift.refs import ClassRef
from drift.signatures import simple_text
from drift.source import Module
from drift.syntax import walk
from support.drift_wheels import sources


def test_simple_text_is_ast_unparse_where_it_answers():
    answered = 0
    for path, text in sources(("vllm", "0.16.0", "vllm/config")):
        for node in ast.walk(ast.parse(text)):
            values = []
            if isinstance(node, ast.arguments):
                values = node.defaults + [d for d in node.kw_defaults if d is not None]
            elif isinstance(node, (ast.AnnAssign, ast.Assign, ast.keyword)) and node.value is not None:
                values = [node.value]
            for value in values:
                text_ = simple_text(value)
                if text_ is not None:
                    answered += 1
                    assert text_ == ast.unparse(value), (path, value.lineno)
    assert answered > 500
    for source in ("-1", "-1.5", "1e400", "u'a'", "...", "(1,)", "()", "[a.b, 'c']", "f()", "a.b.c()", "f(1)",
                   "'it\\'s'", "b'x'", "x[0]", "(1, (2,))", "lambda: 1", "lambda: ['a/**']", "lambda x: x",
                   "lambda: (1,)", "lambda: lambda: 1", "lambda *a: 1", "lambda: -1", "-x", "1 .real"):
        value = ast.parse(source, mode="eval").body
        assert simple_text(value) in (None, ast.unparse(value)), source


def test_walk_is_ast_walk_without_expression_contexts():
    for path, text in sources(("speculators", "0.3.0", "speculators/data_generation")):
        tree = ast.parse(text)
        expected = [node for node in ast.walk(tree) if not isinstance(node, ast.expr_context)]
        assert list(walk(tree)) == expected, path


def test_a_method_that_cannot_assign_the_attribute_is_left_unparsed_and_the_answer_kept():
    text = (
        "class Holder:\n"
        "    def __init__(self):\n"
        "        self.size = 1\n"
        "    def other(self):\n"
        "        setattr(self, 'named', 2)\n"
        "    def third(self):\n"
        "        return self.size\n"
    )
    for name, parsed in (("size", {"__init__", "other", "third"}), ("named", {"other"}), ("absent", {"other"})):
        tree = PartedSource(text, "<test>").tree()
        module = Module(name="m", path="m.py", relpath="m.py", is_package=False, tree=tree, source=text)
        holder = ClassRef(module, tree.body[0], "Holder")
        whole = assigned_self_attributes(ClassRef(module, ast.parse(text).body[0], "Holder"))
        assert (assigned_self_attributes(holder, name).get(name) is None) == (whole.get(name) is None)
        methods = tree.body[0].body
        assert {m.name for m in methods if unparsed_text(m) is None} == parsed, name


def test_a_modules_lines_are_found_as_sed_prints_them_without_splitting_it():
    def expected_text(text: str, start: int, end: int) -> str:
        return "\n".join(text.split("\n")[start - 1:end]).rstrip("\r\n")

    located = 0
    texts = [text for _, text in sources(("vllm", "0.16.0", "vllm/v1/core/sched"))]
    # Line ends as ast counts them (\n and \r\n), not as str.splitlines does (a form feed, U+2028).
    texts += ["a = 1\r\nb = '\x0c'\r\n\r\nc = '\u2028'\nd = 4", "x\n", "", "\n\n"]
    for text in texts:
        module = Module(name="m", path="m.py", relpath="m.py", is_package=False, tree=None, source=text)
        count = text.count("\n") + 1
        for lineno in sorted({1, 2, 3, count // 2, count - 1, count, count + 1, count + 2}):
            assert module.line(lineno) == expected_text(text, lineno, lineno), lineno
            for end in (lineno, lineno + 1, lineno + 90, count + 5):
                assert module.text(lineno, end) == expected_text(text, lineno, end), (lineno, end)
                located += 1
    assert located > 100
