"""`inv trust-host`: show a host's key fingerprint and record it (OpenSSH's accept-new)."""
from __future__ import annotations

import dataclasses

from specrig.errors import AuthFailed, UsageError
from specrig.inventory import Host
from specrig.transport import open_ssh
from specrig.transport.hostkeys import HostKeyCheck, fingerprint


def trust_host(host: Host) -> dict:
    """Connect recording an unknown key; a known key is confirmed, a changed one refused.

    A key already in the user's known_hosts counts as trusted: nothing is recorded for it.
    """
    if host.is_local:
        raise UsageError("host 'local' is this machine: it has no host key to trust")
    accepting = dataclasses.replace(host, host_key_policy="accept-new")
    checks: list[HostKeyCheck] = []
    try:
        connection = open_ssh(accepting, host_keys=checks)
    except AuthFailed as exc:
        # The key exchange precedes authentication: the key is recorded (or confirmed) even so.
        try:
            return {**_key_result(host, checks), "authenticated": False, "note": exc.one_line()}
        finally:
            checks[0].client.close()
    try:
        return {**_key_result(host, checks), "authenticated": True}
    finally:
        connection.close()


def _key_result(host: Host, checks: list[HostKeyCheck]) -> dict:
    key = checks[0].server_key()
    result = {"host": host.name, "recorded": any(check.recorded for check in checks),
              "known_hosts": host.known_hosts}
    if key is not None:
        # `known_in`: the file that already held the key (the user's known_hosts, say), or the
        # project file where it was just recorded.
        result.update(key_type=key.get_name(), fingerprint=fingerprint(key), known_in=checks[0].holder(key)
                      or host.known_hosts)
    return result
