"""The one remote primitive: run a command of remote/ on a host with JSON in and JSON out.

    with connect(host) as remote:
        result = remote.call("doctor", {}, timeout=60)

`connect` gives a LocalRemote for `--host local` and an SshRemote otherwise; both run the same
content-addressed bundle (bundle.py) through remote/entry.py. Every shell word is quoted by
quoting.py, host keys are checked by hostkeys.py, and a failure the host reports becomes the
typed error of failures.py.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from specrig.inventory import Host
from specrig.transport.base import Remote
from specrig.transport.bundle import Bundle, current_bundle
from specrig.transport.local import LocalRemote
from specrig.transport.ssh import SshRemote, open_ssh

__all__ = ["Remote", "connect", "open_ssh"]


@contextmanager
def connect(host: Host, *, bundle: Bundle | None = None) -> Iterator[Remote]:
    """A Remote for `host`: local subprocesses for `local`, else one SSH connection for the task."""
    bundle = bundle or current_bundle()
    remote: Remote = LocalRemote(host, bundle) if host.is_local else SshRemote(host, open_ssh(host), bundle)
    try:
        yield remote
    finally:
        remote.close()
