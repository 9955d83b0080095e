"""`inv doctor` wall time and SSH round trips at 0 and 100 ms RTT, cold and warm, against by-hand ssh.

Runs against the lab host (`inv lab.up`), as root (it clears the lab user's bundle cache for the cold case).
The baseline is what one does by hand: a fresh `ssh` per probe (shell, python, four package
versions, nvidia-smi, free disk). Physical floor at 100 ms RTT: SSH connect ≈ 0.6 s.

    python benchmarks/bench_doctor_latency.py [--repeat N]
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from delay_proxy import DelayProxy

from specrig.doctor import doctor
from specrig.inventory import load_inventory
from specrig.transport.bundle import current_bundle

#: One bundle for the whole run, so that "warm" means the same bytes are already on the host.
BUNDLE = current_bundle()
BUNDLES = Path("/home/specrig/.cache/specrig/bundles")
NAIVE_PROBES = [
    "echo $SHELL",
    "~/venv/bin/python --version",
    *(f"~/venv/bin/python -m pip show {name} | grep ^Version; true" for name in ("speculators", "vllm", "torch", "transformers")),
    "nvidia-smi --query-gpu=index,name,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw "
    "--format=csv || true",
    "df -h ~/specrig-work 2>/dev/null || df -h ~",
]


def lab_via(proxy: DelayProxy, known_hosts: Path):
    lab = load_inventory(REPO / "hosts.yaml").host("lab")
    return dataclasses.replace(lab, port=proxy.port, known_hosts=str(known_hosts))


def known_hosts_for(port: int, directory: Path) -> Path:
    key_type, key = Path("/var/lib/specrig-lab/ssh_host_ed25519_key.pub").read_text().split()[:2]
    path = directory / "known_hosts"
    path.write_text(f"[127.0.0.1]:{port} {key_type} {key}\n")
    return path


def run_specrig(proxy: DelayProxy, known_hosts: Path, *, cold: bool) -> tuple[float, int]:
    if cold:
        shutil.rmtree(BUNDLES, ignore_errors=True)
    proxy.reset()
    started = time.perf_counter()
    facts = doctor(lab_via(proxy, known_hosts), bundle=BUNDLE)
    elapsed = time.perf_counter() - started
    assert facts["connection"]["bundle_uploaded"] == cold
    return elapsed, proxy.round_trips


def run_naive(proxy: DelayProxy, known_hosts: Path) -> tuple[float, int]:
    lab = load_inventory(REPO / "hosts.yaml").host("lab")
    proxy.reset()
    started = time.perf_counter()
    for probe in NAIVE_PROBES:
        subprocess.run(["ssh", "-p", str(proxy.port), "-i", lab.identity_file, "-o", f"UserKnownHostsFile={known_hosts}",
                        "-o", "BatchMode=yes", f"{lab.user}@127.0.0.1", probe], capture_output=True, check=True)
    return time.perf_counter() - started, proxy.round_trips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is shown")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for rtt_ms in (0, 100):
            proxy = DelayProxy(target_port=2222, one_way_delay_s=rtt_ms / 2000)
            known_hosts = known_hosts_for(proxy.port, Path(scratch))
            cells = {
                "specrig cold": [run_specrig(proxy, known_hosts, cold=True) for _ in range(options.repeat)],
                "specrig warm": [run_specrig(proxy, known_hosts, cold=False) for _ in range(options.repeat)],
                "naive ssh per probe": [run_naive(proxy, known_hosts) for _ in range(options.repeat)],
            }
            medians = {name: (statistics.median(t for t, _ in runs), statistics.median(r for _, r in runs))
                       for name, runs in cells.items()}
            naive_time = medians["naive ssh per probe"][0]
            for name, (seconds, trips) in medians.items():
                rows.append((rtt_ms, name, seconds, trips, naive_time / seconds))
    print(f"{'RTT':>6}  {'variant':<22}{'wall s':>8}{'round trips':>13}{'naive/this':>12}")
    for rtt_ms, name, seconds, trips, ratio in rows:
        print(f"{rtt_ms:>4}ms  {name:<22}{seconds:>8.2f}{trips:>13.0f}{ratio:>11.1f}x")


if __name__ == "__main__":
    main()
