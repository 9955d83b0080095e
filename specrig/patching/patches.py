"""`inv apply-patches`, `inv patch-status`, `inv revert-patches`: a host's patches, asked of its engine.

The engine runs on the host (remote/patching/patch.py); patchsets travel in the bundle
(patchsets/README.md documents the format). Here: one connection per task, the engine's calls,
typed failures, and the verification after applying. Data only: patching/view.py shows it.

A host with two environments (hosts.yaml `server_python` other than `python`, speculators >= 0.8):
the patchsets for it fix vLLM, which lives in the server's environment, so the engine runs there
(`server_python`, its manifest and backups in that prefix) and is given the speculators version
read in `python`'s environment as a fact (`facts: {"speculators": ...}`), which outranks any
speculators the server's environment holds too. A patchset that would touch speculators' files
there is refused (other-environment, exit 2). revert-patches also reverts what specrig recorded
in `python`'s environment (patched before server_python was set); patch-status lists it.

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
from specrig.errors import CouldNotCheck, Findings
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


def claimed_fixes(result: dict) -> list[str]:
    """The finding-id patterns of the patches in force on this host."""
    return sorted({pattern for patch in result["patches"] if patch["state"] in IN_FORCE
                   for pattern in patch["fixes"]})


def remaining_drift(findings: list[dict], patterns: list[str]) -> list[dict]:
    """The drift findings a pattern of `patterns` claims to fix (`*` matches any text)."""
    return [f for f in findings if f["severity"] == "drift"
            and any(fnmatch.fnmatchcase(f["id"], pattern) for pattern in patterns)]


def apply_patches(host: Host, *, patchset: str | None = None, dry_run: bool = False,
                  model: str | None = None) -> dict:
    """Apply (or preview) the matching patchset, then verify on the same connection."""
    with connect(host) as remote:
        found = check_extraction_mode(remote, host, "apply-patches")  # speculators 0.5-0.7: exit 2
        target = engine_target(remote, host, found["packages"])
        result = _engine(remote, target, "apply", {"patchset": patchset, "dry_run": dry_run})
        if dry_run:
            if result["conflicts"]:
                raise Findings(f"{host.name}: the run would be refused: " + "; ".join(
                    f"patch {c['id']} ({c['path']}): {c['reason']}" for c in result["conflicts"]), payload=result)
            return result
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
        result = _engine(remote, engine_target(remote, host), "status", {"patchset": patchset})
        if host.two_environments:
            # What specrig recorded in `python`'s environment, if anything (patched before server_python).
            client = call_engine(remote, "status", {"patchset": None}, role="python")
            result["recorded"] = result["recorded"] + client["recorded"]
            result["other_environment"] = client["environment"]
        return result


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
