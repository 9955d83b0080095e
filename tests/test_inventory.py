"""hosts.yaml validation: each problem is one line naming the file, the key and the bad value; exit 2."""
import pytest

from conftest import REPO, inv
from specrig.errors import InventoryError
from specrig.exit_status import ExitStatus
from specrig.inventory import load_inventory

# (case, hosts.yaml text, words the one-line error must contain)
BAD = [
    ("unknown host key", "hosts:\n  a:\n    hostnme: x\n", ["hosts.a.hostnme", "unknown key", "allowed:"]),
    ("unknown top key", "hostz: {}\n", ["hostz", "unknown top-level key"]),
    ("port not int", "hosts:\n  a:\n    port: '22x'\n", ["hosts.a.port", "an integer", "'22x'"]),
    ("port is bool", "hosts:\n  a:\n    port: yes\n", ["hosts.a.port", "True"]),
    ("port range", "hosts:\n  a:\n    port: 70000\n", ["hosts.a.port", "70000", "out of range"]),
    ("gpus type", "hosts:\n  a:\n    gpus: eight\n", ["hosts.a.gpus", "'eight'"]),
    ("env not mapping", "hosts:\n  a:\n    env: [A]\n", ["hosts.a.env", "a mapping", "['A']"]),
    ("env bad name", "hosts:\n  a:\n    env: {'1X': y}\n", ["hosts.a.env.1X", "'1X'"]),
    ("policy", "hosts:\n  a:\n    host_key_policy: yolo\n", ["hosts.a.host_key_policy", "'yolo'", "accept-new"]),
    ("defaults key", "defaults:\n  pyhton: python3\n", ["defaults.pyhton", "unknown key"]),
    ("group unknown host", "hosts:\n  a: {}\ngroups:\n  g: [a, b]\n", ["groups.g", "unknown host 'b'", "known hosts: a"]),
    ("group not list", "hosts:\n  a: {}\ngroups:\n  g: a\n", ["groups.g", "a list", "'a'"]),
    ("group named like host", "hosts:\n  a: {}\ngroups:\n  a: [a]\n", ["groups.a", "share its name"]),
    ("local reserved", "hosts:\n  local: {}\n", ["hosts.local", "reserved"]),
    ("not yaml", "hosts: [\n", ["not valid YAML", "line"]),
    ("not a mapping", "- a\n- b\n", ["(top level)", "expected a mapping"]),
]


@pytest.mark.parametrize("text,words", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_inventory_is_one_clear_line(make_inventory, text, words):
    path = make_inventory(text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    line = caught.value.one_line()
    assert "\n" not in line and str(path) in line
    for word in words:
        assert word in line


def test_bad_inventory_exits_2_through_the_cli(make_inventory):
    path = make_inventory("hosts:\n  a:\n    port: nope\n")
    result = inv("hosts", inventory=path)
    assert result.returncode == ExitStatus.USAGE
    assert result.stderr.strip().count("\n") == 0 and "hosts.a.port" in result.stderr


def test_missing_inventory_file(tmp_path):
    result = inv("hosts", inventory=tmp_path / "nope.yaml")
    assert result.returncode == ExitStatus.USAGE and "inventory file not found" in result.stderr


def test_unknown_host_names_the_choices():
    result = inv("doctor", "--host", "nosuch")
    assert result.returncode == ExitStatus.USAGE
    assert "no host 'nosuch'" in result.stderr and "blackwell01" in result.stderr


def test_shipped_inventory_defaults_and_groups():
    inventory = load_inventory(REPO / "hosts.yaml")
    lab = inventory.host("lab")
    assert (lab.port, lab.user, lab.host_key_policy) == (2222, "specrig", "reject")
    assert lab.identity_file == str(REPO / ".lab" / "client_key")
    assert [h.name for h in inventory.select("lab-shells")] == ["lab", "lab-bash", "lab-dash"]
    blackwell = inventory.host("blackwell01")
    assert blackwell.gpus == 8 and blackwell.extract["tp"] == 8 and blackwell.workdir == "/data/specrig"
    assert inventory.host("local").is_local


def test_hosts_json_lists_every_host():
    result = inv("hosts", "--json")
    assert result.returncode == 0 and '"blackwell01"' in result.stdout
