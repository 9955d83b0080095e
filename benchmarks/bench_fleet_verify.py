"""`inv verify-signatures` on a fleet of 1, 8 and 32 hosts at 100 ms RTT, against the same task host by host.

Needs the lab and its fleet (`inv lab.up --runnable --hosts 3`). The N hosts are N inventory entries
(bench-01 … bench-32) spread round-robin over lab-1, lab-2, lab-3 and lab, every entry reached through
the delay proxy (benchmarks/delay_proxy.py: one listener per real host, 50 ms each way). The entries
live in a temporary inventory (SPECRIG_HOSTS) whose ssh_config (SPECRIG_SSH_CONFIG) gives each one
`HostName 127.0.0.1`, `Port <its proxy>` and `HostKeyAlias [<real host>]:2222`: the key a host sends
through the proxy is checked, as always, against the project's known_hosts (copied beside the
temporary inventory) under the real host's name.

  fleet          one `inv verify-signatures --host fleet-N --json` ($SPECRIG_PARALLEL unset: 32 at once)
  host by host   what one runs otherwise: a shell loop, one `inv verify-signatures --host X` after another

Peak memory is the maximum RSS of the fleet's `inv` process (os.wait4 on that child alone).

Where the time goes (second table). On this machine the "hosts" are the laptop's own cores: every
host's sshd, shell and Python analysis runs beside the laptop process. So each fleet run also records
the CPU seconds the whole machine spent and the laptop process's own share; the analysis time each
host reports (measured on the host); the same fleet running `inv doctor` (one cheap call per host);
and N concurrent bare OpenSSH logins (`ssh HOST true`), the floor of any SSH tool on this machine.
The machine may be shared: each timed run waits until it is quiet (under 15% busy) first, and the
code timed is a snapshot of the checkout taken at the start (its bundle uploaded by a warm-up run).

    python benchmarks/bench_fleet_verify.py [--sizes 1,8,32] [--rtt-ms 100] [--repeat 3] [--no-cache]

Since issue 30 a host answers a repeat verify of its unchanged environment from its cache: after the
warm-up every timed verify is such a repeat. `--no-cache` times the analysis itself on every host
(verify-signatures --no-cache, both in the fleet and host by host).

benchmarks/device_fleet/ brings the same lab fleet up on a device machine (16 cores, no sshd), where
the hosts have cores to spare, and runs this script there.
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

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from delay_proxy import DelayProxy

from specrig.inventory import load_inventory
from specrig.transport.hostkeys import known_hosts_name

#: The real hosts the entries are spread over (bench-01, the single host, is lab-1).
TARGETS = ["lab-1", "lab-2", "lab-3", "lab"]
#: `inv` of this interpreter, not a version manager's shim (whose own start-up would be timed too).
_INV = Path(sys.executable).with_name("inv")
INV = str(_INV) if _INV.exists() else "inv"
CORES = os.cpu_count() or 1
QUIET_BUSY = 0.15


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def wait_quiet(limit_s: float = 300) -> bool:
    """Wait until the machine is quiet (others may share it); False if it never was within limit_s."""
    ends = time.monotonic() + limit_s
    while time.monotonic() < ends:
        before = machine_busy()
        time.sleep(1.0)
        if machine_busy() - before < QUIET_BUSY * CORES:
            return True
    return False


#: What `inv` needs of the checkout: the timed code is a snapshot of it, so that edits made to the
#: working tree while the benchmark runs neither change what is measured nor make a new bundle
#: (whose upload to every host would be timed).
SNAPSHOT = ["specrig", "remote", "patchsets", "tasks.py", "pyproject.toml"]


def snapshot(directory: Path) -> Path:
    checkout = directory / "checkout"
    for name in SNAPSHOT:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            checkout.mkdir(exist_ok=True)
            shutil.copy(source, checkout / name)
    return checkout


class Fleet:
    def __init__(self, directory: Path, count: int, rtt_ms: float, verify_options: tuple[str, ...] = ()):
        self.verify_options = verify_options
        self.checkout = snapshot(directory)
        inventory = load_inventory(REPO / "hosts.yaml")
        real = [inventory.host(name) for name in TARGETS]
        self.proxies = [DelayProxy(target_host=host.hostname, target_port=host.port, one_way_delay_s=rtt_ms / 2000)
                        for host in real]
        for proxy in self.proxies:
            # Connections closed mid-delay leave pending tasks and resets, which asyncio would report.
            proxy._loop.call_soon_threadsafe(proxy._loop.set_exception_handler, lambda loop, context: None)
        self.names = [f"bench-{number:02d}" for number in range(1, count + 1)]
        self.identity = real[0].identity_file
        self.user = real[0].user
        hosts, ssh_config = {}, []
        for index, name in enumerate(self.names):
            host, proxy = real[index % len(real)], self.proxies[index % len(real)]
            hosts[name] = {"hostname": name, "user": host.user, "identity_file": host.identity_file,
                           "python": host.python, "workdir": host.workdir,
                           "description": f"{host.name} through the delay proxy"}
            ssh_config += [f"Host {name}", "  HostName 127.0.0.1", f"  Port {proxy.port}",
                           f"  HostKeyAlias {known_hosts_name(host.hostname, host.port)}", ""]
        groups = {f"fleet-{size}": self.names[:size] for size in range(1, count + 1)}
        (directory / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts, "groups": groups}, sort_keys=False))
        self.ssh_config = directory / "ssh_config"
        self.ssh_config.write_text("\n".join(ssh_config))
        (directory / ".specrig").mkdir()
        self.known_hosts = directory / ".specrig" / "known_hosts"
        shutil.copy(REPO / ".specrig" / "known_hosts", self.known_hosts)
        self.env = {key: value for key, value in os.environ.items() if key != "SPECRIG_PARALLEL"}
        self.env.update(SPECRIG_HOSTS=str(directory / "hosts.yaml"), SPECRIG_SSH_CONFIG=str(self.ssh_config))

    def timed(self, argv: list[str]) -> dict:
        """One process: wall s, its own CPU s and max RSS (MiB), the machine's busy CPU s, stdout."""
        busy = machine_busy()
        started = time.perf_counter()
        with tempfile.TemporaryFile() as errors:
            process = subprocess.Popen(argv, env=self.env, cwd=self.checkout, stdout=subprocess.PIPE, stderr=errors)
            out = process.stdout.read()
            _, status, usage = os.wait4(process.pid, 0)  # this child's own rusage
            wall = time.perf_counter() - started
            errors.seek(0)
            err = errors.read().decode(errors="replace")
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):  # 1: drift found (lab's own venv has drift): still every host's answer
            raise SystemExit(f"{' '.join(argv)} exited {code}:\n{err[-2000:]}")
        return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 1024,
                "busy": machine_busy() - busy, "out": out.decode()}

    def options(self, task: str) -> list[str]:
        return list(self.verify_options) if task == "verify-signatures" else []

    def fleet(self, task: str, size: int) -> dict:
        run = self.timed([INV, task, "--host", f"fleet-{size}", "--json", *self.options(task)])
        outcomes = json.loads(run["out"])
        failed = {host: o.get("error") for host, o in outcomes.items() if "result" not in o}
        if len(outcomes) != size or failed:
            raise SystemExit(f"{task} on fleet-{size}: {len(outcomes)} outcomes, failed: {failed}")
        run["outcomes"] = outcomes
        return run

    def host_by_host(self, task: str, size: int) -> float:
        words = " ".join([task, *self.options(task)])
        loop = f'for h in {" ".join(self.names[:size])}; do "$INV" {words} --host "$h" >/dev/null || [ $? -eq 1 ]; done'
        started = time.perf_counter()
        subprocess.run(["bash", "-ec", loop], env={**self.env, "INV": INV}, cwd=self.checkout, check=True)
        return time.perf_counter() - started

    def bare_ssh(self, size: int) -> float:
        """`size` concurrent OpenSSH logins running `true`, through the same proxies and ssh_config."""
        argv = ["ssh", "-q", "-F", str(self.ssh_config), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "BatchMode=yes", "-i", self.identity, "-l", self.user]
        started = time.perf_counter()
        processes = [subprocess.Popen([*argv, name, "true"]) for name in self.names[:size]]
        if any(process.wait() for process in processes):
            raise SystemExit("a bare ssh login failed")
        return time.perf_counter() - started


def median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda run: run["wall"])[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,32", help="fleet sizes, comma-separated (the first is the base)")
    parser.add_argument("--rtt-ms", type=float, default=100.0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is shown")
    parser.add_argument("--no-cache", action="store_true", help="every verify analyses (no host cache)")
    options = parser.parse_args()
    sizes = [int(size) for size in options.sizes.split(",")]
    noisy = 0

    def quiet() -> None:
        nonlocal noisy
        noisy += not wait_quiet()

    with tempfile.TemporaryDirectory() as scratch:
        fleet = Fleet(Path(scratch), max(sizes), options.rtt_ms, ("--no-cache",) if options.no_cache else ())
        fleet.fleet("verify-signatures", max(sizes))  # warm-up: the bundle onto the hosts, page caches
        cells = {}
        for size in sizes:
            verify, doctor, loop, ssh = [], [], [], []
            for _ in range(options.repeat):
                quiet()
                verify.append(fleet.fleet("verify-signatures", size))
                quiet()
                doctor.append(fleet.fleet("doctor", size))
                quiet()
                ssh.append(fleet.bare_ssh(size))
                quiet()
                loop.append(fleet.host_by_host("verify-signatures", size))
            cells[size] = {"verify": median_run(verify), "doctor": median_run(doctor),
                           "loop": statistics.median(loop), "ssh": statistics.median(ssh)}
    base = cells[sizes[0]]
    answered = "analysed on every call (--no-cache)" if options.no_cache else "answered from the host's cache"
    print(f"verify-signatures, every host at {options.rtt_ms:.0f} ms RTT, {answered}; median of {options.repeat}")
    print(f"{'hosts':>5}{'fleet s':>10}{'host-by-host s':>16}{'fleet / 1-host fleet':>22}{'host-by-host / fleet':>22}"
          f"{'peak RSS MiB':>14}")
    for size in sizes:
        cell, wall = cells[size], cells[size]["verify"]["wall"]
        print(f"{size:>5}{wall:>10.2f}{cell['loop']:>16.2f}{wall / base['verify']['wall']:>21.2f}x"
              f"{cell['loop'] / wall:>21.1f}x{cell['verify']['rss']:>14.0f}")
    print(f"target: {sizes[-1]} hosts within 1.5x of the single-host fleet time: "
          f"{cells[sizes[-1]]['verify']['wall'] / base['verify']['wall']:.2f}x")
    print(f"\nwhere the time goes (this machine: {CORES} cores for the laptop and every host)")
    print(f"{'hosts':>5}{'machine CPU s':>15}{'cores busy':>12}{'laptop inv CPU s':>18}{'host analysis s':>17}"
          f"{'doctor fleet s':>16}{'bare ssh s':>12}")
    for size in sizes:
        cell, run = cells[size], cells[size]["verify"]
        analysis = statistics.median(o["result"]["elapsed_s"] for o in run["outcomes"].values())
        print(f"{size:>5}{run['busy']:>15.2f}{run['busy'] / (CORES * run['wall']):>11.0%} {run['cpu']:>17.2f}"
              f"{analysis:>17.2f}"
              f"{cell['doctor']['wall']:>9.2f} ({cell['doctor']['wall'] / base['doctor']['wall']:.1f}x)"
              f"{cell['ssh']:>6.2f} ({cell['ssh'] / base['ssh']:.1f}x)")
    if noisy:
        print(f"\nnote: the machine was not quiet before {noisy} of the timed runs (others share it)")


if __name__ == "__main__":
    main()
