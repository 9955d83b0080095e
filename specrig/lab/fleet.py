"""The lab's fleet (`inv lab.up --hosts N`): N more lab hosts, `lab-1` ... `lab-N`, each its own sshd on its
own loopback address (127.0.1.n:2222; Linux routes all of 127/8 to lo) with its own config, host key
and pid under STATE/fleet/<n>/, so that one can be stopped or re-keyed while the others work. They
log in as the same users, so they share the environments in ~specrig; each has its own workdir.
hosts.yaml names the first FLEET_SHIPPED of them (group `lab-fleet`); fleet_inventory(), written by
every `up_fleet(N)` beside the client key (.lab/fleet.yaml), names all N.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import yaml

from specrig.errors import UsageError
from specrig.inventory import Host
from specrig.lab.machine import MAIN_USER, STATE, lab_host, replace_file, require_root, run_command
from specrig.lab.sshd import (
    ensure_sshd,
    forget_names,
    public_key,
    set_known_host,
    sshd_pid,
    stop_sshd,
    write_known_hosts,
)
from specrig.transport.hostkeys import known_hosts_name

#: The lab's extra hosts lab-1 ... lab-N ("fleet" in their paths and group): host n listens on
#: EXTRA_HOST_ADDRESS + n, port FLEET_PORT; its files are under FLEET / str(n).
FLEET = STATE / "fleet"
FLEET_READY = FLEET / "READY"
EXTRA_HOST_ADDRESS = "127.0.1."
FLEET_PORT = 2222
#: `--hosts` goes up to FLEET_MAX; the addresses above it are left to tests' private hosts.
FLEET_MAX = 199
FLEET_GROUP = "lab-fleet"
#: How many fleet hosts hosts.yaml names (lab-1 ... lab-3, group lab-fleet): `inv lab.up --hosts 3`.
FLEET_SHIPPED = 3


def fleet_address(number: int) -> str:
    return f"{EXTRA_HOST_ADDRESS}{number}"


def fleet_state(number: int) -> Path:
    return FLEET / str(number)


def fleet_name(number: int) -> str:
    return f"lab-{number}"


def fleet_entry(number: int, *, identity_file: str = ".lab/client_key") -> dict:
    """Fleet host `number`'s hosts.yaml entry (hosts.yaml ships lab-1 ... lab-FLEET_SHIPPED as these).
    The runnable environments are the main user's, shared; the workdir (runs, outputs) is its own."""
    workdir = f"~/specrig-fleet/{fleet_name(number)}"
    return {
        "hostname": fleet_address(number),
        "port": FLEET_PORT,
        "user": MAIN_USER,
        "identity_file": identity_file,
        "python": "~/venv-cpu/bin/python",
        "workdir": workdir,
        "env": {"VLLM_CPU_KVCACHE_SPACE": 2},
        "extract": {"model": "~/models/tiny-llama", "data": "~/data/tiny-chat.jsonl",
                    "out": f"{workdir}/out/tiny-llama", "tp": 1, "max_len": 1024},
        "description": f"lab fleet host {number} (own sshd and host key), runnable vLLM on the CPU",
    }


def fleet_inventory(host: Host | None = None) -> Path:
    """The inventory naming all N fleet hosts (group lab-fleet), written beside the lab's client key
    (.lab/fleet.yaml, so its `identity_file: client_key` is that key), with its own known_hosts
    (.lab/.specrig/known_hosts): `SPECRIG_HOSTS=.lab/fleet.yaml inv doctor --host lab-fleet`."""
    return Path((host or lab_host()).identity_file).parent / "fleet.yaml"


def fleet_numbers() -> list[int]:
    """The fleet hosts that have files under FLEET (running or not), in order."""
    if not FLEET.is_dir():
        return []
    return sorted(int(entry.name) for entry in FLEET.iterdir() if entry.name.isdigit())


def fleet_size() -> int:
    """N of the last `up(hosts=N)`; 0 when no fleet was built."""
    try:
        return int(FLEET_READY.read_text())
    except (OSError, ValueError):
        return 0


def fleet_host_running(number: int) -> bool:
    return sshd_pid(fleet_state(number)) is not None


def up_fleet(count: int, *, log=print) -> None:
    """Fleet hosts 1 ... count, idempotently: sshd running, host key recorded in the project known_hosts
    and in fleet_inventory()'s. A larger fleet of an earlier `up` stays whole (whoever uses its hosts
    keeps them): the fleet is then that size; `down` removes it all."""
    require_root("lab.up --hosts")
    known_hosts = lab_host().known_hosts
    FLEET.mkdir(parents=True, exist_ok=True)
    if fleet_size() > count:
        log(f"the fleet of an earlier `inv lab.up --hosts {fleet_size()}` stays whole (`inv lab.down` removes it)")
    count = max(count, fleet_size())
    for number in range(1, count + 1):
        start_fleet_host(number, log=log)
        set_known_host(known_hosts, known_hosts_name(fleet_address(number), FLEET_PORT), fleet_state(number))
    _write_fleet_inventory(count)
    FLEET_READY.write_text(f"{count}\n")
    log(f"lab fleet is up: {fleet_name(1)} ... {fleet_name(count)} on {fleet_address(1)} ... "
        f"{fleet_address(count)}:{FLEET_PORT} (inv doctor --host {FLEET_GROUP}"
        + ("" if count == FLEET_SHIPPED else f", with SPECRIG_HOSTS={fleet_inventory()}") + ")")


def start_fleet_host(number: int, *, private: tuple[Path, ...] = (), log=print) -> None:
    """Fleet host `number`'s sshd, started if it is not running (its key made if it has none). With
    `private` (directories), a host that does not share them: its sshd starts in a mount namespace of its
    own where each is an empty tmpfs (_private_view), as a node whose disk those paths are on would be; it
    stops as any other (stop_fleet_host), and the view goes with it. For private hosts of a test (above
    FLEET_MAX), never the shared fleet's: its other users expect lab-1 ... lab-N to share this machine."""
    if not 1 <= number <= 254:
        raise UsageError(f"lab fleet host {number}: numbers go from 1 to 254 (127.0.1.1 ... 127.0.1.254)")
    if private and (number <= FLEET_MAX or fleet_host_running(number)):
        raise UsageError(f"lab fleet host {number}: a private view is for a test's own stopped host, above "
                         f"{FLEET_MAX} (a running sshd keeps the view it started with)")
    state = fleet_state(number)
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o755)
    ensure_sshd(FLEET_PORT, log, address=fleet_address(number), state=state, private=tuple(private))


def stop_fleet_host(number: int, *, log=print) -> None:
    """Take fleet host `number` down: its sshd stops (connections are refused); its files stay."""
    stop_sshd(log, state=fleet_state(number))


def rekey_fleet_host(number: int, private_key: str | None = None, *, log=print) -> str:
    """Give fleet host `number` a new host key (fresh, or `private_key`, an OpenSSH private key's text)
    and restart its sshd; known_hosts is left as it was, so clients now meet a changed key. Returns
    the private key it replaced: `rekey_fleet_host(n, old)` puts it back. `up(hosts=N)` records the
    current keys again."""
    state = fleet_state(number)
    key = state / "ssh_host_ed25519_key"
    old = key.read_text()
    with tempfile.TemporaryDirectory(dir=state) as scratch:
        new = Path(scratch) / "key"
        if private_key is None:
            run_command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "specrig-lab-host", "-f", str(new))
        else:
            new.write_text(private_key)
            os.chmod(new, 0o600)
            new.with_suffix(".pub").write_text(run_command("ssh-keygen", "-y", "-f", str(new)).stdout)
        stop_fleet_host(number, log=log)
        os.replace(new.with_suffix(".pub"), key.with_suffix(".pub"))
        os.replace(new, key)
    start_fleet_host(number, log=log)
    log(f"re-keyed {fleet_name(number)}")
    return old


def remove_fleet_host(number: int, *, known_hosts: str | os.PathLike | None = None, log=print) -> None:
    """Stop fleet host `number`, delete its files and its line in `known_hosts` (default: the project's)."""
    stop_fleet_host(number, log=log)
    shutil.rmtree(fleet_state(number), ignore_errors=True)
    forget_names(known_hosts or lab_host().known_hosts, {known_hosts_name(fleet_address(number), FLEET_PORT)})
    log(f"removed lab fleet host {number}")


def _write_fleet_inventory(count: int) -> None:
    """fleet_inventory(): lab-1 ... lab-count and the group, with its own known_hosts holding their keys."""
    hosts = {fleet_name(number): fleet_entry(number, identity_file="client_key") for number in range(1, count + 1)}
    header = ("# Written by `inv lab.up --hosts N`: the lab fleet, every host its own sshd and host key.\n"
              "# Use it with SPECRIG_HOSTS (or specrig --hosts); hosts.yaml names the first "
              f"{FLEET_SHIPPED}.\n")
    text = header + yaml.safe_dump({"hosts": hosts, "groups": {FLEET_GROUP: list(hosts)}}, sort_keys=False)
    path = fleet_inventory()
    replace_file(path, text)
    lines = []
    for number in range(1, count + 1):
        key = public_key(fleet_state(number))
        lines.append(f"{known_hosts_name(fleet_address(number), FLEET_PORT)} {key.get_name()} {key.get_base64()}\n")
    write_known_hosts(path.parent / ".specrig" / "known_hosts", lines)
