"""`inv apply-patches`, `inv patch-status`, `inv revert-patches`: a host's patches, asked of its engine.

The engine runs on the host (remote/patching/patch.py); patchsets travel in the bundle
(patchsets/README.md documents the format). Here: one connection per task, the engine's calls,
typed failures, and the verification after applying. Data only: patching/view.py shows it.

A host with two environments (hosts.yaml `server_python` other than `python`, speculators >= 0.8) is
patched in each: the engine runs first in the server's environment (`server_python`, its manifest and
backups in that prefix), told the speculators version read in `python`'s as a fact (`facts:
{"speculators": ...}`, which outranks any speculators the server's environment holds too), and picks
the patchset for vLLM's files there; then in `python`'s, told the server's vLLM version, for the
patchset of speculators' client (speculators-0.8-0.9-client). Each environment picks only among the
patchsets whose files it holds (remote/patching/patchset.py pick); one with none is no failure as long
as the other has one. The two answers are shown as one (`other_environment`, `other_patchset`).
revert-patches reverts both.

Exit statuses: 0 done or nothing to do; 1 (FINDINGS) a conflicting patch, a
refused revert, or drift the patchset claims to fix still reported after
applying; 2 (USAGE) bad patchset/argument or no patchset for the installed
versions, nothing changed; 9 (LOCKED) another client is applying or reverting.
"""
from __future__ import annotations

import fnmatch

import specrig
from specrig.doctor import check_extraction_mode, installed_versions
from specrig.drift.verify import verify_host
from specrig.errors import CouldNotCheck, Findings, UsageError
from specrig.inventory import Host
from specrig.transport import Remote, connect

PATCH_TIMEOUT_S = 300
#: Patch states whose findings must be gone after applying.
IN_FORCE = frozenset({"applied", "pending", "missing"})


def call_engine(remote: Remote, action: str, args: dict, *, python: str | None = None,
                role: str = "python") -> dict:
    """One engine call (`action`: status, apply or revert), in the environment of `python` (default: hosts.yaml's `python`), labelled
    with its hosts.yaml key `role`. A conflict or refused revert is Findings whose payload is the
    engine's result (labelled too)."""
    try:
        result = remote.call(f"patch.{action}", {**args, "specrig_version": specrig.__version__}, timeout=PATCH_TIMEOUT_S,
                             python=python)
    except Findings as found:
        if isinstance(found.payload, dict):
            label(found.payload, role)
        raise
    return label(result, role)


def label(result: dict, role: str) -> dict:
    """Say which environment (hosts.yaml key) the engine's result is about, on it and on each patch."""
    if isinstance(result.get("environment"), dict):
        result["environment"]["role"] = role
    for key in ("patches", "recorded", "files"):
        for record in result.get(key) or []:
            record["environment"] = role
    return result


def engine_target(remote: Remote, host: Host, python_packages: dict | None = None, *, facts: bool = True) -> dict:
    """Where the engine runs for this host and what it is told: {python, role, facts}.

    One environment: hosts.yaml's `python`, nothing given. Two: `server_python`, given the
    speculators version of `python`'s environment (`python_packages`, else read now; none with
    facts=False, for a revert, which the manifest alone decides)."""
    if not host.two_environments:
        return {"python": None, "role": "python", "facts": None}
    if not facts:
        return {"python": host.server_interpreter, "role": "server_python", "facts": None}
    if python_packages is None:
        python_packages = installed_versions(remote)["packages"]
    return {"python": host.server_interpreter, "role": "server_python",
            "facts": {"speculators": python_packages.get("speculators")}}


def _engine(remote: Remote, target: dict, action: str, args: dict) -> dict:
    if target["facts"] is not None:
        args = {**args, "facts": target["facts"]}
    return call_engine(remote, action, args, python=target["python"], role=target["role"])


#: The engine's answers in an environment where no patchset of its own fits: on a host with two
#: environments the other one may have one.
NOTHING_HERE = frozenset({"no-patchset", "other-environment"})


def _in_each_environment(remote: Remote, host: Host, action: str, args: dict,
                         python_packages: dict | None = None) -> dict:
    """The engine's `action` in the host's environment, or in both of a host with two (module docstring):
    one result. Refused (UsageError) only when neither environment has a patchset."""
    target = engine_target(remote, host, python_packages)
    if not host.two_environments:
        return _engine(remote, target, action, args)
    server, refused = None, None
    try:
        server = _engine(remote, target, action, args)
    except UsageError as exc:
        if exc.kind not in NOTHING_HERE:
            raise
        refused = exc
    facts = (server or {}).get("facts") or (refused.error.get("facts") if refused else None) or {}
    vllm = ((facts.get("packages") or {}).get("vllm") or {}).get("version")
    client_target = {"python": None, "role": "python", "facts": {"vllm": vllm}}
    try:
        client = _engine(remote, client_target, action, args)
    except UsageError as exc:
        if exc.kind not in NOTHING_HERE or server is None:
            raise refused or exc from None
        return server
    if server is None:
        return client
    return _merged(server, client)


def _merged(server: dict, client: dict) -> dict:
    """The server environment's result with the client environment's patches, files and records added."""
    result = dict(server)
    for key in ("patches", "recorded", "files", "conflicts", "recovered"):
        if key in server or key in client:
            result[key] = (server.get(key) or []) + (client.get(key) or [])
    result["bytes_written"] = server.get("bytes_written", 0) + client.get("bytes_written", 0)
    result["other_environment"], result["other_patchset"] = client["environment"], client.get("patchset")
    return result


def claimed_fixes(result: dict) -> list[str]:
    """The finding-id patterns of the patches in force on this host."""
    return sorted({pattern for patch in result["patches"] if patch["state"] in IN_FORCE
                   for pattern in patch["fixes"]})


#: The severities of findings a patch in force must have removed: drift, and speed (a slow call the patch
#: claims to make fast). A note depends on the setup, so it may stay.
CLAIMED_SEVERITIES = frozenset({"drift", "speed"})


def remaining_drift(findings: list[dict], patterns: list[str]) -> list[dict]:
    """The drift and speed findings a pattern of `patterns` claims to fix (`*` matches any text)."""
    return [f for f in findings if f["severity"] in CLAIMED_SEVERITIES
            and any(fnmatch.fnmatchcase(f["id"], pattern) for pattern in patterns)]


def apply_patches(host: Host, *, patchset: str | None = None, dry_run: bool = False,
                  model: str | None = None) -> dict:
    """Apply (or preview) the matching patchset, then verify on the same connection."""
    with connect(host) as remote:
        found = check_extraction_mode(remote, host, "apply-patches")  # speculators 0.5-0.7: exit 2
        if dry_run or host.two_environments:
            # Two environments are applied one after the other: both are planned first, so that a conflict in
            # either changes nothing in both.
            preview = _in_each_environment(remote, host, "apply", {"patchset": patchset, "dry_run": True},
                                           found["packages"])
            if preview["conflicts"]:
                raise Findings(f"{host.name}: {'the run would be refused' if dry_run else 'nothing was changed'}: "
                               + "; ".join(f"patch {c['id']} ({c['path']}): {c['reason']}"
                                           for c in preview["conflicts"]), payload=preview)
            if dry_run:
                return preview
        result = _in_each_environment(remote, host, "apply", {"patchset": patchset, "dry_run": False},
                                      found["packages"])
        try:
            report = verify_host(remote, model=model or host.extract.get("model"))
        except CouldNotCheck as exc:
            raise CouldNotCheck(f"{host.name}: the patches were applied, but verify-signatures could not run: "
                                f"{exc.message}", hint=exc.hint) from None
    claimed = claimed_fixes(result)
    remaining = remaining_drift(report.findings, claimed)
    covered = {f["id"] for f in remaining}
    result["verification"] = {
        "model": report.data.get("model"),
        "claimed": claimed,
        "remaining": remaining,
        "other_drift": [f for f in report.drift if f["id"] not in covered],
    }
    if remaining:
        raise Findings(f"{host.name}: after applying, verify-signatures still reports what the patchset claims "
                       f"to fix: {', '.join(sorted(covered))}", payload=result)
    return result


def patch_status(host: Host, *, patchset: str | None = None) -> dict:
    with connect(host) as remote:
        return _in_each_environment(remote, host, "status", {"patchset": patchset})


def revert_patches(host: Host, *, patch: str | None = None, force: bool = False) -> dict:
    with connect(host) as remote:
        target = engine_target(remote, host, facts=False)  # a revert needs no versions: the manifest says it all
        args = {"patch": patch, "force": force}
        result = _engine(remote, target, "revert", args)
        if host.two_environments and patch is None:
            # Everything specrig recorded on the host: `python`'s environment too (nothing there: no call
            # writes anything).
            client = call_engine(remote, "revert", args, role="python")
            result["files"] += client["files"]
            result["recorded"] += client["recorded"]
            result["recovered"] = result.get("recovered", []) + client.get("recovered", [])
            result["bytes_written"] += client["bytes_written"]
            result["other_environment"] = client["environment"]
        return result
