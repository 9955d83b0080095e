"""hosts.yaml validation: each problem is one line naming the file, the key and the bad value; exit 2.
And where the inventory is found: --hosts, $SPECRIG_HOSTS, ./hosts.yaml, ~/.config/specrig/hosts.yaml."""
from pathlib import Path

import pytest

import specrig.inventory as inventory_module
from specrig.errors import InventoryError
from specrig.exit_status import ExitStatus
from specrig.inventory import load_inventory
from support.inventory import refused_in_one_line
from support.lab import inv
from support.paths import REPO

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
    ("env bad value", "hosts:\n  a:\n    env: {HF_TOKEN: [hf_secret]}\n", ["hosts.a.env.HF_TOKEN", "got a list"]),
    ("policy", "hosts:\n  a:\n    host_key_policy: yolo\n", ["hosts.a.host_key_policy", "'yolo'", "accept-new"]),
    ("server_python list", "hosts:\n  a:\n    server_python: [x]\n", ["hosts.a.server_python", "a string", "['x']"]),
    ("defaults server_python", "defaults:\n  server_python: 3\n", ["defaults.server_python", "a string", "3"]),
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
    line = refused_in_one_line(make_inventory(text), words)
    assert "hf_secret" not in line  # env: holds tokens: an error names the type, never the value


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
    assert (lab.port, lab.user, lab.host_key_policy) == (2222, "specrig", None)
    assert lab.identity_file == str(REPO / ".lab" / "client_key")
    assert [h.name for h in inventory.select("lab-shells")] == ["lab", "lab-bash", "lab-dash"]
    blackwell = inventory.host("blackwell01")
    assert blackwell.gpus == 8 and blackwell.extract["tp"] == 8 and blackwell.workdir == "/data/specrig"
    assert inventory.host("local").is_local


def test_hosts_json_lists_every_host():
    result = inv("hosts", "--json")
    assert result.returncode == 0 and '"blackwell01"' in result.stdout


# ---- where the inventory is found: --hosts, $SPECRIG_HOSTS, ./hosts.yaml, ~/.config/specrig ----

ONE_HOST = "hosts:\n  h: {}\n"


@pytest.fixture
def lookup(tmp_path, monkeypatch):
    """An empty current directory and config directory, no SPECRIG_HOSTS, no --hosts, and specrig
    running as an installed copy (no checkout to fall back on). Returns (cwd, config dir)."""
    cwd, config = tmp_path / "cwd", tmp_path / "config"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.delenv("SPECRIG_HOSTS", raising=False)
    monkeypatch.setattr(inventory_module, "checkout_dir", lambda: None)
    yield cwd, config / "specrig"
    inventory_module.use_hosts_file(None)


def write(path: Path, text: str = ONE_HOST) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_nothing_found_names_every_place_looked_at(lookup):
    cwd, config = lookup
    with pytest.raises(InventoryError) as caught:
        load_inventory()
    line = caught.value.one_line()
    assert "\n" not in line
    for place in (str(cwd / "hosts.yaml"), str(config / "hosts.yaml"), "--hosts", "SPECRIG_HOSTS", "create"):
        assert place in line


def test_user_level_inventory_has_its_known_hosts_in_the_config_dir(lookup):
    _, config = lookup
    write(config / "hosts.yaml")
    found = load_inventory()
    assert found.path == config / "hosts.yaml"
    assert found.host("h").known_hosts == str(config / "known_hosts")


def test_current_directory_comes_before_the_user_level(lookup):
    cwd, config = lookup
    write(config / "hosts.yaml", "hosts:\n  user-level: {}\n")
    write(cwd / "hosts.yaml")
    found = load_inventory()
    assert found.path == cwd / "hosts.yaml"
    assert found.host("h").known_hosts == str(cwd / ".specrig" / "known_hosts")


def test_variable_comes_before_the_current_directory(lookup, tmp_path, monkeypatch):
    cwd, _ = lookup
    write(cwd / "hosts.yaml", "hosts:\n  here: {}\n")
    named = write(tmp_path / "team" / "hosts.yaml")
    monkeypatch.setenv("SPECRIG_HOSTS", str(named))
    found = load_inventory()
    assert found.path == named and found.host("h").known_hosts == str(named.parent / ".specrig" / "known_hosts")


def test_flag_comes_before_the_variable(lookup, tmp_path, monkeypatch):
    flagged = write(tmp_path / "flag" / "hosts.yaml")
    monkeypatch.setenv("SPECRIG_HOSTS", str(write(tmp_path / "team" / "hosts.yaml", "hosts:\n  team: {}\n")))
    inventory_module.use_hosts_file(flagged)
    assert load_inventory().path == flagged


@pytest.mark.parametrize("named_by", ["--hosts", "SPECRIG_HOSTS"])
def test_a_named_file_that_is_missing_is_an_error_not_a_fallback(lookup, tmp_path, monkeypatch, named_by):
    cwd, _ = lookup
    write(cwd / "hosts.yaml")  # present, but never a fallback for a file the user named
    missing = tmp_path / "nope.yaml"
    if named_by == "--hosts":
        inventory_module.use_hosts_file(missing)
    else:
        monkeypatch.setenv("SPECRIG_HOSTS", str(missing))
    with pytest.raises(InventoryError) as caught:
        load_inventory()
    line = caught.value.one_line()
    assert str(missing) in line and "inventory file not found" in line and named_by in line
    assert caught.value.exit_status == ExitStatus.USAGE


def test_a_checkout_falls_back_on_its_own_inventory(lookup, monkeypatch):
    # `inv` from any directory of a clone (Invoke finds tasks.py upward) reads the clone's hosts.yaml.
    monkeypatch.setattr(inventory_module, "checkout_dir", lambda: REPO)
    assert load_inventory().path == REPO / "hosts.yaml"


def test_shipped_inventory_keeps_its_known_hosts_beside_it():
    assert load_inventory(REPO / "hosts.yaml").host("lab").known_hosts == str(REPO / ".specrig" / "known_hosts")
