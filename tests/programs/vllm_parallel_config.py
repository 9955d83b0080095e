"""What vLLM makes of server command lines: each parsed by its own parser and turned into its engine
config, as the server would at start-up (nothing loaded, no process started).

    <python of a vLLM environment> tests/programs/vllm_parallel_config.py ARGV.json

ARGV.json is a list of argv (each the words after the interpreter: `-m vllm.entrypoints.openai.api_server
...`, `-m vllm.entrypoints.cli.main serve ...`, or `<path>/vllm_serve.py ...`, as specrig starts them).
Prints one JSON line: per argv, the parallel config vLLM made ({"headless", "data_parallel_size", ...}), or
{"error": "<type>: <message>"} when the parser or the config refused it.
"""
import json
import sys


def parallel_config(words):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if words[:2] == ["-m", "vllm.entrypoints.openai.api_server"]:
        # The module's own parser (launchers/api_server/entry.py main()).
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(words[2:])
        validate_parsed_serve_args(args)
    else:
        # `vllm serve`: its subparser, as cli/main.py and remote/run/server/vllm_serve.py build it.
        rest = words[3:] if words[:3] == ["-m", "vllm.entrypoints.cli.main", "serve"] else words[1:]
        parser = FlexibleArgumentParser(prog="vllm")
        serve = ServeSubcommand()
        serve.subparser_init(parser.add_subparsers(dest="subparser", required=True))
        args = parser.parse_args(["serve"] + rest)
        serve.validate(args)
        if args.model_tag is not None:
            args.model = args.model_tag
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=args.headless)
    parallel = config.parallel_config
    return {"headless": args.headless, "model": config.model_config.model,
            **{key: getattr(parallel, key) for key in (
                "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "data_parallel_size_local",
                "data_parallel_rank", "data_parallel_master_ip", "data_parallel_rpc_port", "nnodes", "node_rank",
                "master_addr", "master_port")}}


def main(path):
    with open(path) as handle:
        argvs = json.load(handle)
    answers = []
    for words in argvs:
        try:
            answers.append(parallel_config(words))
        except (Exception, SystemExit) as exc:  # a refusal is the answer (argparse exits)
            answers.append({"error": "%s: %s" % (type(exc).__name__, exc)})
    print(json.dumps(answers))


if __name__ == "__main__":
    main(sys.argv[1])
