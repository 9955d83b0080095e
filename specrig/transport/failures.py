"""Every failure kind a host reports, and the laptop error it becomes: one table.

A remote command raises `RemoteFailure(kind, message, **details)` (remote/rpc.py); the result
comes back as {"kind", "message", ...details}. The transport turns it into the error class of its
kind here, with that class's exit status and the kind's hint, so no task maps kinds itself. A kind
missing from the table is a script error (exit 7): tests/transport/test_failure_kinds.py checks that every
kind raised under remote/ is listed.
"""
from __future__ import annotations

from dataclasses import dataclass

from specrig.errors import (
    CouldNotCheck,
    Findings,
    Locked,
    RemotePythonError,
    RemoteScriptError,
    RemoteTimeout,
    SpecrigError,
    UsageError,
)


@dataclass(frozen=True)
class FailureKind:
    """What one kind becomes on the laptop."""

    error: type[SpecrigError]
    #: Advice for people; `{host}` is the host's name.
    hint: str | None = None
    #: For Findings: the key of the error record holding what was found (else the whole record).
    payload: str | None = None


_VERSIONS_HINT = "point `python` in hosts.yaml at the environment holding speculators and vLLM"
_PATCH_FINDINGS = FailureKind(Findings, payload="result")

FAILURE_KINDS: dict[str, FailureKind] = {
    # -- the primitive (remote/entry.py, remote/rpc.py) ---------------------------------------
    "python-too-old": FailureKind(RemotePythonError, "point `python` of host {host!r} in hosts.yaml at Python 3.9+"),
    "timeout": FailureKind(RemoteTimeout, "the remote process was ended"),
    "bad-call": FailureKind(RemoteScriptError, "the bundle and this specrig disagree: reinstall specrig"),
    "script-error": FailureKind(RemoteScriptError),
    "refused": FailureKind(RemoteScriptError),  # remote/probe.py's typed failure on request
    # -- bad input or a check that could not run; nothing on the host was changed -----------------
    "bad-argument": FailureKind(UsageError),
    "not-installed": FailureKind(CouldNotCheck, _VERSIONS_HINT),
    # A Hugging Face repo id the host's cache lacks: the host's message names the cache and the fix.
    "model-not-found": FailureKind(UsageError),
    "bad-patchset": FailureKind(UsageError, "fix the patchset; see patchsets/README.md"),
    "no-patchset": FailureKind(UsageError, "install versions a patchset covers, or add a patchset "
                                           "(patchsets/README.md)"),
    "not-applied": FailureKind(UsageError, "`inv patch-status --host {host}` lists what is applied"),
    "not-a-bundle": FailureKind(UsageError, "run the engine through specrig (`--host local` included), which "
                                            "ships patchsets as JSON in its bundle, not from a checkout's remote/"),
    "not-writable": FailureKind(UsageError, "run as the user owning the environment, or fix its permissions"),
    "other-environment": FailureKind(UsageError, "a patchset patches one environment: python or server_python"),
    "bad-manifest": FailureKind(UsageError, "the patches of this environment were recorded by another specrig "
                                            "version: use that version to revert them"),
    "unknown-run": FailureKind(UsageError, "`inv status --host {host}` lists the runs"),
    "run-active": FailureKind(UsageError, "`inv status --host {host}` shows it"),
    "run-finished": FailureKind(UsageError, "its output is complete; start a new run with `inv extract`"),
    # A run its supervisor refused before its first attempt (the output cannot be written, or has no room):
    # the message is the run's failure, which its record keeps.
    "run-refused": FailureKind(UsageError),
    # sbatch refused the job (an account, a QOS, a limit preflight does not know): its own words.
    "slurm-refused": FailureKind(UsageError, "fix hosts.yaml's slurm: of {host}; `inv doctor --host {host}` shows "
                                             "the cluster"),
    # -- the check ran and found something -----------------------------------------------------
    "conflict": _PATCH_FINDINGS,
    "revert-refused": _PATCH_FINDINGS,
    "backup-missing": _PATCH_FINDINGS,
    "backup-corrupt": _PATCH_FINDINGS,
    # A resume whose output cannot hold the files still missing (remote/run/budget.py): its advice says what.
    "no-room": FailureKind(Findings),
    # A training refused before anything was written (remote/run/training/launch.py): states not verified, no
    # accelerator, a save path that cannot hold its checkpoints; the checks it ran, where it ran them.
    "train-refused": FailureKind(Findings, payload="checks"),
    "smoke-failed": FailureKind(Findings, "`inv verify-signatures` names static drift, `inv apply-patches` fixes "
                                          "known drift; see docs/extraction-drift.md", payload="failure"),
    # -- someone else holds it -----------------------------------------------------------------
    "locked": FailureKind(Locked, "try again when the other client has finished"),
    "output-busy": FailureKind(Locked, "`inv stop --host {host}` stops it, or choose another --out"),
    # -- a run's supervisor could not start ----------------------------------------------------
    "supervisor-failed": FailureKind(RemoteScriptError),
    "verify-failed": FailureKind(RemoteScriptError),  # `inv gather`: the output check on the run's python
}
_UNKNOWN = FailureKind(RemoteScriptError)


def error_for(host, command: str, error: dict) -> SpecrigError:
    """The typed error for a failure record that `command` reported on `host` (a Host)."""
    kind = error.get("kind") or "script-error"
    entry = FAILURE_KINDS.get(kind, _UNKNOWN)
    message = error.get("message") or "unknown error"
    # An unexpected failure names the command that broke; an expected one speaks for itself.
    where = f"{host.name}: {command}" if entry.error is RemoteScriptError else host.name
    # The kind's own hint, else the host's advice where its record carries one (it knows the figures).
    options = {"hint": entry.hint.format(host=host.name) if entry.hint else error.get("advice"),
               "detail": error.get("traceback"), "kind": kind, "error": error}
    if entry.error is Findings:
        payload = error.get(entry.payload) if entry.payload else None
        return Findings(f"{where}: {message}", payload=payload or error, **options)
    return entry.error(f"{where}: {message}", **options)
