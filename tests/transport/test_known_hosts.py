"""The user's known_hosts, as OpenSSH reads it: a host `ssh` already knows needs no trust-host.

Every test runs the real task against the lab with a temporary HOME, and an inventory whose
project known_hosts does not hold the lab's key.
"""
import json
import subprocess
from pathlib import Path

import pytest

from specrig.exit_status import ExitStatus
from support.lab import inv, lab_entry
from support.paths import REPO

LAB = "[127.0.0.1]:2222"


def lab_key() -> tuple[str, str]:
    """(type, base64) of the lab's host key, from the project known_hosts `inv lab.up` wrote."""
    for line in (REPO / ".specrig" / "known_hosts").read_text().splitlines():
        fields = line.split()
        if fields and fields[0] == LAB:
            return fields[1], fields[2]
    raise AssertionError(f"no {LAB} line in .specrig/known_hosts: rebuild the lab")


def other_key(directory: Path) -> tuple[str, str]:
    """A freshly made key that is not the lab's: the lab 'reinstalled', or someone in between."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / "other")], check=True)
    return tuple((directory / "other.pub").read_text().split()[:2])


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty HOME with ~/.ssh, and no ssh_config but the one a test writes."""
    monkeypatch.delenv("SPECRIG_SSH_CONFIG", raising=False)
    path = tmp_path / "home"
    (path / ".ssh").mkdir(parents=True, mode=0o700)
    return path


@pytest.fixture
def inventory(make_inventory):
    """The lab with no host_key_policy and no project known_hosts."""
    path = make_inventory({"hosts": {"lab": lab_entry()}})
    assert not project_file(path).exists()
    return path


def project_file(inventory: Path) -> Path:
    return inventory.parent / ".specrig" / "known_hosts"


def run(task: str, inventory: Path, home: Path, *, ssh_config: str | None = None, host: str = "lab"):
    env = {"HOME": str(home), "COLUMNS": "300"}
    if ssh_config is not None:
        config = home / "test_ssh_config"
        config.write_text(ssh_config)
        env["SPECRIG_SSH_CONFIG"] = str(config)
    return inv(task, "--host", host, inventory=inventory, env=env)


def write_user_file(path: Path, text: str) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path.read_bytes()


@pytest.mark.parametrize("spelling", ["plain", "hashed", "wildcard", "after-a-bad-line", "second-of-a-list"])
def test_key_in_users_known_hosts_needs_no_trust_host(lab, inventory, home, spelling):
    key_type, key = lab_key()
    user_file = home / ".ssh" / "known_hosts"
    line = {"plain": f"{LAB} {key_type} {key}\n",
            "hashed": f"{LAB} {key_type} {key}\n",
            "wildcard": f"[127.0.0.*]:2222 {key_type} {key}\n",
            # OpenSSH skips a line it cannot parse; paramiko's own loader would stop there.
            "after-a-bad-line": f"broken.example ssh-ed25519 not!base64\n{LAB} {key_type} {key}\n",
            "second-of-a-list": f"labhost,{LAB} {key_type} {key}\n"}[spelling]
    write_user_file(user_file, "# the user's own\n" + line)
    if spelling == "hashed":
        # HashKnownHosts yes writes |1|salt|hmac; ssh-keygen -H converts a file the same way.
        subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(user_file)], check=True, capture_output=True)
        assert "|1|" in user_file.read_text() and "127.0.0.1" not in user_file.read_text()
    before = user_file.read_bytes()
    result = run("doctor", inventory, home)
    assert result.returncode == 0, result.stderr
    assert not project_file(inventory).exists()  # known already: nothing recorded
    assert user_file.read_bytes() == before


def test_user_known_hosts_file_from_ssh_config(lab, inventory, home):
    key_type, key = lab_key()
    elsewhere = home / "keys" / "lab_hosts"
    before = write_user_file(elsewhere, f"{LAB} {key_type} {key}\n")
    # Several files, with `~` and a %d token; the first does not exist.
    config = "Host 127.0.0.1\n    UserKnownHostsFile ~/.ssh/absent %d/keys/lab_hosts\n"
    result = run("doctor", inventory, home, ssh_config=config)
    assert result.returncode == 0, result.stderr
    assert elsewhere.read_bytes() == before and not project_file(inventory).exists()


def test_user_known_hosts_file_replaces_the_default(lab, inventory, home):
    """As for OpenSSH, naming UserKnownHostsFile means ~/.ssh/known_hosts is no longer read."""
    key_type, key = lab_key()
    write_user_file(home / ".ssh" / "known_hosts", f"{LAB} {key_type} {key}\n")
    result = run("doctor", inventory, home, ssh_config="Host *\n    UserKnownHostsFile ~/.ssh/other_hosts\n")
    assert result.returncode == ExitStatus.HOST_KEY, result.stderr
    assert "not known" in result.stderr and "other_hosts" in result.stderr


@pytest.mark.parametrize("strict", [None, "no", "accept-new"])
def test_changed_key_in_users_file_is_refused(lab, inventory, home, strict):
    """Whatever StrictHostKeyChecking says; the hint names the file holding the old key."""
    user_file = home / ".ssh" / "known_hosts"
    key_type, key = other_key(home)
    before = write_user_file(user_file, f"{LAB} {key_type} {key}\n")
    config = f"Host *\n    StrictHostKeyChecking {strict}\n" if strict else None
    for task in ("doctor", "trust-host"):
        result = run(task, inventory, home, ssh_config=config)
        assert result.returncode == ExitStatus.HOST_KEY, result.stderr
        assert "CHANGED" in result.stderr and str(user_file) in result.stderr
        assert "ssh-keygen -R" in result.stderr
    assert user_file.read_bytes() == before
    assert not project_file(inventory).exists()  # the new key was not recorded anywhere


def test_changed_key_in_hashed_users_file_is_refused(lab, inventory, home):
    user_file = home / ".ssh" / "known_hosts"
    key_type, key = other_key(home)
    write_user_file(user_file, f"{LAB} {key_type} {key}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(user_file)], check=True, capture_output=True)
    before = user_file.read_bytes()
    result = run("doctor", inventory, home)
    assert result.returncode == ExitStatus.HOST_KEY and "CHANGED" in result.stderr, result.stderr
    assert user_file.read_bytes() == before


def test_revoked_key_is_refused(lab, make_inventory, home):
    key_type, key = lab_key()
    write_user_file(home / ".ssh" / "known_hosts", f"@revoked * {key_type} {key}\n")
    inventory = make_inventory({"hosts": {"lab": lab_entry(host_key_policy="accept-new")}})
    result = run("doctor", inventory, home)
    assert result.returncode == ExitStatus.HOST_KEY and "REVOKED" in result.stderr, result.stderr
    assert not project_file(inventory).exists()


@pytest.mark.parametrize("strict", ["accept-new", "no"])
def test_strict_host_key_checking_accept_new_records_in_the_project_file(lab, inventory, home, strict):
    user_file = home / ".ssh" / "known_hosts"
    before = write_user_file(user_file, "elsewhere.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKaQ\n")
    config = f"Host 127.0.0.1\n    StrictHostKeyChecking {strict}\n"
    first = run("doctor", inventory, home, ssh_config=config)
    assert first.returncode == 0, first.stderr
    assert project_file(inventory).read_text() == "{} {} {}\n".format(LAB, *lab_key())
    assert user_file.read_bytes() == before
    again = run("doctor", inventory, home, ssh_config=config)
    assert again.returncode == 0, again.stderr
    assert project_file(inventory).read_text().count("\n") == 1  # known now: not recorded twice


@pytest.mark.parametrize("strict", ["yes", "ask", None])
def test_strict_host_key_checking_yes_rejects(lab, inventory, home, strict):
    config = f"Host *\n    StrictHostKeyChecking {strict}\n" if strict else "Host *\n    User specrig\n"
    result = run("doctor", inventory, home, ssh_config=config)
    assert result.returncode == ExitStatus.HOST_KEY, result.stderr
    assert "not known" in result.stderr and "trust-host --host lab" in result.stderr
    if strict:
        assert f"StrictHostKeyChecking {strict}" in result.stderr
    assert not project_file(inventory).exists()


def test_hosts_yaml_policy_wins_over_ssh_config(lab, make_inventory, home):
    accepting = make_inventory({"hosts": {"lab": lab_entry(host_key_policy="accept-new")}})
    result = run("doctor", accepting, home, ssh_config="Host *\n    StrictHostKeyChecking yes\n")
    assert result.returncode == 0, result.stderr
    assert project_file(accepting).exists()
    project_file(accepting).unlink()
    rejecting = make_inventory({"hosts": {"lab": lab_entry(host_key_policy="reject")}})
    result = run("doctor", rejecting, home, ssh_config="Host *\n    StrictHostKeyChecking accept-new\n")
    assert result.returncode == ExitStatus.HOST_KEY and "host_key_policy reject" in result.stderr, result.stderr
    assert not project_file(rejecting).exists()


def test_bad_strict_host_key_checking_is_a_usage_error(lab, inventory, home):
    result = run("doctor", inventory, home, ssh_config="Host *\n    StrictHostKeyChecking maybe\n")
    assert result.returncode == ExitStatus.USAGE and "'maybe'" in result.stderr, result.stderr


def test_trust_host_confirms_a_key_the_user_knows(lab, inventory, home):
    key_type, key = lab_key()
    user_file = home / ".ssh" / "known_hosts"
    write_user_file(user_file, f"{LAB} {key_type} {key}\n")
    result = run("trust-host", inventory, home)
    assert result.returncode == 0 and "already trusted" in result.stdout, result.stderr
    as_json = inv("trust-host", "--host", "lab", "--json", inventory=inventory, env={"HOME": str(home)})
    assert json.loads(as_json.stdout)["known_in"] == str(user_file)
    assert not project_file(inventory).exists()


def test_proxyjump_gateway_known_from_users_file(lab, make_inventory, home):
    key_type, key = lab_key()
    write_user_file(home / ".ssh" / "known_hosts", f"{LAB} {key_type} {key}\n")
    config = "".join(f"Host {alias}\n    HostName 127.0.0.1\n    Port 2222\n    User specrig\n"
                     f"    IdentityFile {REPO / '.lab' / 'client_key'}\n" + (f"    ProxyJump {jump}\n" if jump else "")
                     for alias, jump in (("gw", None), ("behind", "gw")))
    inventory = make_inventory({"hosts": {"behind": {"hostname": "behind"}}})
    result = run("doctor", inventory, home, ssh_config=config, host="behind")
    assert result.returncode == 0, result.stderr
    assert not project_file(inventory).exists()


def test_inv_hosts_shows_where_the_policy_comes_from(make_inventory):
    inventory = make_inventory({"hosts": {"lab": lab_entry(), "strict": lab_entry(host_key_policy="reject")}})
    result = inv("hosts", inventory=inventory, env={"COLUMNS": "300"})
    assert result.returncode == 0, result.stderr
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if line.split()[1:2] in (["lab"], ["strict"])}
    assert "ssh_config" in rows["lab"] and "reject" in rows["strict"]
