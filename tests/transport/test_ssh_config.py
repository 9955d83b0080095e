"""Host names that ssh_config knows work: aliases and ProxyJump, with host keys still verified."""
import json

from support.lab import inv
from support.paths import REPO


def ssh_config(tmp_path, *blocks):
    """An ssh_config of lab entries: (alias, user, jump host or None) each."""
    text = "".join(f"Host {alias}\n    HostName 127.0.0.1\n    Port 2222\n    User {user}\n"
                   f"    IdentityFile {REPO / '.lab' / 'client_key'}\n" + (f"    ProxyJump {jump}\n" if jump else "")
                   for alias, user, jump in blocks)
    path = tmp_path / "ssh_config"
    path.write_text(text)
    return path


def test_alias_and_proxyjump(lab, make_inventory, trusted_known_hosts, tmp_path, monkeypatch):
    config = ssh_config(tmp_path, ("labalias", "specrig", None), ("labjump", "specrig-bash", "labalias"))
    inventory = make_inventory({"hosts": {"viaalias": {"hostname": "labalias", "python": "~/venv/bin/python"},
                                          "viajump": {"hostname": "labjump", "python": "/usr/bin/python3"}}})
    trusted_known_hosts(inventory)
    monkeypatch.setenv("SPECRIG_SSH_CONFIG", str(config))
    alias = inv("doctor", "--host", "viaalias", "--json", inventory=inventory)
    assert alias.returncode == 0, alias.stderr
    assert json.loads(alias.stdout)["user"] == "specrig"
    jump = inv("doctor", "--host", "viajump", "--json", inventory=inventory)
    assert jump.returncode == 0, jump.stderr
    assert json.loads(jump.stdout)["user"] == "specrig-bash"


def test_proxyjump_gateway_key_is_verified_too(lab, make_inventory, tmp_path, monkeypatch):
    config = ssh_config(tmp_path, ("gw", "specrig", None), ("behind", "specrig", "gw"))
    inventory = make_inventory({"hosts": {"behind": {"hostname": "behind"}}})  # no known_hosts at all
    monkeypatch.setenv("SPECRIG_SSH_CONFIG", str(config))
    result = inv("doctor", "--host", "behind", inventory=inventory)
    assert result.returncode == 5 and "not known" in result.stderr
