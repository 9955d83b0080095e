"""The client patchset speculators-0.8-0.9-client on the lab (issue 26): speculators' own request, byte for
byte the same before and after, without openai's per-token transform; refused whole where its code moved.

The request is speculators' generate_hidden_states_async, run by benchmarks/gpu/client_request_cost.py in
the client's environment into an in-memory transport (the body's sha256 and the request's cost per prompt
length). That the states still equal transformers' is what tests/run/test_server_runs_lab.py checks after
its apply-patches, which applies this patchset too.
"""
from __future__ import annotations

import hashlib
import json
import os

from specrig.exit_status import ExitStatus
from support.lab import inv
from support.patchenv import as_lab_user
from support.paths import REPO

CLIENT_FILE = "speculators/data_generation/vllm_client.py"
LENGTHS = ("512", "1301")


def _site(prefix):
    return next((prefix / "lib").glob("python3*/site-packages"))


def _requests(client) -> list[dict]:
    """client_request_cost.py's lines, run by the lab user in the client's environment (a copy of the script
    beside it: the checkout may be where the lab user cannot read)."""
    script = client / "client_request_cost.py"
    as_lab_user("tee", str(script), input=(REPO / "benchmarks" / "gpu" / "client_request_cost.py").read_text())
    done = as_lab_user(str(client / "bin" / "python"), str(script), *LENGTHS, timeout=300,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_patched_client_sends_the_same_bytes(server_env):
    inventory, client, _prefix = server_env
    before = _requests(client)
    assert not any(r["patched"] for r in before)

    applied = inv("apply-patches", "--host", "lab-server", "--json", inventory=inventory, timeout=600)
    assert applied.returncode == ExitStatus.OK, applied.stdout[-3000:] + applied.stderr[-3000:]
    ours = [p for p in json.loads(applied.stdout)["patches"] if p["id"] == "client-token-ids-in-extra-body"]
    assert [(p["state"], p["environment"]) for p in ours] == [("applied", "python")]

    after = _requests(client)
    assert all(r["patched"] for r in after)
    assert [(r["tokens"], r["body_sha256"], r["body_bytes"]) for r in after] == \
        [(r["tokens"], r["body_sha256"], r["body_bytes"]) for r in before], "the request's JSON is unchanged"


def test_a_client_whose_call_moved_is_refused_and_nothing_changes(server_env):
    """The call reordered by hand (as an upstream reformat would): a conflict naming the patch, exit 1, and
    neither environment written, though the server's patchset alone would apply."""
    inventory, client, prefix = server_env
    target = _site(client) / CLIENT_FILE
    moved = target.read_text().replace("prompt=token_ids,\n            max_tokens=1,",
                                       "max_tokens=1,\n            prompt=token_ids,")
    as_lab_user("rm", "-f", str(target))
    as_lab_user("tee", str(target), input=moved)
    server_files = sorted(p for p in _site(prefix).rglob("*.py") if "kv_connector" in str(p) or p.name == "shm.py")
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in server_files}

    refused = inv("apply-patches", "--host", "lab-server", inventory=inventory, timeout=600)
    assert refused.returncode == ExitStatus.FINDINGS, refused.stdout[-3000:] + refused.stderr[-3000:]
    said = refused.stdout + refused.stderr
    assert "nothing was changed" in said and "client-token-ids-in-extra-body" in said, said[-3000:]
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in server_files} == before
    assert target.read_text() == moved
    assert not (prefix / ".specrig").exists() and not (client / ".specrig").exists()
