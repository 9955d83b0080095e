"""The extraction driver's overhead against a bare generator loop, and its write rate against `dd`.

1. Overhead: the same data (the runnable lab's tiny model and chat set, speculators' own
   preprocessing, the same batches) through remote/run/extract_driver.py, and through a bare loop
   that only calls `generator.generate()` and keeps nothing. Compared: the extraction phase
   (driver: heartbeat phase "extracting" until "done", writes included; bare: the loop) and the
   whole process (start to exit, model load included).
2. Write rate: the driver's own sample writer (OutputDir of remote/run/driver/output.py: torch.save
   to a temporary name, rename, writes_in_flight in the background) on samples shaped like an 8B
   target's (4 layers x 2048 tokens x 4096 hidden, bf16: 64 MiB each), against `dd bs=1M` of the
   same bytes into the same directory, in interleaved rounds (the machine is shared: both see the
   same load); the ratio is the median of the rounds' ratios. Neither syncs: both measure the path
   to the page cache.

Needs the runnable lab env (`inv lab.up --runnable`, patched: `inv apply-patches --host lab-cpu`).

    python benchmarks/bench_driver.py [--repeat N] [--samples N]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOME = Path(os.environ.get("SPECRIG_RUNNABLE_HOME", "/home/specrig"))
PYTHON = HOME / "venv-cpu" / "bin" / "python"
MODEL, DATA = HOME / "models" / "tiny-llama", HOME / "data" / "tiny-chat.jsonl"
SETTINGS = {"max_length": 256, "batch_size": 8, "seed": 0}
WRITE_SAMPLES, LAYERS, TOKENS, HIDDEN = 8, 4, 2048, 4096


# ----------------------------------------------------------------------------- in the runnable venv
def bare_loop(args_file):
    """Preprocess exactly as the driver does, then generate() batch after batch, keeping nothing."""
    started = time.perf_counter()
    args = json.loads(Path(args_file).read_text())
    from speculators.data_generation import VllmHiddenStatesGenerator
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    out = Path(args["output_dir"])
    dataset, _ = load_and_preprocess_dataset(
        target_model_path=args["model"], train_data_path=args["dataset"], seq_length=args["max_length"],
        build_dataset_num_proc=1, seed=args["seed"], max_samples=args["max_samples"],
        token_freq_path=str(out / "token_freq.pt"), cache_dir=str(out / ".cache"))
    generator = VllmHiddenStatesGenerator(model_path=args["model"], max_model_len=args["max_length"] + 1)
    loop_started = time.perf_counter()
    tokens = 0
    for first in range(0, len(dataset), args["batch_size"]):
        rows = [dataset[i] for i in range(first, min(first + args["batch_size"], len(dataset)))]
        for result in generator.generate([row["input_ids"].tolist() for row in rows]):
            tokens += result["input_ids"].shape[0]
    ended = time.perf_counter()
    print(json.dumps({"loop_s": ended - loop_started, "total_s": ended - started, "tokens": tokens}))


def writes(directory, rounds):
    """Rounds of the driver's OutputDir writing WRITE_SAMPLES 8B-like samples, each followed by dd of
    the same bytes into the same directory: interleaved, so both see the same load on a shared machine."""
    import torch

    sys.path.insert(0, str(REPO / "remote"))  # as the driver's program sets it
    from run.driver.output import OutputDir

    directory = Path(directory)
    samples = [{"input_ids": torch.zeros(TOKENS, dtype=torch.long),
                "hidden_states": [torch.randn(TOKENS, HIDDEN).to(torch.bfloat16) for _ in range(LAYERS)],
                "loss_mask": torch.ones(TOKENS, dtype=torch.long)} for _ in range(2)]
    rates = {"driver": [], "dd": []}
    for _ in range(rounds):
        out = directory / "samples"
        output = OutputDir(str(out), writes_in_flight=4)
        started = time.perf_counter()
        for index in range(WRITE_SAMPLES):
            output.submit(index, samples[index % 2], lambda sample: None)
        output.drain()
        elapsed = time.perf_counter() - started
        size = sum(p.stat().st_size for p in out.glob("data_*.pt"))
        rates["driver"].append(size / elapsed)
        shutil.rmtree(out)
        target = directory / "dd.bin"
        started = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={size // 2**20}"], check=True,
                       capture_output=True)
        rates["dd"].append((size // 2**20) * 2**20 / (time.perf_counter() - started))
        target.unlink()
    print(json.dumps(rates))


# ----------------------------------------------------------------------------- the benchmark
def run_json(argv, **kwargs):
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs)
    if result.returncode != 0:
        sys.exit(f"{argv[:3]} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    # vLLM logs to stdout too: the result is the last line that is a JSON object.
    return json.loads(next(l for l in reversed(result.stdout.splitlines()) if l.startswith("{")))


def driver_run(work, samples):
    out = work / "driver-out"
    args_file = work / "driver-args.json"
    args_file.write_text(json.dumps({"model": str(MODEL), "dataset": str(DATA), "output_dir": str(out),
                                     "max_samples": samples, **SETTINGS}))
    beat = out / "heartbeat.json"
    started = time.perf_counter()
    proc = subprocess.Popen([str(PYTHON), str(REPO / "remote" / "run" / "extract_driver.py"), str(args_file)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = {}
    while proc.poll() is None:
        try:
            seen.setdefault(json.loads(beat.read_text()).get("phase"), time.perf_counter())
        except (OSError, ValueError):
            pass  # not written yet
        time.sleep(0.01)
    ended = time.perf_counter()
    if proc.returncode != 0:
        sys.exit(f"driver failed ({proc.returncode}):\n{proc.stderr.read()[-3000:]}")
    final = json.loads(beat.read_text())
    shutil.rmtree(out)
    return {"loop_s": seen["done"] - seen["extracting"], "total_s": ended - started,
            "samples": final["samples_done"]}


def bare_run(work, samples):
    out = work / "bare-out"
    out.mkdir()
    args_file = work / "bare-args.json"
    args_file.write_text(json.dumps({"model": str(MODEL), "dataset": str(DATA), "output_dir": str(out),
                                     "max_samples": samples, **SETTINGS}))
    started = time.perf_counter()
    result = run_json([str(PYTHON), __file__, "--bare", str(args_file)])
    result["total_s"] = time.perf_counter() - started
    shutil.rmtree(out)
    return result


def writes_run(work, rounds):
    directory = work / "writes"
    directory.mkdir()
    result = run_json([str(PYTHON), __file__, "--writes", str(directory), str(rounds)])
    shutil.rmtree(directory)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=96)
    options = parser.parse_args()
    if not PYTHON.exists() or not (MODEL / "config.json").exists():
        sys.exit(f"runnable lab env missing ({PYTHON}, {MODEL}): run `inv lab.up --runnable` as root")
    env_note = "VLLM_CPU_KVCACHE_SPACE=%s" % os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    work = Path(tempfile.mkdtemp(prefix="bench-driver-"))  # /tmp: the same disk as the homes here
    try:
        driver, bare = [], []
        for _ in range(options.repeat):
            bare.append(bare_run(work, options.samples))
            driver.append(driver_run(work, options.samples))
        rates = writes_run(work, 5 * options.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = lambda runs, key: statistics.median(r[key] for r in runs)
    print(f"# {options.samples} samples of the tiny model, batch {SETTINGS['batch_size']}, "
          f"max_length {SETTINGS['max_length']}, median of {options.repeat}, {env_note}")
    print(f"extraction phase   driver {median(driver, 'loop_s'):7.2f} s   bare generate loop "
          f"{median(bare, 'loop_s'):7.2f} s   ratio {median(driver, 'loop_s') / median(bare, 'loop_s'):.2f}")
    print(f"whole process      driver {median(driver, 'total_s'):7.2f} s   bare generate loop "
          f"{median(bare, 'total_s'):7.2f} s   ratio {median(driver, 'total_s') / median(bare, 'total_s'):.2f}")
    writer_rate, dd_rate = (statistics.median(rates[key]) / 2**20 for key in ("driver", "dd"))
    ratio = statistics.median(w / d for w, d in zip(rates["driver"], rates["dd"], strict=True))
    print(f"write rate         driver {writer_rate:7.0f} MiB/s   dd bs=1M {dd_rate:7.0f} MiB/s   "
          f"ratio {ratio:.2f} (median of {len(rates['dd'])} interleaved rounds of {WRITE_SAMPLES} samples "
          f"of {LAYERS}x{TOKENS}x{HIDDEN} bf16)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--bare":
        bare_loop(sys.argv[2])
        sys.stdout.flush()
        os._exit(0)  # as the driver does: no teardown of vLLM's executor threads
    elif len(sys.argv) == 4 and sys.argv[1] == "--writes":
        writes(sys.argv[2], int(sys.argv[3]))
    else:
        main()
