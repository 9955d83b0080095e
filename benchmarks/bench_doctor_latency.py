"""`inv doctor` wall time and SSH round trips at 0 and 100 ms RTT, cold and warm, against the floor and by hand.

Runs against the lab host (`inv lab.up`), as root. Cold: a bundle the host has never seen (this
run's own, one file added), so that nothing shared is removed; warm: the same bundle again.
The floor is one OpenSSH login running `true` (`ssh host true`): what any tool pays to run a
command there. The baseline is what one does by hand: a fresh `ssh` per probe (shell, python,
four package versions, nvidia-smi, free disk). Also apply-patches, with the verify it runs after,
on a private copy of the lab venv (tests/support/patchenv.py; the shared venvs are never patched):
its round trips, and its wall time once its verify is answered from the host's cache.

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
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from delay_proxy import DelayProxy

from specrig.doctor import doctor
from specrig.inventory import load_inventory
from specrig.patching.patches import apply_patches, revert_patches
from specrig.transport.bundle import Bundle, current_bundle
from support.patchenv import make_patch_env

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


def lab_via(proxy: DelayProxy, known_hosts: Path, inventory: Path = REPO / "hosts.yaml"):
    lab = load_inventory(inventory).host("lab")
    return dataclasses.replace(lab, port=proxy.port, known_hosts=str(known_hosts))


def known_hosts_for(port: int, directory: Path) -> Path:
    key_type, key = Path("/var/lib/specrig-lab/ssh_host_ed25519_key.pub").read_text().split()[:2]
    path = directory / "known_hosts"
    path.write_text(f"[127.0.0.1]:{port} {key_type} {key}\n")
    return path


def run_specrig(proxy: DelayProxy, known_hosts: Path, *, cold: bool) -> tuple[float, int]:
    bundle = BUNDLE
    if cold:  # a bundle of its own, never uploaded: the host's shared cache is left as it is
        bundle = Bundle(BUNDLE.files + [("remote/.bench-cold", uuid.uuid4().hex.encode())])
    proxy.reset()
    started = time.perf_counter()
    facts = doctor(lab_via(proxy, known_hosts), bundle=bundle)
    elapsed = time.perf_counter() - started
    assert facts["connection"]["bundle_uploaded"] == cold
    if cold:
        shutil.rmtree(BUNDLES / bundle.digest)
    return elapsed, proxy.round_trips


def run_floor(proxy: DelayProxy, known_hosts: Path) -> tuple[float, int]:
    return run_ssh(proxy, known_hosts, ["true"])


def run_ssh(proxy: DelayProxy, known_hosts: Path, probes: list[str]) -> tuple[float, int]:
    lab = load_inventory(REPO / "hosts.yaml").host("lab")
    proxy.reset()
    started = time.perf_counter()
    for probe in probes:
        subprocess.run(["ssh", "-p", str(proxy.port), "-i", lab.identity_file, "-o", f"UserKnownHostsFile={known_hosts}",
                        "-o", "BatchMode=yes", f"{lab.user}@127.0.0.1", probe], capture_output=True, check=True)
    return time.perf_counter() - started, proxy.round_trips


def private_lab_copy(scratch: Path):
    """A private copy of the lab venv (patchenv's hard-linked copy) and its inventory."""
    def make_inventory(data: dict) -> Path:
        import yaml

        path = scratch / "private" / "hosts.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(data))
        return path

    return make_patch_env(make_inventory, lambda inventory: None)


def run_apply(proxy: DelayProxy, known_hosts: Path, env) -> tuple[float, int]:
    """apply-patches and its verify (timed), then revert-patches (not timed) for the next run."""
    host = lab_via(proxy, known_hosts, env.inventory)
    proxy.reset()
    started = time.perf_counter()
    apply_patches(host)
    elapsed, trips = time.perf_counter() - started, proxy.round_trips
    revert_patches(host)
    return elapsed, trips


def run_naive(proxy: DelayProxy, known_hosts: Path) -> tuple[float, int]:
    return run_ssh(proxy, known_hosts, NAIVE_PROBES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is shown")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        env = private_lab_copy(Path(scratch))
        try:
            for rtt_ms in (0, 100):
                proxy = DelayProxy(target_port=2222, one_way_delay_s=rtt_ms / 2000)
                known_hosts = known_hosts_for(proxy.port, Path(scratch))
                doctor(lab_via(proxy, known_hosts), bundle=BUNDLE)  # the warm bundle on the host
                cells = {
                    "floor: ssh host true": [run_floor(proxy, known_hosts) for _ in range(options.repeat)],
                    "specrig cold": [run_specrig(proxy, known_hosts, cold=True) for _ in range(options.repeat)],
                    "specrig warm": [run_specrig(proxy, known_hosts, cold=False) for _ in range(options.repeat)],
                    "naive ssh per probe": [run_naive(proxy, known_hosts) for _ in range(options.repeat)],
                    "apply-patches+verify": [run_apply(proxy, known_hosts, env) for _ in range(options.repeat)],
                }
                medians = {name: (statistics.median(t for t, _ in runs), statistics.median(r for _, r in runs))
                           for name, runs in cells.items()}
                floor = medians["floor: ssh host true"][0]
                naive_time = medians["naive ssh per probe"][0]
                for name, (seconds, trips) in medians.items():
                    rows.append((rtt_ms, name, seconds, trips, seconds / floor, naive_time / seconds))
        finally:
            shutil.rmtree(env.prefix, ignore_errors=True)
    print(f"{'RTT':>6}  {'variant':<22}{'wall s':>8}{'round trips':>13}{'/floor':>8}{'naive/this':>12}")
    for rtt_ms, name, seconds, trips, floor_ratio, ratio in rows:
        print(f"{rtt_ms:>4}ms  {name:<22}{seconds:>8.2f}{trips:>13.0f}{floor_ratio:>7.2f}x{ratio:>11.1f}x")


if __name__ == "__main__":
    main()
