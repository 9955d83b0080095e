"""Host-key verification: the user's known_hosts plus the project's, reject unknown by default.

Fabric installs paramiko's AutoAddPolicy, which trusts any key; specrig replaces it.
"""
from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import paramiko

from specrig.errors import HostKeyChanged, HostKeyUnknown


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint, as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(hostname: str, port: int) -> str:
    """The known_hosts spelling: `host` for port 22, `[host]:port` otherwise."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


class RejectUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise HostKeyUnknown(
            f"host key of {hostname} is not known: {key.get_name()} {fingerprint(key)}",
            fingerprint=fingerprint(key),
            hint="check the fingerprint with the host's admin, then run `inv trust-host --host NAME`",
        )


class AcceptNew(paramiko.MissingHostKeyPolicy):
    """Record a never-seen key in the project known_hosts (OpenSSH's accept-new)."""

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts
        self.recorded: list[tuple[str, str]] = []

    def missing_host_key(self, client, hostname, key):
        record(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.recorded.append((hostname, fingerprint(key)))


def record(known_hosts: str, hostname: str, key: paramiko.PKey) -> None:
    """Append one entry (hostname already in known_hosts spelling) to a known_hosts file."""
    path = Path(known_hosts)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
    os.chmod(path, 0o600)


def install(client: paramiko.SSHClient, *, known_hosts: str | None, policy: str) -> AcceptNew | None:
    """Load both known_hosts files into `client` and set the policy for unknown keys."""
    if known_hosts and Path(known_hosts).exists():
        # load_host_keys would make paramiko rewrite this file on save; read into the system set instead.
        client.get_host_keys().load(known_hosts)
    if policy == "accept-new" and known_hosts:
        accept = AcceptNew(known_hosts)
        client.set_missing_host_key_policy(accept)
        return accept
    client.set_missing_host_key_policy(RejectUnknown())
    return None


def changed_key_error(hostname: str, exc: paramiko.BadHostKeyException, known_hosts: str | None) -> HostKeyChanged:
    return HostKeyChanged(
        f"host key of {hostname} CHANGED: expected {fingerprint(exc.expected_key)}, "
        f"got {exc.key.get_name()} {fingerprint(exc.key)}; refusing to connect",
        hint="someone may be intercepting the connection; if the host was reinstalled, "
             f"remove its old line from ~/.ssh/known_hosts or {known_hosts or 'the project known_hosts'} and run trust-host",
    )
