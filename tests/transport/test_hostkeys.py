"""Host keys: unknown refused with the fingerprint and a hint, trust-host records, changed refused."""
import json
import subprocess

import pytest

from specrig.exit_status import ExitStatus
from support.lab import inv, lab_entry


@pytest.fixture(autouse=True)
def empty_home(tmp_path, monkeypatch):
    """Only the project known_hosts counts here: no ~/.ssh/known_hosts or ssh_config of the user's."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SPECRIG_SSH_CONFIG", raising=False)


def lab_fingerprint() -> str:
    out = subprocess.run(["ssh-keygen", "-lf", "/var/lib/specrig-lab/ssh_host_ed25519_key.pub"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def test_unknown_key_refused_then_trusted(lab, make_inventory):
    inventory = make_inventory({"hosts": {"lab": lab_entry()}})
    refused = inv("doctor", "--host", "lab", inventory=inventory)
    assert refused.returncode == ExitStatus.HOST_KEY
    assert "not known" in refused.stderr and lab_fingerprint() in refused.stderr
    assert "trust-host" in refused.stderr

    trusted = inv("trust-host", "--host", "lab", inventory=inventory)
    assert trusted.returncode == 0, trusted.stderr
    assert lab_fingerprint() in trusted.stdout
    assert "[127.0.0.1]:2222 ssh-ed25519" in (inventory.parent / ".specrig" / "known_hosts").read_text()

    again = inv("trust-host", "--host", "lab", inventory=inventory)
    assert again.returncode == 0 and "already trusted" in again.stdout
    assert inv("doctor", "--host", "lab", inventory=inventory).returncode == 0


def test_changed_key_always_refused(lab, make_inventory):
    inventory = make_inventory({"hosts": {"lab": lab_entry(host_key_policy="accept-new")}})
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(inventory.parent / "other")],
                           check=True)
    other_key = (inventory.parent / "other.pub").read_text().split()[:2]
    known = inventory.parent / ".specrig" / "known_hosts"
    known.parent.mkdir()
    known.write_text(f"[127.0.0.1]:2222 {other_key[0]} {other_key[1]}\n")
    for task in ("doctor", "trust-host"):
        result = inv(task, "--host", "lab", inventory=inventory)
        assert result.returncode == ExitStatus.HOST_KEY, result.stderr
        assert "CHANGED" in result.stderr and lab_fingerprint() in result.stderr
    assert known.read_text().count("\n") == 1  # nothing was recorded over it


def test_accept_new_records_on_first_use(lab, make_inventory):
    inventory = make_inventory({"hosts": {"lab": lab_entry(host_key_policy="accept-new")}})
    assert inv("doctor", "--host", "lab", "--json", inventory=inventory).returncode == 0
    assert "ssh-ed25519" in (inventory.parent / ".specrig" / "known_hosts").read_text()


def test_trust_host_records_even_when_login_fails(lab, make_inventory, tmp_path):
    """The key exchange comes before authentication: the key is recorded, the failure noted."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True)
    inventory = make_inventory({"hosts": {"lab": lab_entry(identity_file=str(tmp_path / "stranger"))}})
    result = inv("trust-host", "--host", "lab", "--json", inventory=inventory)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["recorded"] and not answer["authenticated"] and answer["fingerprint"] == lab_fingerprint()
    assert "[127.0.0.1]:2222 ssh-ed25519" in (inventory.parent / ".specrig" / "known_hosts").read_text()
