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
    """Bad input (an argument, hosts.yaml, a patchset): nothing on any host was changed."""

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
    """The host could not be reached: refused, timed out, unknown name, not an SSH server."""

    exit_status = ExitStatus.CONNECTION


class AuthFailed(SpecrigError):
    """SSH authentication failed: the user, the key or the agent."""

    exit_status = ExitStatus.AUTH


class HostKeyError(SpecrigError):
    """The host's key is not one specrig may trust."""

    exit_status = ExitStatus.HOST_KEY


class HostKeyUnknown(HostKeyError):
    """No known_hosts file holds a key for the host, and the policy is to refuse it."""

    def __init__(self, message: str, *, fingerprint: str, **kwargs):
        super().__init__(message, **kwargs)
        self.fingerprint = fingerprint


class HostKeyChanged(HostKeyError):
    """The host's key differs from the one recorded: refused, always."""


class RemotePythonError(SpecrigError):
    """The host's Python is missing, not runnable, or older than 3.9."""

    exit_status = ExitStatus.REMOTE_PYTHON


class RemoteScriptError(SpecrigError):
    """A remote command failed unexpectedly; `detail` holds its traceback."""

    exit_status = ExitStatus.REMOTE_ERROR


class RemoteTimeout(SpecrigError):
    """A remote call exceeded its deadline; the remote process was ended."""

    exit_status = ExitStatus.TIMEOUT


class Locked(SpecrigError):
    """Another client holds the lock: applying patches, or writing the same output."""

    exit_status = ExitStatus.LOCKED
