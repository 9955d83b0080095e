"""Failures come back typed and bounded: unreachable, wrong port, wrong python, script error, timeout."""
import json
import socket
import threading
import time
import uuid

import pytest

from specrig.errors import ConnectionFailed, RemotePythonError, RemoteScriptError, RemoteTimeout
from specrig.exit_status import ExitStatus
from specrig.inventory import load_inventory
from specrig.transport import connect
from support.lab import find_python, inv, lab_entry


def host_with(make_inventory, trusted_known_hosts, **overrides):
    inventory = make_inventory({"hosts": {"lab": lab_entry(**overrides)}})
    trusted_known_hosts(inventory)
    return inventory, load_inventory(inventory).host("lab")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_closed_port_is_refused_quickly(lab, make_inventory, trusted_known_hosts):
    inventory, _ = host_with(make_inventory, trusted_known_hosts, port=free_port())
    result = inv("doctor", "--host", "lab", inventory=inventory)
    assert result.returncode == ExitStatus.CONNECTION
    assert "cannot connect" in result.stderr and "refused" in result.stderr.lower()


def test_silent_port_times_out_within_bound(lab, make_inventory, trusted_known_hosts):
    # A listener that accepts and never speaks SSH: the banner wait must end.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    inventory, host = host_with(make_inventory, trusted_known_hosts, port=server.getsockname()[1])
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as caught:
        with connect(host):
            pass
    assert "banner" in caught.value.message and "is that port an SSH server" in caught.value.one_line()
    assert time.monotonic() - started < 60
    server.close()


def test_unroutable_address_times_out(lab, make_inventory, trusted_known_hosts):
    inventory, _ = host_with(make_inventory, trusted_known_hosts, hostname="10.255.255.1", port=22)
    result = inv("doctor", "--host", "lab", inventory=inventory)
    assert result.returncode == ExitStatus.CONNECTION
    # Some networks answer every TCP connect and then stay silent: either way, one bounded, clear line.
    assert any(words in result.stderr for words in ("timed out", "cannot connect", "banner"))
    assert len(result.stderr.strip().splitlines()) == 1


def test_wrong_python_path(lab, make_inventory, trusted_known_hosts):
    inventory, _ = host_with(make_inventory, trusted_known_hosts, python="/opt/nowhere/bin/python")
    result = inv("doctor", "--host", "lab", inventory=inventory)
    assert result.returncode == ExitStatus.REMOTE_PYTHON
    assert "'/opt/nowhere/bin/python' cannot be run" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_missing_identity_file_is_a_usage_error(lab, make_inventory, trusted_known_hosts):
    inventory, _ = host_with(make_inventory, trusted_known_hosts, identity_file="/nonexistent/key")
    result = inv("doctor", "--host", "lab", inventory=inventory)
    assert result.returncode == ExitStatus.USAGE
    assert "hosts.lab.identity_file" in result.stderr and "'/nonexistent/key'" in result.stderr


def test_script_error_carries_the_traceback(lab):
    with connect(lab.host("lab")) as remote:
        with pytest.raises(RemoteScriptError) as caught:
            remote.call("probe", {"fail": "boom"})
    assert "ValueError: boom" in caught.value.message
    assert 'probe.py", line' in caught.value.detail


def test_expected_failure_is_typed(lab):
    with connect(lab.host("lab")) as remote:
        with pytest.raises(RemoteScriptError) as caught:
            remote.call("probe", {"refuse": "no thanks"})
    assert caught.value.kind == "refused" and "no thanks" in caught.value.message


def test_timeout_ends_the_remote_process(lab):
    pid_file = f".cache/specrig/probe-{uuid.uuid4().hex[:8]}.pid"  # suites may run side by side
    with connect(lab.host("lab")) as remote:
        with pytest.raises(RemoteTimeout, match="deadline"):
            remote.call("probe", {"sleep": 60, "pid_file": pid_file}, timeout=2)
        rc, pid, _ = remote.exec("cat " + pid_file, timeout=10)
        rc, _, _ = remote.exec(f"kill -0 {int(pid)}", timeout=10)
    assert rc != 0, "the timed-out remote process is still alive"


def test_local_host_runs_the_same_scripts():
    result = inv("doctor", "--host", "local", "--json")
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["connection"]["ssh"] is False and facts["python"]["version"]




@pytest.mark.parametrize("version", ["2.7", "3.8"])
def test_too_old_python_reports_its_version(version):
    import dataclasses

    python = find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (set SPECRIG_TEST_PYTHON_{version.replace('.', '')})")
    host = dataclasses.replace(load_inventory().host("local"), python=str(python))
    with connect(host) as remote:
        with pytest.raises(RemotePythonError) as caught:
            remote.call("doctor", {})
    assert f"Python {version}" in caught.value.message and "older than the 3.9" in caught.value.message
