"""The contract's points in the command lines specrig runs: the flags of the server's parser (C17),
speculators' CLI options (C18), the module the server is started from (C19), the render server's command (C23).
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


#: Where `vllm launch` is (vLLM 0.18.0 and later), relative to the package; the render server's subcommand.
LAUNCH_COMMAND = ("entrypoints.cli.launch",)
RENDER_SUBCOMMAND = "render"
#: specrig's render server (run/server/render.py): what in it builds the command, whose flags are checked.
RENDER_MODULE = "run.server.render"
RENDER_COMMAND = ("server_argv", "argv_on", "RENDER_OPTIONS", "RENDER_SWITCHES")


def render_flags(ctx):
    """The flags the render server's command may pass: those its builders write and those it takes over from the
    model's server command. Read from render.py's source, as a consumer is, not imported (its socket import is
    3 ms of a verify)."""
    module = ctx.consumer_trees["launch"].module(RENDER_MODULE)
    parts = [node for node in module.tree.body
             if (isinstance(node, ast.FunctionDef) and node.name in RENDER_COMMAND)
             or (isinstance(node, ast.Assign) and any(getattr(t, "id", None) in RENDER_COMMAND for t in node.targets))]
    return sorted({text for node in parts for text in string_constants(node) if text.startswith("--")})


def check_render_flags(ctx):
    """`vllm launch render` exists and its parser (the serve parser: LaunchSubcommandBase.add_cli_args) knows
    every flag the render server's command passes."""
    launch = ctx.module(LAUNCH_COMMAND)
    if launch is None:
        # vllm_serve.py, read as a consumer, imports it: its missing-symbol finding names it.
        raise Skip("vLLM has no `vllm launch` (vllm/entrypoints/cli/launch.py, 0.18.0 and later)")
    if not parser.declares_subcommand(launch, RENDER_SUBCOMMAND):
        return [Problem("`vllm launch` has no %s subcommand: the render server cannot start, and prepare-data "
                        "renders through the model's server." % RENDER_SUBCOMMAND, provider=F.Location(launch, 1),
                        callee=launch.name, detail=RENDER_SUBCOMMAND)]
    found = ctx.parser_of(launch.name)
    if found is None:
        raise Skip("no call of %s reached from %s" % (parser.BUILDER, launch.relpath))
    return [Problem("`vllm launch render`'s parser (built by %s) has no %s: the render server refuses to start, and "
                    "prepare-data renders through the model's server." % (parser.BUILDER, flag),
                    provider=found.builder, callee=found.builder.module.name + "." + parser.BUILDER, detail=flag)
            for flag in render_flags(ctx) if not found.knows(flag)]


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
