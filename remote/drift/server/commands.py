"""The contract's points in the command lines specrig runs: the flags of the server's parser (C17),
speculators' CLI options (C18), the module the server is started from (C19).
"""
import ast

from drift import findings as F
from drift.server import parser, startup
from drift.server.context import Problem, Skip, string_constants

#: The options specrig passes to speculators' CLI (docs/server-mode.md C18), per command module.
CLIENT_FLAGS = {
    "speculators.cli.generate_offline_data": (
        "--endpoint", "--preprocessed-data", "--output", "--concurrency", "--request-timeout", "--max-retries",
        "--max-consecutive-errors", "--max-samples", "--world-size", "--rank", "--validate-outputs"),
    "speculators.cli.prepare_data": (
        "--model", "--data", "--output", "--seq-length", "--render-endpoint", "--max-samples"),
}


def _launch_flags(ctx):
    """The flags of the server command specrig's launch builds for this vLLM (its own decisions included)."""
    decided = startup.launch_settings(ctx=ctx)
    settings = {"model": "MODEL", "num_hidden_layers": 8, "tensor_parallel_size": 1, "data_parallel_size": 1,
                "port": 8000, "host": "127.0.0.1", "distribution": decided["distribution"],
                "enable_scale_out": decided["enable_scale_out"],
                "extra_args": [entry["flag"] for entry in decided["startup_flags"]]}
    return [w for w in ctx.launch.server_argv(settings) if w.startswith("--")]


def check_server_flags(ctx):
    found = ctx.server_parser()
    if found is None:
        words, _ = ctx.launch.INVOCATIONS[ctx.server_distribution]
        raise Skip("no call of %s reached from `python %s`" % (parser.BUILDER, " ".join(words)))
    problems = []
    for flag in _launch_flags(ctx):
        if not found.knows(flag):
            problems.append(Problem("vLLM's server parser (built by %s, with the options of the classes it adds) "
                                    "has no %s: the server refuses to start." % (parser.BUILDER, flag),
                                    provider=found.builder, callee=found.builder.module.name + "." + parser.BUILDER,
                                    detail=flag))
    return problems


def check_entry_point(ctx):
    words, _ = ctx.launch.INVOCATIONS[ctx.server_distribution]
    target = words[1]
    module = ctx.tree.module(target)
    if module is None or module.tree is None:
        return [Problem("specrig starts the server as `python -m %s`, which this vLLM does not have." % target,
                        callee=target)]
    return []


def _cli_options(module):
    """{option: def node} of a typer CLI module: each command parameter declared with typer.Option (its name
    with dashes, and --no-<name>), and every "--..." string given to typer.Option explicitly."""
    options = {}
    for node in ast.walk(module.tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for arg in node.args.args + node.args.kwonlyargs:
            if arg.annotation is not None and "Option" in ast.dump(arg.annotation):
                name = "--" + arg.arg.replace("_", "-")
                options.setdefault(name, node)
                options.setdefault("--no-" + name[2:], node)
                for text in string_constants(arg.annotation):
                    if text.startswith("--"):
                        options.setdefault(text.split("/")[0], node)
    return options


def check_client_flags(ctx):
    tree = ctx.consumer_trees.get("speculators")
    if tree is None:
        raise Skip("speculators is not given")
    problems = []
    for module_name, flags in sorted(CLIENT_FLAGS.items()):
        module = tree.module(module_name)
        if module is None or module.tree is None:
            problems.append(Problem("speculators has no %s: specrig's client cannot run it." % module_name,
                                    callee=module_name, detail="module"))
            continue
        options = _cli_options(module)
        command = next(iter(options.values()), None)
        where = F.Location(module, command.lineno) if command is not None else F.Location(module, 1)
        for flag in flags:
            if flag not in options:
                problems.append(Problem("%s has no option %s, which specrig passes." % (module_name, flag),
                                        callee=module_name, detail=flag, consumer=where))
    return problems
