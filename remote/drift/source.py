"""Python source of installed packages, read lazily: a module is parsed the first time it is asked for."""
from __future__ import annotations

import os
import re

from base.contract import COMPILED_MANIFEST, COMPILED_SUFFIXES
from drift import syntax as ast
from drift.parts import PartedSource
from drift.records import record

#: What matters past a header's last node: brackets (of a `def f[T: int]()` too), its colon, a comment.
_HEADER_TOKENS = re.compile(rb"[()\[\]{}:#]")
#: How many characters Module counts the newlines of at once on the way to a line.
_BLOCK = 4096


# eq=False: a module is the one object its SourceTree parsed for a file; equal means the same object,
# not the same hundreds of lines.
@record(eq=False, unshown=("tree", "source"))
class Module:
    """One parsed module: its dotted name, file, AST and text."""

    name: str
    path: str
    #: `path` relative to the tree's root: what findings show.
    relpath: str
    is_package: bool
    #: None when this interpreter cannot parse the file (newer syntax).
    tree: ast.Module | None
    #: The file's text.
    source: str

    @property
    def package(self):
        """The package relative imports of this module start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]

    def _start_of(self, lineno):
        """Where line `lineno` (1-based; a line ends at "\n", as ast numbers them) starts in the text,
        None past its end. Found from the line a block of the text starts in (its newlines counted in
        C, each block's once), then newline by newline: a module has a few lines located, not worth
        splitting all its lines (vLLM's scheduler has 2,500: 0.5 ms and a megabyte of a cold verify
        for the six modules it located)."""
        if lineno < 1:
            return None
        text = self.source
        # The line each block's first character is in.
        blocks = self.__dict__.setdefault("_block_lines", [1])
        while blocks[-1] < lineno and len(blocks) * _BLOCK < len(text):
            blocks.append(blocks[-1] + text.count("\n", (len(blocks) - 1) * _BLOCK, len(blocks) * _BLOCK))
        block = len(blocks) - 1
        while block and blocks[block] >= lineno:
            block -= 1
        at, line = block * _BLOCK, blocks[block]
        while line < lineno:
            at = text.find("\n", at) + 1
            if not at:
                return None
            line += 1
        return at

    def _lines_from(self, lineno):
        """Line `lineno` and those after it, each without its newline."""
        text, at = self.source, self._start_of(lineno)
        while at is not None:
            end = text.find("\n", at)
            if end < 0:
                yield text[at:]
                return
            yield text[at:end]
            at = end + 1

    def line(self, lineno):
        """Line `lineno` (1-based) exactly as in the file, without its newline."""
        return next(self._lines_from(lineno), "").rstrip("\r")

    def text(self, start, end):
        """Lines start..end, what `sed -n START,ENDp` prints (without the last newline)."""
        begin = self._start_of(start)
        if begin is None:
            return ""
        return self.source[begin:self._start_of(end + 1)].rstrip("\r\n")

    def header_end(self, node):
        """Last line of a def/class header: the line of the ':' that closes it.

        The body's first line is no guide (a docstring or body may share the header's line, comments
        may sit between), so the text is read on from the header's last node (its return annotation,
        last parameter, default, base or keyword), or from the `def`/`class` of one that has none:
        past that node only closing brackets and comments can come before the colon (no string, which
        would take a tokenizer: tokenize's import and regexes were 2.5 ms of a cold verify)."""
        if isinstance(node, ast.ClassDef):
            last = node.bases + [keyword.value for keyword in node.keywords]
        elif node.returns is not None:
            last = [node.returns]
        else:
            arguments = node.args
            last = (arguments.posonlyargs + arguments.args + arguments.kwonlyargs + arguments.defaults
                    + [a for a in [arguments.vararg, arguments.kwarg] + arguments.kw_defaults if a is not None])
        if "type_params" in node._fields:  # Python 3.12: `def f[T: int](...)`, ahead of the parameters
            last = last + node.type_params
        if last:
            lineno, column = max((n.end_lineno, n.end_col_offset) for n in last)
        else:
            lineno, column = node.lineno, node.col_offset
        depth = 0
        for number, line in enumerate(self._lines_from(lineno), lineno):
            # ast counts columns in UTF-8 bytes.
            for match in _HEADER_TOKENS.finditer(line.encode("utf-8"), column if number == lineno else 0):
                token = match.group()
                if token == b"#":
                    break  # a comment, to the line's end
                if token == b":":
                    if depth <= 0:
                        return number
                else:
                    depth += 1 if token in b"([{" else -1
        return node.lineno

    def span(self, node):
        """(start, end) of a def/class header with its decorators, or of any other statement."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            return start, self.header_end(node)
        return node.lineno, getattr(node, "end_lineno", None) or node.lineno


class SourceTree:
    """The modules of some top-level packages under one root directory (site-packages or an unpacked wheel)."""

    #: Off once a part proved unreadable in this process (drift/verify.py then analyses again, whole).
    parts_enabled = True

    def __init__(self, root, packages, *, by_parts=False):
        if not os.path.isdir(root):
            raise ValueError("package root %r is not a directory" % (root,))
        self.root = os.path.abspath(root)
        self.packages = tuple(packages)
        #: Parse each def and class when first looked into (drift/parts.py): for a provider, of whose
        #: large modules the analysis reads a few names; a consumer is walked whole.
        self.by_parts = by_parts and SourceTree.parts_enabled
        self._modules = {}
        #: {dotted: _locate(dotted)}: a module's existence is asked about again and again.
        self._located = {}
        #: {directory: its entries}, listed once, when a module first proves missing there (a compiled
        #: one?): vLLM's names are looked for as modules first (`from vllm.config import VllmConfig`).
        self._listings = {}
        self._compiled = self._read_manifest()

    def _read_manifest(self):
        path = os.path.join(self.root, COMPILED_MANIFEST)
        if not os.path.exists(path):
            return frozenset()
        with open(path, encoding="utf-8") as handle:
            return frozenset(line.strip() for line in handle if line.strip())

    def owns(self, dotted):
        """True when `dotted` names a module inside one of this tree's packages."""
        top = dotted.partition(".")[0]
        return top in self.packages

    def _locate(self, dotted):
        """(path or None, is_package, exists) of module `dotted`."""
        found = self._located.get(dotted)
        if found is None:
            found = self._located[dotted] = self._look_for(dotted)
        return found

    def _look_for(self, dotted):
        # Joined as strings: os.path.join's loop, with a module's two or three joins, was a percent of a verify.
        base = self.root + os.sep + dotted.replace(".", os.sep)
        parent, stem = os.path.split(base)
        listed = self._listings.get(parent)
        # A directory listed already says without a stat that a name it lacks is no module.
        if listed is None or stem in listed or stem + ".py" in listed:
            init = base + os.sep + "__init__.py"
            if os.path.isfile(init):
                return init, True, True
            if os.path.isfile(base + ".py"):
                return base + ".py", False, True
            if os.path.isdir(base):
                return None, True, True  # a namespace package: no source, but importable
        if dotted in self._compiled:
            return None, False, True
        if listed is None:
            # isdir first: a verify's cache (drift/answers.py) records the answer, and a missing
            # directory's failed listing would leave nothing to see it appear by.
            listed = self._listings[parent] = frozenset(os.listdir(parent) if os.path.isdir(parent) else ())
        if any(entry.startswith(stem + ".") and entry.endswith(COMPILED_SUFFIXES) for entry in listed):
            return None, False, True
        return None, False, False

    def read_bytes(self, dotted):
        """The raw source of module `dotted` (b"" when it has none)."""
        path = self._locate(dotted)[0]
        if path is None:
            return b""
        with open(path, "rb") as handle:
            return handle.read()

    def exists(self, dotted):
        return self.owns(dotted) and self._locate(dotted)[2]

    def module(self, dotted):
        """The parsed module, or None when it has no readable source (missing, compiled, namespace)."""
        if dotted in self._modules:
            return self._modules[dotted]
        module = None
        if self.owns(dotted):
            path, is_package, _ = self._locate(dotted)
            if path is not None:
                module = self._parse(dotted, path, is_package)
        self._modules[dotted] = module
        return module

    def _parse(self, dotted, path, is_package):
        with open(path, "rb") as handle:
            data = handle.read()
        text = data.decode("utf-8", errors="replace")
        try:
            if self.by_parts:
                tree = PartedSource(text, path).tree()
            else:
                tree = ast.parse(text, filename=path)
        except SyntaxError:
            # Newer syntax than this interpreter parses: the module exists, its contents are unknown.
            tree = None
        return Module(name=dotted, path=path, relpath=path[len(self.root) + 1:],
                      is_package=is_package, tree=tree, source=text)

    def is_namespace(self, dotted):
        path, is_package, exists = self._locate(dotted)
        return exists and is_package and path is None

    @property
    def parsed_count(self):
        return sum(1 for m in self._modules.values() if m is not None)

    def walk(self, package):
        """Dotted names of every .py module under `package` (for consumers: they are small); a module is its own."""
        top = os.path.join(self.root, *package.split("."))
        if not os.path.isdir(top):
            return [package] if self.exists(package) else []
        names = []
        for directory, subdirs, files in os.walk(top):
            # Compiled files only: Python writes there at every first import, which would change
            # a listing verify's cache (drift/answers.py) checks.
            subdirs[:] = sorted(name for name in subdirs if name != "__pycache__")
            rel = os.path.relpath(directory, self.root)
            prefix = ".".join(rel.split(os.sep))
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                if name == "__init__.py":
                    names.append(prefix)
                else:
                    names.append(prefix + "." + name[:-3])
        return names
