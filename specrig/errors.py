"""Typed failures. Each carries the ExitStatus the task exits with and a one-line message."""
from __future__ import annotations

from specrig.exit_status import ExitStatus


class SpecrigError(Exception):
    """Base of every expected failure: `str(err)` is the one-line message for people."""

    exit_status = ExitStatus.REMOTE_ERROR

    def __init__(self, message: str, *, hint: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: Long text (a traceback) shown under the one-line message.
        self.detail = detail

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(SpecrigError):
    exit_status = ExitStatus.USAGE


class InventoryError(UsageError):
    """hosts.yaml is missing or invalid."""


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
    """A remote command failed. `kind` is the failure kind the host reported."""

    exit_status = ExitStatus.REMOTE_ERROR

    def __init__(self, message: str, *, kind: str = "script-error", error: dict | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.kind = kind
        #: The whole error record from the host (kind, message, traceback, details).
        self.error = error or {}


class RemoteTimeout(SpecrigError):
    exit_status = ExitStatus.TIMEOUT


class Locked(SpecrigError):
    exit_status = ExitStatus.LOCKED
