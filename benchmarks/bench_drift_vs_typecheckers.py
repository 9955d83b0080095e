"""Our drift analyzer against pyright and mypy on the same unpacked pair: speculators 0.3.0, vLLM 0.16.0.

Each tool checks speculators' data_generation package with vLLM's source importable; each
is timed as a fresh process (ours too: `python remote/entry.py` with a `verify` call, as a host
runs it, after one call that writes its byte-code), median of --repeat runs. Ours twice: cold (no
cache: the ratio against pyright and mypy) and a repeat answered from the host's cache. Printed per tool: seconds, what it reports, how many of the
three known signature drifts are among it, and everything else it reports (noise, for this job).
pyright and mypy live in their own venv (created on first use, --venv to reuse another).

    python benchmarks/bench_drift_vs_typecheckers.py [--repeat 3] [--venv DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specrig.drift.compat import package_root

#: (consumer line, the vLLM parameter) of the three signature drifts of speculators 0.3.0 on vLLM 0.16.0.
KNOWN = {"kv_cache_specs", "block_size", "is_encoder_decoder"}
TARGET = "speculators/data_generation"
#: The lab host's own interpreter (`inv lab.up`): where verify-signatures really runs.
LAB_PYTHON = Path("/home/specrig/venv/bin/python")


def median_time(command: list[str], *, repeat: int, env: dict | None = None, cwd: Path | None = None,
                before=None) -> tuple[float, subprocess.CompletedProcess]:
    times, proc = [], None
    for _ in range(repeat):
        if before:
            before()
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
        times.append(time.perf_counter() - started)
    return statistics.median(times), proc


def ensure_venv(venv: Path) -> Path:
    if not (venv / "bin" / "pyright").exists() or not (venv / "bin" / "mypy").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "pyright", "mypy"], check=True)
    return venv / "bin"


def known_found(messages: list[str]) -> int:
    return sum(1 for name in KNOWN if any(re.search(rf"\b{name}\b", m) for m in messages))


def run_ours(work: Path, spec: dict, vllm: dict, repeat: int, python: str, *, cached: bool = False) -> dict:
    """Cold: no workdir, so no cache (every run analyses). Cached: a workdir, one run to fill it, then
    the repeats are answered from it (what a second verify of an unchanged host costs the host)."""
    call = work / "call.json"
    args = {"consumer_roots": [spec], "provider_root": vllm}
    if cached:
        args["workdir"] = str(work / "workdir")

    def write_call():  # entry.py deletes call files only under a calls/ directory; rewrite anyway
        call.write_text(json.dumps({"command": "verify", "args": args}))

    # As on a host, Python keeps the bundle's byte-code (its first call writes it), whatever this shell says.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    command = [python, str(REPO / "remote" / "entry.py"), str(call)]
    median_time(command, repeat=1, env=env, before=write_call)  # byte-code written; the cache filled
    seconds, proc = median_time(command, repeat=repeat, env=env, before=write_call)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("@@SPECRIG-RESULT@@"))
    report = json.loads(line.split(" ", 1)[1])["result"]
    assert report["cache"]["state"] == ("hit" if cached else "bypassed"), report["cache"]
    messages = [f["id"] for f in report["findings"]]
    signature = [f for f in report["findings"] if "parameters" in f]
    return {"tool": "specrig, cached" if cached else "specrig drift", "seconds": seconds, "reported": len(messages),
            "known": known_found(messages), "other": len(messages) - len(signature),
            "note": "a repeat: answered from the host's cache" if cached else
            f"{len(messages) - len(signature)} others are behaviour rules (true drift)"}


def run_pyright(work: Path, bin_dir: Path, spec: dict, vllm: dict, repeat: int) -> dict:
    project = work / "pyright"
    project.mkdir()
    (project / "speculators").symlink_to(Path(spec["root"]) / "speculators")
    (project / "pyrightconfig.json").write_text(json.dumps(
        {"include": [TARGET], "extraPaths": [vllm["root"]], "pythonVersion": "3.11"}))
    seconds, proc = median_time([str(bin_dir / "pyright"), "-p", str(project / "pyrightconfig.json"),
                                 "--outputjson"], repeat=repeat)
    errors = [d["message"] for d in json.loads(proc.stdout)["generalDiagnostics"] if d["severity"] == "error"]
    found = known_found(errors)
    return {"tool": "pyright", "seconds": seconds, "reported": len(errors), "known": found,
            "other": len(errors) - found, "note": "unresolved imports (torch, transformers), false call errors"}


def run_mypy(work: Path, bin_dir: Path, spec: dict, vllm: dict, repeat: int) -> dict:
    cache = work / "mypy-cache"
    env = dict(os.environ, MYPYPATH=vllm["root"])

    def cold_cache():  # every run from scratch, as a first check on a new host would be
        subprocess.run(["rm", "-rf", str(cache)], check=True)

    seconds, proc = median_time([str(bin_dir / "mypy"), "--python-version", "3.11", "--cache-dir", str(cache),
                                 "--follow-imports", "silent", "--ignore-missing-imports", "--no-error-summary",
                                 TARGET], repeat=repeat, env=env, cwd=Path(spec["root"]), before=cold_cache)
    errors = [l for l in proc.stdout.splitlines() if ": error:" in l]
    found = known_found(errors)
    return {"tool": "mypy", "seconds": seconds, "reported": len(errors), "known": found,
            "other": len(errors) - found, "note": "--ignore-missing-imports hides what it cannot read"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--venv", type=Path, default=Path("~/.cache/specrig/bench-venv").expanduser())
    parser.add_argument("--python", default=str(LAB_PYTHON) if LAB_PYTHON.exists() else sys.executable,
                        help="the interpreter our analyzer runs on, as on a host (default: the lab host's venv)")
    options = parser.parse_args()
    bin_dir = ensure_venv(options.venv)
    spec, vllm = package_root("speculators", "0.3.0"), package_root("vllm", "0.16.0")
    with tempfile.TemporaryDirectory(prefix="specrig-bench-") as tmp:
        work = Path(tmp)
        rows = [run_ours(work, spec, vllm, options.repeat, options.python),
                run_ours(work, spec, vllm, options.repeat, options.python, cached=True),
                run_pyright(work, bin_dir, spec, vllm, options.repeat),
                run_mypy(work, bin_dir, spec, vllm, options.repeat)]
    ours = rows[0]["seconds"]
    print(f"speculators 0.3.0 {TARGET} against vLLM 0.16.0, median of {options.repeat} fresh processes; "
          f"ours on {options.python}")
    print(f"{'tool':<14} {'seconds':>8} {'vs ours':>8} {'reported':>9} {'known 3':>8} {'other':>6}  note")
    for row in rows:
        print(f"{row['tool']:<14} {row['seconds']:>8.2f} {row['seconds'] / ours:>7.1f}x {row['reported']:>9} "
              f"{row['known']:>6}/3 {row['other']:>6}  {row['note']}")


if __name__ == "__main__":
    main()
