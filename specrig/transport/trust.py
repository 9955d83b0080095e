"""`inv trust-host`: show a host's key fingerprint and record it (OpenSSH's accept-new)."""
from __future__ import annotations

import dataclasses

from specrig.errors import AuthFailed, UsageError
from specrig.transport.hostkeys import fingerprint
from specrig.inventory import Host
from specrig.transport import open_ssh


def trust_host(host: Host) -> dict:
    """Connect recording an unknown key; a known key is confirmed, a changed one refused."""
    if host.is_local:
        raise UsageError("host 'local' is this machine: it has no host key to trust")
    accepting = dataclasses.replace(host, host_key_policy="accept-new")
    try:
        connection = open_ssh(accepting)
    except AuthFailed as exc:
        # The key exchange precedes authentication: the key is recorded even so.
        return {"host": host.name, "recorded": True, "authenticated": False, "note": exc.one_line(),
                "known_hosts": host.known_hosts}
    try:
        key = connection.transport.get_remote_server_key()
        policy = connection.client._policy
        recorded = bool(getattr(policy, "recorded", None))
        return {"host": host.name, "key_type": key.get_name(), "fingerprint": fingerprint(key),
                "recorded": recorded, "authenticated": True, "known_hosts": host.known_hosts}
    finally:
        connection.close()
