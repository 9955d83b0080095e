"""One table maps every failure kind a host reports to the laptop's error (specrig.transport.failures)."""
import ast

import pytest

from specrig.errors import CouldNotCheck, Findings, Locked, RemoteScriptError, UsageError
from specrig.exit_status import ExitStatus
from specrig.inventory import Host
from specrig.transport.failures import FAILURE_KINDS, error_for
from support.paths import REPO

HOST = Host(name="blackwell01")


def kinds_raised_on_the_host() -> dict[str, str]:
    """Every kind under remote/: `RemoteFailure("kind", ...)` and `{"kind": "...", ...}` error records
    that rpc.py and entry.py emit themselves (kind -> where)."""
    found = {}
    for path in sorted((REPO / "remote").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "RemoteFailure" and node.args and isinstance(node.args[0], ast.Constant):
                found[node.args[0].value] = f"{path.relative_to(REPO)}:{node.lineno}"
    for path in (REPO / "remote" / "rpc.py", REPO / "remote" / "entry.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "kind" and isinstance(value, ast.Constant):
                        found[value.value] = f"{path.relative_to(REPO)}:{node.lineno}"
    return found


def test_every_kind_the_host_raises_has_an_entry():
    raised = kinds_raised_on_the_host()
    assert len(raised) >= 20, raised  # the scan itself works
    missing = {kind: where for kind, where in raised.items() if kind not in FAILURE_KINDS}
    assert not missing, f"add these to specrig/transport/failures.py: {missing}"


def test_no_entry_is_left_over():
    raised = kinds_raised_on_the_host()
    assert set(FAILURE_KINDS) - set(raised) == set()


@pytest.mark.parametrize("kind, error, status", [
    ("bad-manifest", UsageError, ExitStatus.USAGE),
    ("not-installed", CouldNotCheck, ExitStatus.USAGE),
    ("unknown-run", UsageError, ExitStatus.USAGE),
    ("output-busy", Locked, ExitStatus.LOCKED),
    ("locked", Locked, ExitStatus.LOCKED),
    ("conflict", Findings, ExitStatus.FINDINGS),
    ("smoke-failed", Findings, ExitStatus.FINDINGS),
    ("script-error", RemoteScriptError, ExitStatus.REMOTE_ERROR),
    ("a-kind-nobody-knows", RemoteScriptError, ExitStatus.REMOTE_ERROR),
])
def test_a_kind_becomes_its_error_with_its_exit_status(kind, error, status):
    failure = error_for(HOST, "patch", {"kind": kind, "message": "what the host said", "result": {"patches": []},
                                        "failure": {"kind": "api-drift"}})
    assert type(failure) is error and failure.exit_status == status
    assert failure.kind == kind and "what the host said" in failure.message and "blackwell01" in failure.message


def test_hints_name_the_host():
    failure = error_for(HOST, "runs", {"kind": "unknown-run", "message": "no run 'x'"})
    assert failure.one_line() == "blackwell01: no run 'x' (`inv status --host blackwell01` lists the runs)"


def test_findings_carry_what_was_found():
    conflict = error_for(HOST, "patch", {"kind": "conflict", "message": "m", "result": {"patches": [1]}})
    smoke = error_for(HOST, "smoke", {"kind": "smoke-failed", "message": "m", "failure": {"kind": "api-drift"}})
    assert conflict.payload == {"patches": [1]} and smoke.payload == {"kind": "api-drift"}
