"""The options of vLLM's server parser, found the way vLLM builds it (nothing imported).

`python -m <entry> [serve]` reaches a call of `make_arg_parser`; that function adds a few options itself
and the rest through `<Class>.add_cli_args(parser)` (FrontendArgs, AsyncEngineArgs), which add theirs
literally (`add_argument("--port", ...)`), through other classes' add_cli_args (AsyncEngineArgs calls
EngineArgs'), or from a config class's fields (`get_kwargs(cls)`, then `add_argument(f"--{key}")`).
Every name is resolved through imports, module-level or inside the function, so a class that moves to
another module (vLLM 0.33 moved FrontendArgs to entrypoints/common/cli_args.py) is still found.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from drift import findings as F
from drift.classes import body_statements, class_member, info
from drift.refs import ClassRef, FunctionRef
from drift.symbols import absolute_module

#: The function vLLM's server entry points build their parser with (entrypoints/*/cli_args.py).
BUILDER = "make_arg_parser"
#: The classmethod/staticmethod that adds a class's options to a parser.
ADD_CLI_ARGS = "add_cli_args"
#: vLLM's helper turning a config dataclass's fields into add_argument keyword arguments.
FIELDS_HELPER = "get_kwargs"
#: How far from the entry module the builder's call is looked for (entry -> its main -> the parser).
SEARCH_DEPTH = 3


@dataclass
class ServerParser:
    """The parser `python -m <entry>` builds: where it is built, and {option: Location adding it}."""

    builder: F.Location
    options: dict = field(default_factory=dict)

    def knows(self, flag):
        """Whether the parser takes `flag`; vLLM's FlexibleArgumentParser reads `_` in an option as `-`, and
        its config flags are bool fields added as argparse.BooleanOptionalAction (engine/arg_utils.py
        get_kwargs), which also take `--no-<flag>`."""
        option = "--" + flag[2:].replace("_", "-")
        return option in self.options or (option.startswith("--no-") and "--" + option[5:] in self.options)


def _local_binding(module, name):
    """(source module, imported name) of a `from X import name` anywhere in `module` (inside functions too)."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return absolute_module(module.package, node.level, node.module), alias.name
    return None


def _resolve_name(index, module, name):
    """What `name` used in `module` refers to: its top-level binding, else a function-local import."""
    found = index.lookup(module.name, name)
    if isinstance(found, (ClassRef, FunctionRef)):
        return found
    local = _local_binding(module, name)
    return index.lookup(*local) if local and index.tree.owns(local[0]) else found


def _imported_modules(index, module):
    """The provider's modules `module` imports, at top level or inside functions, in source order."""
    names = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = absolute_module(module.package, node.level, node.module)
            names += [source + "." + alias.name for alias in node.names] + [source]
    found = []
    for name in names:
        target = index.tree.module(name)
        if target is not None and target.tree is not None and index.tree.owns(name) and target not in found:
            found.append(target)
    return found


def declares_subcommand(module, word):
    """Whether `module` defines a CLI subcommand class named `word` (vLLM's CLISubcommand: `name = "serve"`)."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)
                        and statement.value.value == word
                        and any(isinstance(t, ast.Name) and t.id == "name" for t in statement.targets)):
                    return True
    return False


def _builder_call(index, module):
    """(call node, FunctionRef) of a call of the parser builder in `module`, or None."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == BUILDER:
            builder = _resolve_name(index, module, BUILDER)
            if isinstance(builder, FunctionRef):
                return node, builder
    return None


def find_builder(index, entry, subcommand=None):
    """The FunctionRef of the parser builder `python -m <entry> [<subcommand>]` calls, or None: the entry
    module (or, with a subcommand, the imported module declaring it), then the modules they import."""
    start = index.tree.module(entry)
    if start is None or start.tree is None:
        return None
    frontier = [start]
    if subcommand:
        frontier = [m for m in _imported_modules(index, start) if declares_subcommand(m, subcommand)]
    seen = set()
    for _ in range(SEARCH_DEPTH):
        following = []
        for module in frontier:
            if module.name in seen:
                continue
            seen.add(module.name)
            found = _builder_call(index, module)
            if found is not None:
                return found[1]
            following += _imported_modules(index, module)
        frontier = following
    return None


def _class_of(index, function, expr, cls):
    """The class `expr` names inside `function` (`cls` for the class being read), or None."""
    if isinstance(expr, ast.Name) and expr.id == "cls" and cls is not None:
        return cls
    if isinstance(expr, ast.Name):
        found = _resolve_name(index, function.module, expr.id)
        return found if isinstance(found, ClassRef) else None
    return None


def _fields(index, cls):
    """{field name: (module, node)} of the annotated fields of `cls` and its readable bases."""
    fields = {}
    for entry in reversed(info(index, cls).classes()):
        for node in body_statements(entry.node.body):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                fields[node.target.id] = (entry.module, node)
    return fields


def _read_function(index, function, cls, options, seen):
    """Add the options `function` (a FunctionRef) adds to `options`; `cls`: the class it is called on."""
    key = (id(function.node), id(cls.node) if cls is not None else None)
    if key in seen:
        return
    seen.add(key)
    generated, config_classes = False, []
    for node in ast.walk(function.node):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    options.setdefault(arg.value, F.Location(function.module, node.lineno))
                elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant) \
                        and str(arg.values[0].value).startswith("--"):
                    generated = True  # options named after the keys of get_kwargs(<config class>)
        elif isinstance(func, ast.Attribute) and func.attr == ADD_CLI_ARGS:
            target = _class_of(index, function, func.value, cls)
            if target is not None:
                _read_class(index, target, options, seen)
        elif isinstance(func, ast.Name) and func.id == FIELDS_HELPER and node.args:
            config = _class_of(index, function, node.args[0], cls)
            if config is not None:
                config_classes.append(config)
    if generated:
        for config in config_classes:
            for name, (module, node) in _fields(index, config).items():
                options.setdefault("--" + name.replace("_", "-"), F.Location(module, node.lineno))


def _read_class(index, cls, options, seen):
    """Add the options `cls.add_cli_args` adds (inherited or its own) to `options`."""
    method = class_member(index, cls, ADD_CLI_ARGS)
    if isinstance(method, FunctionRef):
        _read_function(index, method, cls, options, seen)


def server_parser(index, *, entry, subcommand=None):
    """The ServerParser of `python -m <entry> [<subcommand>]`, or None when no parser builder is reached."""
    builder = find_builder(index, entry, subcommand)
    return None if builder is None else built_by(index, builder)


def built_by(index, builder):
    """The ServerParser the builder (a FunctionRef) makes."""
    options = {}
    _read_function(index, builder, None, options, set())
    return ServerParser(builder=F.Location.of(builder.module, builder.node), options=options)
