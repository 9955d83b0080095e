"""Typed failures. Each carries the ExitStatus the task exits with and a one-line message."""
from __future__ import annotations

from specrig.exit_status import ExitStatus


class SpecrigError(Exception):
    """Base of every expected failure: `str(err)` is the one-line message for people."""

    exit_status = ExitStatus.REMOTE_ERROR

    def __init__(self, message: str, *, hint: str | None = None, detail: str | None = None,
                 kind: str | None = None, error: dict | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: Long text (a traceback) shown under the one-line message.
        self.detail = detail
        #: For a failure the host reported: its kind (specrig.transport.failures) and whole record
        #: (kind, message, traceback, details).
        self.kind = kind
        self.error = error or {}

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(SpecrigError):
    exit_status = ExitStatus.USAGE


class InventoryError(UsageError):
    """hosts.yaml is missing or invalid."""


class CouldNotCheck(UsageError):
    """A check could not run: a package is not installed, a wheel or model config is missing."""


class Findings(SpecrigError):
    """The check ran and found something: a failed preflight or smoke run, a conflicting patch, a
    refused revert, drift left after applying. `payload` is what it found, for --json and views."""

    exit_status = ExitStatus.FINDINGS

    def __init__(self, message: str, *, payload: dict | list, **kwargs):
        super().__init__(message, **kwargs)
        self.payload = payload


class ConnectionFailed(SpecrigError):
    exit_status = ExitStatus.CONNECTION


class AuthFailed(SpecrigError):
    exit_status = ExitStatus.AUTH


class HostKeyError(SpecrigError):
    exit_status = ExitStatus.HOST_KEY


class HostKeyUnknown(HostKeyError):
    def __init__(self, message: str, *, fingerprint: str, **kwargs):
        super().__init__(message, **kwargs)
        self.fingerprint = fingerprint


class HostKeyChanged(HostKeyError):
    pass


class RemotePythonError(SpecrigError):
    exit_status = ExitStatus.REMOTE_PYTHON


class RemoteScriptError(SpecrigError):
    """A remote command failed unexpectedly; `detail` holds its traceback."""

    exit_status = ExitStatus.REMOTE_ERROR


class RemoteTimeout(SpecrigError):
    exit_status = ExitStatus.TIMEOUT


class Locked(SpecrigError):
    exit_status = ExitStatus.LOCKED
