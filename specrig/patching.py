"""`inv apply-patches`, `inv patch-status`, `inv revert-patches`: the laptop half of the patch engine.

The engine runs on the host (remote/patch.py); patchsets travel in the bundle
(patchsets/README.md documents the format). Here: one connection per task,
typed failures, verification after applying, and output for people or scripts.

Exit statuses: 0 done or nothing to do; 1 (FINDINGS) a conflicting patch, a
refused revert, or drift the patchset claims to fix still reported after
applying; 2 (USAGE) bad patchset/argument or no patchset for the installed
versions, nothing changed; 9 (LOCKED) another client is applying or reverting.
"""
from __future__ import annotations

import fnmatch

from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

import specrig
from specrig.errors import Locked, RemoteScriptError, SpecrigError, UsageError
from specrig.exit_status import ExitStatus
from specrig.inventory import Host
from specrig.remote import Remote, connect
from specrig.ui import console, print_json

PATCH_TIMEOUT_S = 300
USAGE_KINDS = frozenset({"bad-argument", "bad-patchset", "no-patchset", "not-applied", "not-a-bundle",
                         "not-writable"})
REFUSED_KINDS = frozenset({"conflict", "revert-refused", "backup-missing", "backup-corrupt"})
#: Patch states whose findings must be gone after applying.
IN_FORCE = frozenset({"applied", "pending", "missing"})


class PatchRefused(SpecrigError):
    """A patch conflicts with the installed source, or a revert would discard changes; nothing was changed."""

    exit_status = ExitStatus.FINDINGS

    def __init__(self, message: str, *, result: dict, **kwargs):
        super().__init__(message, **kwargs)
        self.result = result


class DriftRemains(SpecrigError):
    """Patches were applied, but verify-signatures still reports drift the patchset claims to fix."""

    exit_status = ExitStatus.FINDINGS

    def __init__(self, message: str, *, result: dict, **kwargs):
        super().__init__(message, **kwargs)
        self.result = result


def call_engine(remote: Remote, args: dict) -> dict:
    """One engine call; its failure kinds become typed errors."""
    try:
        return remote.call("patch", {**args, "specrig_version": specrig.__version__}, timeout=PATCH_TIMEOUT_S)
    except RemoteScriptError as exc:
        where = remote.host.name
        if exc.kind == "locked":
            raise Locked(f"{where}: {exc.error.get('message')}") from None
        if exc.kind in USAGE_KINDS:
            raise UsageError(f"{where}: {exc.error.get('message')}", hint=_usage_hint(exc.kind)) from None
        if exc.kind in REFUSED_KINDS:
            result = exc.error.get("result") or {"error": exc.error}
            raise PatchRefused(f"{where}: {exc.error.get('message')}", result=result) from None
        raise


def _usage_hint(kind: str) -> str | None:
    return {"no-patchset": "install versions a patchset covers, or add a patchset (patchsets/README.md)",
            "bad-patchset": "fix the patchset; see patchsets/README.md",
            "not-applied": "`inv patch-status --host H` lists what is applied",
            "not-a-bundle": "run the engine through specrig (`--host local` included), which ships patchsets "
                            "as JSON in its bundle, not from a checkout's remote/"}.get(kind)


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
    from specrig.verify import CouldNotCheck, verify_host

    with connect(host) as remote:
        result = call_engine(remote, {"action": "apply", "patchset": patchset, "dry_run": dry_run})
        if dry_run:
            if result["conflicts"]:
                raise PatchRefused(f"{host.name}: the run would be refused: " + "; ".join(
                    f"patch {c['id']} ({c['path']}): {c['reason']}" for c in result["conflicts"]), result=result)
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
        raise DriftRemains(f"{host.name}: after applying, verify-signatures still reports what the patchset claims "
                           f"to fix: {', '.join(sorted(covered))}", result=result)
    return result


def patch_status(host: Host, *, patchset: str | None = None) -> dict:
    with connect(host) as remote:
        return call_engine(remote, {"action": "status", "patchset": patchset})


def revert_patches(host: Host, *, patch: str | None = None, force: bool = False) -> dict:
    with connect(host) as remote:
        return call_engine(remote, {"action": "revert", "patch": patch, "force": force})


# ---- tasks: run, show, exit status ------------------------------------------------------------

def run_task(action: str, host: Host, *, as_json: bool, **options) -> ExitStatus:
    """What a task does: the action, its output (table or JSON), its exit status (SpecrigError escapes)."""
    functions = {"apply": apply_patches, "status": patch_status, "revert": revert_patches}
    try:
        result = functions[action](host, **options)
    except (PatchRefused, DriftRemains) as exc:
        if as_json:
            print_json({**exc.result, "error": exc.message})
            return exc.exit_status
        if exc.result.get("patches"):
            show(exc.result, host=host)
        raise
    if as_json:
        print_json(result)
    else:
        show(result, host=host)
    return ExitStatus.OK


STATE_STYLE = {"applied": "green", "pending": "yellow", "missing": "yellow", "not-applicable": "dim",
               "conflict": "red"}


def show(result: dict, *, host: Host) -> None:
    if result["action"] == "revert":
        _show_revert(result, host)
        return
    env = result["environment"]
    packages = ", ".join(f"{name} {p['version']}" if p else f"{name} (not installed)"
                         for name, p in result["facts"]["packages"].items())
    console.print(f"[bold]{escape(host.name)}[/]: {escape(env['prefix'])} ({escape(packages)}, "
                  f"platform {result['facts']['platform']})")
    if result.get("patchset"):
        console.print(f"patchset [bold]{escape(result['patchset']['name'])}[/]: "
                      f"{escape(result['patchset']['description'])}")
    elif result.get("patchset_problem"):
        console.print(f"[yellow]{escape(result['patchset_problem'])}[/]")
    if result.get("patches"):
        table = Table(expand=True)
        table.add_column("patch", no_wrap=True)
        table.add_column("state", no_wrap=True)
        table.add_column("what", ratio=1)
        for patch in result["patches"]:
            state = patch["state"]
            note = patch["reason"] or ("applied now" if patch.get("applied_now") else
                                       f"by specrig {patch['specrig_version']} at {patch['applied_at']}"
                                       if patch.get("applied_at") else patch["by"] if state == "applied" else "")
            where = patch["path"].rpartition("/")[2] + (f": {note}" if note else "")
            table.add_row(escape(patch["id"]), f"[{STATE_STYLE.get(state, '')}]{state}[/]",
                          f"{escape(patch['description'])}\n[dim]{escape(where)}[/]")
        console.print(table)
    for recorded in result.get("recorded", []):
        if recorded["state"] != "intact":
            console.print(f"[yellow]{escape(recorded['file'])}: {escape(recorded['state'])} "
                          f"(patched by specrig: {escape(', '.join(recorded['patches']))})[/]")
    if result.get("dry_run"):
        for file in result["files"]:
            if file["diff"]:
                console.print(Syntax(file["diff"], "diff", word_wrap=True))
        console.print("dry run: nothing was changed")
    elif result["action"] == "apply" and "files" in result:  # absent when the run was refused
        _show_applied(result)


def _show_applied(result: dict) -> None:
    written = result["bytes_written"]
    changed = [f for f in result["files"] if f["bytes_written"]]
    console.print(f"wrote {written} bytes to {len(changed)} file(s)" if written else "nothing to do: every "
                  "applicable patch is already applied")
    verification = result.get("verification")
    if verification:
        other = verification["other_drift"]
        console.print("[green]verified[/]: verify-signatures reports none of the drift the patchset fixes"
                      + (f"; {len(other)} other drift finding(s) remain (inv verify-signatures lists them)"
                         if other else ""))


def _show_revert(result: dict, host: Host) -> None:
    if not result["files"]:
        console.print(f"{host.name}: nothing to revert: no patch is recorded as applied by specrig")
        return
    for file in result["files"]:
        console.print(f"{escape(file['path'])}: {escape(file['outcome'])} ({escape(', '.join(file['patches']))})")
    console.print(f"{host.name}: wrote {result['bytes_written']} bytes")
