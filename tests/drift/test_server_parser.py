"""The server's options and its start-up refusals, read from every vLLM release 0.16-0.33 (real wheels).

The parser is read the way vLLM builds it (drift/server/parser.py); what it finds is compared with a plain
text search of the release's source: an option exists where its literal "--flag" or its dataclass field
(`flag_name: ...`) appears under vllm/entrypoints/ or vllm/engine/.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from base import nodes
from base import server_command as launch
from drift.server import parser, startup
from drift.server.context import Context
from run.server import server_preflight
from support.drift_wheels import VLLM_RELEASES, compat_report, in_source, root

#: The releases whose config validation refuses chunked prefill with ExampleHiddenStatesConnector
#: (vllm/config/vllm.py _post_init_kv_transfer_config; docs/server-mode.md section 9).
CHUNKED_PREFILL_REFUSED = {"0.22.0", "0.22.1", "0.23.0"}
#: Every flag a server launch of specrig may pass: base/server_command.py's, plan.py's extras, a multi-node job's
#: (nodes.py), the start-up flags.
INVOCATION = launch.INVOCATIONS["vllm"][0]
NODE_FLAGS = [w for mode in ("dp", "pp") for w in nodes.server_argv(
    ["python"] + INVOCATION + ["M"], {"role": nodes.WORKER, "mode": mode, "node_rank": 1, "master_addr": "h",
                                      "rendezvous_port": 1, "data_parallel_size": 2, "data_parallel_size_local": 1,
                                      "pipeline_parallel_size": 2, "nnodes": 2},
    distribution="vllm", invocation=INVOCATION, serve_program="vllm_serve.py") if w.startswith("--")]


def launch_flags(decided: dict) -> list[str]:
    argv = launch.server_argv({
        "model": "M", "num_hidden_layers": 8, "tensor_parallel_size": 1, "data_parallel_size": 2, "port": 1,
        "host": "h", "distribution": "vllm", "enable_scale_out": True,
        "extra_args": ["--load-format", "dummy", "--hf-overrides", "{}", "--gpu-memory-utilization", "0.5",
                       "--max-num-batched-tokens", "8192", "--enforce-eager", "--model", "M", "--headless"]
        + [e["flag"] for e in decided["startup_flags"]]})
    return [w for w in argv if w.startswith("--")]


def context(version: str) -> Context:
    return Context([], root("vllm", version), None)


@pytest.mark.slow
@pytest.mark.parametrize("version", VLLM_RELEASES)
def test_server_options_and_refusals(version):
    ctx = context(version)
    found = ctx.server_parser()
    assert found is not None, "no make_arg_parser reached from `vllm serve` on %s" % version
    vllm = Path(root("vllm", version)["root"]) / "vllm"
    decided = startup.launch_settings(ctx=ctx)
    for flag in launch_flags(decided) + NODE_FLAGS:
        if flag.startswith("--no-"):
            assert found.knows(flag) and in_source(vllm, "--" + flag[5:]), flag
        else:
            assert found.knows(flag) == in_source(vllm, flag), "%s on vLLM %s" % (flag, version)
    # The launch asks for the render endpoint exactly where the parser has the flag.
    assert decided["enable_scale_out"] == in_source(vllm, "--enable-scale-out")
    # A start-up refusal of chunked prefill, and the flag avoiding it, exactly on the releases that have it.
    flags = [e["flag"] for e in decided["startup_flags"]]
    assert flags == (["--no-enable-chunked-prefill"] if version in CHUNKED_PREFILL_REFUSED else [])
    data = compat_report("0.9.0", version)
    ids = {f["id"]: f for f in data["findings"]}
    assert not [i for i in ids if i.startswith("server-contract:server-flags")], version
    refusal = ids.get("startup-refusal:enable_chunked_prefill")
    assert (refusal is not None) == (version in CHUNKED_PREFILL_REFUSED)
    if refusal:
        assert refusal["severity"] == "note" and "--no-enable-chunked-prefill" in refusal["explanation"]
        assert refusal["provider"]["file"] == "vllm/config/vllm.py"
        assert "does not support chunked prefill" in refusal["provider"]["text"] + refusal["explanation"]


def test_moved_frontend_args_found_through_imports():
    """vLLM 0.33 defines FrontendArgs in entrypoints/common/cli_args.py: --host and --port are still found,
    and the builder is where `vllm serve` imports it from."""
    found = context("0.33.0").server_parser()
    assert found.builder.module.relpath == "vllm/entrypoints/common/cli_args.py"
    assert found.options["--host"].module.relpath == "vllm/entrypoints/common/cli_args.py"
    assert found.knows("--port") and found.knows("--kv_transfer_config") and not found.knows("--no-such-flag")
    assert parser.server_parser(context("0.33.0").index, entry="vllm.entrypoints.no_such_module") is None


def vllm_environment(tmp_path: Path, version: str) -> str:
    """The python of a venv whose only vLLM is release `version`'s source (its unpacked wheel) with its
    metadata: what plan.make reads on a host, nothing installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    (site / "vllm").symlink_to(Path(root("vllm", version)["root"]) / "vllm")
    (site / f"vllm-{version}.dist-info").mkdir()
    (site / f"vllm-{version}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return str(tmp_path / "venv" / "bin" / "python")


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.21.0", "0.22.0"])
def test_plan_passes_the_flag_where_the_installed_vllm_refuses(tmp_path, version):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8,
                                                   "hidden_size": 64}))
    driver = {"model": str(model), "output_dir": str(tmp_path / "out"), "dataset": str(tmp_path / "data.jsonl")}
    made, check = server_preflight.planned(driver, vllm_environment(tmp_path, version))
    refused = version in CHUNKED_PREFILL_REFUSED
    assert ("--no-enable-chunked-prefill" in made["server_argv"]) == refused
    assert "--enable-scale-out" not in made["server_argv"] and made["vllm_version"] == version
    if refused:
        assert made["startup_flags"] == [{"flag": "--no-enable-chunked-prefill", "because": (
            "vllm %s refuses enable_chunked_prefill with ExampleHiddenStatesConnector (vllm/config/vllm.py:738)"
            % version)}]
        assert check["ok"] and "passes --no-enable-chunked-prefill: vllm %s refuses" % version in check["detail"]
    else:
        assert made["startup_flags"] == [] and "passes" not in check["detail"]
