"""The lab fleet (`inv lab.up --hosts 3`): lab-1 ... lab-3, each its own sshd and host key on its own
loopback address, sharing the lab's environments.

The shared fleet is only read here (other suites may be using it at the same time). Taking a host
down and re-keying one are done on private fleet hosts this module starts on spare addresses
(above lab.FLEET_MAX) with the same helpers, in an inventory of its own whose group lab-fleet is
the shipped three plus them; they are removed afterwards.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from run import storage
from specrig.exit_status import ExitStatus
from specrig.inventory import load_inventory
from specrig.lab import READY
from specrig.lab import fleet as lab_fleet
from specrig.lab.machine import MAIN_USER, process_running, running_pid
from specrig.lab.sshd import set_known_host, sshd_pid
from support.lab import claim_spare, host_of_its_own, inv, inv_json, known_hosts_line, lab_entry, quiet, require_lab
from support.paths import REPO

SHIPPED = [f"lab-{number}" for number in range(1, lab_fleet.FLEET_SHIPPED + 1)]


@pytest.fixture(scope="module")
def fleet(lab):
    build = f"run `inv lab.up --runnable --hosts {lab_fleet.FLEET_SHIPPED}` as root"
    require_lab(lab_fleet.fleet_size() >= lab_fleet.FLEET_SHIPPED
            and all(lab_fleet.fleet_host_running(number) for number in range(1, lab_fleet.FLEET_SHIPPED + 1)),
            f"lab fleet not built: {build}")
    # The fleet's hosts run the runnable environment (hosts.yaml: ~/venv-cpu/bin/python).
    require_lab(READY.read_text() == "runnable\n", f"the lab fleet needs the runnable environments: {build}")
    return lab


def refused(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


# ---- the shipped entries (no lab needed) ---------------------------------------------------------------

def test_hosts_yaml_names_the_fleet_as_lab_up_builds_it():
    data = yaml.safe_load((REPO / "hosts.yaml").read_text())
    assert data["groups"]["lab-fleet"] == SHIPPED
    for number, name in enumerate(SHIPPED, 1):
        assert data["hosts"][name] == lab_fleet.fleet_entry(number), name
    workdirs = {data["hosts"][name]["workdir"] for name in SHIPPED}
    assert len(workdirs) == len(SHIPPED), "fleet hosts share a workdir: their runs would mix"


def test_recording_a_host_key_touches_only_its_own_line(tmp_path):
    def key(name):
        state = tmp_path / name
        state.mkdir()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(state / "ssh_host_ed25519_key")],
                       check=True)
        return state, " ".join((state / "ssh_host_ed25519_key.pub").read_text().split()[:2])

    (first, first_key), (second, second_key) = key("first"), key("second")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("[127.0.0.1]:2222 ssh-ed25519 AAAAmain\nother ssh-rsa AAAAother")  # no final newline
    set_known_host(known_hosts, "[127.0.1.7]:2222", first)
    expected = f"[127.0.0.1]:2222 ssh-ed25519 AAAAmain\nother ssh-rsa AAAAother\n[127.0.1.7]:2222 {first_key}\n"
    assert known_hosts.read_text() == expected
    inode = known_hosts.stat().st_ino
    set_known_host(known_hosts, "[127.0.1.7]:2222", first)  # held already: the file is not rewritten
    assert known_hosts.stat().st_ino == inode and known_hosts.read_text() == expected
    set_known_host(known_hosts, "[127.0.1.7]:2222", second)  # re-keyed: replaced
    assert known_hosts.read_text() == expected.replace(first_key, second_key)
    assert oct(known_hosts.stat().st_mode & 0o777) == "0o600"


# ---- the shared fleet, read only --------------------------------------------------------------------

def test_doctor_on_the_fleet_every_host_its_own_sshd(fleet):
    code, outcomes = inv_json("doctor", "--host", "lab-fleet")
    assert code == 0, outcomes
    assert list(outcomes) == SHIPPED
    for number, name in enumerate(SHIPPED, 1):
        result = outcomes[name]["result"]
        assert outcomes[name]["exit_status"] == 0
        assert result["connection"]["target"] == f"specrig@127.0.1.{number}:2222"
        assert result["login_shell"].endswith("/zsh")
        assert result["disk"]["path"].endswith(f"/specrig-fleet/{name}")
    # One environment, shared: the same interpreter and releases on every host.
    assert len({json.dumps([o["result"]["python"]["executable"], o["result"]["packages"]])
                for o in outcomes.values()}) == 1
    assert outcomes["lab-1"]["result"]["packages"]["vllm"]
    # ... and each host its own sshd and host key.
    pids = {sshd_pid(lab_fleet.fleet_state(number)) for number in range(1, len(SHIPPED) + 1)}
    keys = {known_hosts_line(number).split(" ", 1)[1] for number in range(1, len(SHIPPED) + 1)}
    assert len(pids) == len(keys) == len(SHIPPED) and None not in pids


def test_the_generated_inventory_names_the_whole_fleet(fleet):
    inventory = load_inventory(lab_fleet.fleet_inventory())
    size = lab_fleet.fleet_size()
    assert inventory.groups["lab-fleet"] == [f"lab-{number}" for number in range(1, size + 1)]
    known = (lab_fleet.fleet_inventory().parent / ".specrig" / "known_hosts").read_text()
    assert all(known_hosts_line(number) in known for number in range(1, size + 1))
    code, outcomes = inv_json("doctor", "--host", "lab-1,lab-3", inventory=lab_fleet.fleet_inventory())
    assert code == 0 and list(outcomes) == ["lab-1", "lab-3"], outcomes


def test_up_again_changes_nothing(fleet):
    require_lab(os.geteuid() == 0, "the lab's files are root's: run the suite as root")
    known_hosts = REPO / ".specrig" / "known_hosts"
    before = known_hosts.read_text()
    pids = [sshd_pid(lab_fleet.fleet_state(number)) for number in range(1, len(SHIPPED) + 1)]
    lab_fleet.up_fleet(len(SHIPPED), log=quiet)
    assert known_hosts.read_text() == before
    assert [sshd_pid(lab_fleet.fleet_state(number)) for number in range(1, len(SHIPPED) + 1)] == pids


# ---- private hosts: one down, one re-keyed ---------------------------------------------------------------

@pytest.fixture(scope="module")
def spares(fleet, tmp_path_factory):
    """Two private fleet hosts (running) and an inventory: lab-1 ... lab-3, then them, all in lab-fleet."""
    require_lab(os.geteuid() == 0, "starting lab sshds needs root: run the suite as root")
    numbers = []
    directory = tmp_path_factory.mktemp("fleet")
    try:
        for _ in range(2):
            numbers.append(claim_spare())
            lab_fleet.start_fleet_host(numbers[-1], log=quiet)
        shipped = yaml.safe_load((REPO / "hosts.yaml").read_text())["hosts"]
        key = lab_entry()["identity_file"]
        hosts = {name: {**shipped[name], "identity_file": key} for name in SHIPPED}
        for number in numbers:
            hosts[lab_fleet.fleet_name(number)] = lab_fleet.fleet_entry(number, identity_file=key)
        path = directory / "hosts.yaml"
        path.write_text(yaml.safe_dump({"hosts": hosts, "groups": {"lab-fleet": list(hosts)}}))
        (directory / ".specrig").mkdir()
        shutil.copy(REPO / ".specrig" / "known_hosts", directory / ".specrig" / "known_hosts")
        with open(directory / ".specrig" / "known_hosts", "a") as known:
            known.writelines(known_hosts_line(number) for number in numbers)
        yield path, [lab_fleet.fleet_name(number) for number in numbers], numbers
    finally:
        for number in numbers:
            lab_fleet.remove_fleet_host(number, known_hosts=directory / ".specrig" / "known_hosts",
                                        log=quiet)


def test_one_host_down_the_others_succeed(spares):
    inventory, (down, other), (number, _) = spares
    lab_fleet.stop_fleet_host(number, log=quiet)
    try:
        assert refused(lab_fleet.fleet_address(number), lab_fleet.FLEET_PORT)
        code, outcomes = inv_json("doctor", "--host", "lab-fleet", inventory=inventory)
        assert outcomes[down]["exit_status"] == ExitStatus.CONNECTION and "refused" in outcomes[down]["error"]
        assert all(outcomes[name]["exit_status"] == 0 for name in (*SHIPPED, other)), outcomes
        assert code == ExitStatus.CONNECTION
    finally:
        lab_fleet.start_fleet_host(number, log=quiet)
    code, outcomes = inv_json("doctor", "--host", down, inventory=inventory)
    assert code == 0, outcomes  # back up, with the key it had


def test_one_host_rekeyed_the_others_succeed(spares):
    inventory, (_, rekeyed), (_, number) = spares
    old = lab_fleet.rekey_fleet_host(number, log=quiet)
    try:
        code, outcomes = inv_json("doctor", "--host", "lab-fleet", inventory=inventory)
        assert outcomes[rekeyed]["exit_status"] == ExitStatus.HOST_KEY and "CHANGED" in outcomes[rekeyed]["error"]
        assert all(outcomes[name]["exit_status"] == 0 for name in SHIPPED), outcomes
        assert code == ExitStatus.HOST_KEY
    finally:
        lab_fleet.rekey_fleet_host(number, old, log=quiet)
    code, outcomes = inv_json("doctor", "--host", rekeyed, inventory=inventory)
    assert code == 0, outcomes  # the recorded key again


def test_one_down_one_rekeyed_the_summary_names_both(spares):
    inventory, (down, rekeyed), (down_number, rekeyed_number) = spares
    lab_fleet.stop_fleet_host(down_number, log=quiet)
    old = lab_fleet.rekey_fleet_host(rekeyed_number, log=quiet)
    try:
        result = inv("doctor", "--host", "lab-fleet", inventory=inventory, env={"COLUMNS": "80"})
    finally:
        lab_fleet.start_fleet_host(down_number, log=quiet)
        lab_fleet.rekey_fleet_host(rekeyed_number, old, log=quiet)
    assert result.returncode == ExitStatus.HOST_KEY, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    assert f"doctor: {len(SHIPPED) + 2} hosts, {len(SHIPPED)} ok, 2 not ok" in text
    assert "unreachable (3)" in text and "Connection refused" in text
    assert "host key (5)" in text and "CHANGED" in text
    assert max(map(len, result.stdout.splitlines())) <= 80


def test_a_removed_fleet_host_leaves_nothing(fleet, tmp_path):
    require_lab(os.geteuid() == 0, "starting lab sshds needs root: run the suite as root")
    number = claim_spare()
    try:
        lab_fleet.start_fleet_host(number, log=quiet)
    finally:
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text("other ssh-ed25519 AAAA\n" + known_hosts_line(number))
        lab_fleet.remove_fleet_host(number, known_hosts=known_hosts, log=quiet)
    assert refused(lab_fleet.fleet_address(number), lab_fleet.FLEET_PORT)
    assert not lab_fleet.fleet_state(number).exists()
    assert known_hosts.read_text() == "other ssh-ed25519 AAAA\n"


def test_a_host_of_its_own_sees_its_private_directory_empty_and_keeps_what_it_writes_there(fleet, tmp_path):
    shared = tmp_path / "out"
    shared.mkdir()
    (shared / "mine").write_text("the machine's\n")
    os.chown(shared, *[getattr(pwd.getpwnam(MAIN_USER), f) for f in ("pw_uid", "pw_gid")])
    with host_of_its_own(private=(shared,)) as (number, _):
        sshd = running_pid(lab_fleet.fleet_state(number) / "sshd.pid")

        def inside(*argv: str) -> str:
            return subprocess.run(["nsenter", "-t", str(sshd), "-m", *argv], capture_output=True, text=True,
                                  check=True).stdout

        assert inside("ls", "-A", str(shared)) == ""
        assert inside("stat", "-c", "%U %F", str(shared)) == f"{MAIN_USER} directory\n"
        inside("touch", str(shared / "theirs"))
        assert os.listdir(shared) == ["mine"]
        found = storage.mount_of(str(shared), storage.parse_mountinfo(Path(f"/proc/{sshd}/mountinfo").read_text()))
        assert (found["fstype"], found["source"]) == ("tmpfs", "specrig-private")
        assert storage.mount_of(str(shared), storage.read_mounts())["mount_point"] != str(shared)
    assert not process_running(sshd) and os.listdir(shared) == ["mine"]
