"""A host over SSH: one connection serves the whole task. A call is one exec channel:

    'umask' '077'; 'test' '-f' BUNDLE/.complete || 'exit' '86'; 'mkdir' '-p' CALLS &&
    'cat' > CALLS/ID.json && exec PYTHON BUNDLE/remote/entry.py CALLS/ID.json

with the argument JSON on stdin. `umask 077` first: the call file (which holds hosts.yaml `env:`) is
created 0600 before a byte is written, the directories made 0700, and the call inherits it. Exit 86 means the bundle is missing:
one more channel then carries the call's JSON and the bundle's tar on its stdin, writes the one (`dd
bs=1` reads no byte past it), unpacks the other and runs the call. A host this laptop has not seen
with this bundle gets that channel first: a new bundle costs no extra round trip.
Paths are relative to the login directory (the remote home), since a quoted
`~` is not expanded.
"""
from __future__ import annotations

import hashlib
import logging
import os
import selectors
import socket
import time
import uuid
from pathlib import Path

import paramiko

from specrig.errors import AuthFailed, ConnectionFailed, RemoteScriptError, RemoteTimeout, SpecrigError, UsageError
from specrig.inventory import Host
from specrig.transport import hostkeys
from specrig.transport.base import CACHE, DEADLINE_GRACE_S, Remote
from specrig.transport.bundle import Bundle
from specrig.transport.quoting import AND, OR, THEN, WRITE_TO, Operator, command_line

# paramiko logs a traceback for every failed handshake; specrig reports one line instead.
logging.getLogger("paramiko").setLevel(logging.CRITICAL)

BUNDLE_MISSING = 86
#: The bundle sent with a call could not be unpacked (tar's message is on stderr).
BUNDLE_NOT_UNPACKED = 87
#: The start of every command line that writes on the host: what it creates is the user's alone
#: (files 0600, directories 0700), whatever the login shell's umask.
PRIVATE = ("umask", "077", THEN)
CONNECT_TIMEOUT_S = 10
#: The bundles this laptop has seen on each host, a marker file per host and digest.
SEEN_BUNDLES = Path("~/.cache/specrig/hosts").expanduser()
#: Added to a call's deadline when its channel also carries the bundle.
UPLOAD_TIMEOUT_S = 120
#: dd's record counts on stderr are not the call's.
DISCARD_ERRORS = Operator("2>")
#: Shorter than CONNECT_TIMEOUT_S, which paramiko also spends on the key exchange: a silent
#: port then fails on the banner, with that cause, instead of a later "No existing session".
BANNER_TIMEOUT_S = 7
KEEPALIVE_S = 15
#: Longest sleep of a call waiting on its channel (it wakes at once for data, EOF or exit status).
WAKE_S = 1.0
#: How long, after the exit status, a call waits for the EOF that ends its output.
EOF_GRACE_S = 0.5


class SshRemote(Remote):
    """One SSH connection to a host, through Fabric (ssh_config, ProxyJump, agent, keys)."""

    def __init__(self, host: Host, connection, bundle: Bundle):
        super().__init__(host)
        self.connection = connection
        self.bundle = bundle
        self.bundle_path = f"{CACHE}/bundles/{bundle.digest}"
        self.python = _relative_to_home(host.python)
        self.uploaded = False

    @property
    def client(self) -> paramiko.SSHClient:
        return self.connection.client

    def _run(self, body: bytes, timeout: float | None, python: str) -> tuple[int, str, str]:
        call_file = f"{CACHE}/calls/{uuid.uuid4().hex}.json"
        entry = (_relative_to_home(python), f"{self.bundle_path}/remote/entry.py", call_file)
        command = command_line(
            *PRIVATE, "test", "-f", f"{self.bundle_path}/.complete", OR, "exit", str(BUNDLE_MISSING), THEN,
            "mkdir", "-p", f"{CACHE}/calls", AND, "cat", WRITE_TO, call_file, AND, "exec", *entry)
        if self.bundle_seen():
            rc, out, err = self.exec(command, stdin=body, timeout=timeout)
            if rc != BUNDLE_MISSING:
                return rc, out, err
        rc, out, err = self.exec(self._upload_and_call(call_file, len(body), entry),
                                 stdin=body + self.bundle.tar_bytes,
                                 timeout=timeout + UPLOAD_TIMEOUT_S if timeout else None)
        if rc == BUNDLE_NOT_UNPACKED:
            raise RemoteScriptError(f"{self.host.name}: could not unpack the specrig bundle: "
                                    f"{(err or out).strip()}")
        self.uploaded = True
        marker = self._seen_marker()
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        return rc, out, err

    def bundle_seen(self) -> bool:
        """Whether this laptop saw the host with this bundle: a call to a host not known to have it
        carries it in its own channel (no first call answered 86). Stale either way is harmless: a
        bundle the host already has is dropped there; one gone from it brings the 86 back."""
        return self._seen_marker().exists()

    def _seen_marker(self) -> Path:
        target = f"{self.connection.user}@{self.connection.host}:{self.connection.port}"
        return SEEN_BUNDLES / hashlib.sha256(target.encode()).hexdigest()[:24] / self.bundle.digest

    def _upload_and_call(self, call_file: str, call_size: int, entry: tuple[str, str, str]) -> str:
        """The command that writes the call file, unpacks the bundle after it on stdin and runs the call.
        Two clients may race; the bundle is content-addressed, so the loser's copy is simply dropped."""
        staging = f"{CACHE}/bundles/.incoming-{uuid.uuid4().hex}"
        return command_line(
            *PRIVATE, "mkdir", "-p", f"{CACHE}/calls", staging, AND,
            "dd", "bs=1", f"count={call_size}", f"of={call_file}", DISCARD_ERRORS, "/dev/null", AND,
            "tar", "-xzf", "-", "-C", staging, AND, "test", "-f", f"{staging}/.complete", AND,
            "test", "!", "-d", self.bundle_path, AND, "mv", staging, self.bundle_path, THEN,
            "rm", "-rf", staging, THEN,
            "test", "-f", f"{self.bundle_path}/.complete", AND, "exec", *entry, THEN,
            "rm", "-f", call_file, THEN, "exit", str(BUNDLE_NOT_UNPACKED))

    def exec(self, command: str, *, stdin: bytes = b"", timeout: float | None) -> tuple[int, str, str]:
        """Run one command line on the host; stdin is sent then closed."""
        self.exec_count += 1
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionFailed(f"{self.host.name}: the SSH connection was lost")
        try:
            channel = transport.open_session(timeout=CONNECT_TIMEOUT_S)
        except CONNECTION_ERRORS as exc:
            raise _lost(self.host.name, exc) from None
        try:
            try:
                channel.exec_command(command)
            except CONNECTION_ERRORS as exc:
                raise _lost(self.host.name, exc) from None
            try:
                if stdin:
                    channel.sendall(stdin)
                channel.shutdown_write()
            except OSError:
                # The command ended without reading its input (a missing bundle exits at once);
                # its exit status tells the rest.
                pass
            return _drain(channel, timeout + DEADLINE_GRACE_S if timeout else None, self.host.name)
        finally:
            channel.close()

    def close(self) -> None:
        self.connection.close()


#: What paramiko raises when the connection itself fails or ends: in the handshake, or re-raised from its
#: reader thread to the next caller waiting on the transport.
CONNECTION_ERRORS = (paramiko.SSHException, EOFError, OSError)


def _lost(name: str, exc: BaseException) -> ConnectionFailed:
    """The connection ended between the liveness check and the channel's request: paramiko hands the
    reader thread's error (a reset by the peer, say) to whoever waits on the transport next."""
    return ConnectionFailed(f"{name}: the SSH connection was lost ({exc or type(exc).__name__})")


def _drain(channel: paramiko.Channel, limit: float | None, name: str) -> tuple[int, str, str]:
    """Read a channel's stdout and stderr to their end and its exit status, asleep while it is silent.

    The channel's fileno() (paramiko: a pipe set while stdout or stderr holds data, and for good
    from EOF or close on) wakes the thread when bytes arrive; after EOF only the exit status is
    left, and its event is waited on. No polling: on a fleet, dozens of calls wait at once. The
    exit status may come before the last bytes of stderr: the end is EOF (or close) and the status.
    """
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + limit if limit else None
    status_at = None
    with selectors.DefaultSelector() as selector:
        selector.register(channel.fileno(), selectors.EVENT_READ)
        while True:
            while channel.recv_ready():
                out += channel.recv(65536)
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            now = time.monotonic()
            if channel.exit_status_ready():
                ended = (channel.eof_received or channel.closed) and not (channel.recv_ready()
                                                                          or channel.recv_stderr_ready())
                status_at = status_at or now
                if ended or now - status_at > EOF_GRACE_S:  # the grace: a server that sends no EOF
                    break
            if deadline and now > deadline:
                raise RemoteTimeout(f"{name}: no answer within {limit:.0f} s; the channel was closed")
            if not channel.transport.is_active() and not channel.recv_ready() and not channel.recv_stderr_ready():
                raise ConnectionFailed(f"{name}: the SSH connection dropped during a call")
            wait = WAKE_S if deadline is None else max(0.0, min(WAKE_S, deadline - now))
            if status_at:
                wait = max(0.0, min(wait, status_at + EOF_GRACE_S - now))
            if channel.eof_received:
                channel.status_event.wait(wait)
            else:
                selector.select(wait)
    if channel.exit_status == -1 and not channel.transport.is_active():
        # Closed by the connection's end, not by the command's: no exit status came.
        raise ConnectionFailed(f"{name}: the SSH connection dropped during a call")
    return channel.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace")


def _relative_to_home(path: str) -> str:
    """`~/x` becomes `x`: commands run in the login directory, and a quoted `~` is not expanded."""
    if path == "~":
        return "."
    return path[2:] if path.startswith("~/") else path


def _fabric_connection(host: Host):
    import fabric

    if host.identity_file and not Path(host.identity_file).exists():
        raise UsageError(f"hosts.yaml: hosts.{host.name}.identity_file: file {host.identity_file!r} does not exist",
                         hint="fix the path, or remove the key to use ssh_config and ssh-agent")
    connect_kwargs = {"banner_timeout": BANNER_TIMEOUT_S, "auth_timeout": CONNECT_TIMEOUT_S}
    if host.identity_file:
        connect_kwargs["key_filename"] = [host.identity_file]
    # Fabric reads ~/.ssh/config (aliases, ProxyJump, IdentityFile); SPECRIG_SSH_CONFIG names another file.
    config = fabric.Config(runtime_ssh_path=os.environ.get("SPECRIG_SSH_CONFIG") or None)
    connection = fabric.Connection(host.hostname or host.name, user=host.user, port=host.port, config=config,
                                   connect_timeout=CONNECT_TIMEOUT_S, connect_kwargs=connect_kwargs)
    # Every ProxyJump hop is an SSH connection of its own: each one's key is verified, against the
    # files and StrictHostKeyChecking of its own ssh_config entry.
    checks, hop = [], connection
    while isinstance(hop, fabric.Connection):
        checks.append(hostkeys.install(hop, known_hosts=host.known_hosts, policy=host.host_key_policy,
                                       trust_name=host.name))
        hop = hop.gateway
    return connection, checks


def open_ssh(host: Host, *, host_keys: list | None = None):
    """An open Fabric connection with host keys verified and keepalive on; typed errors otherwise.

    `host_keys`, when given, receives each hop's HostKeyCheck (the host's first, then its
    gateways) before connecting, so that a caller sees what was recorded even when
    authentication then fails (trust-host).
    """
    connection, checks = _fabric_connection(host)
    if host_keys is not None:
        host_keys.extend(checks)
    target = f"{host.name} ({connection.user}@{connection.host}:{connection.port})"
    try:
        connection.open()
    except SpecrigError:
        raise
    except paramiko.BadHostKeyException as exc:
        # A gateway's refusal surfaces here too: name the hop whose key changed.
        check = next((c for c in checks if c.holder(exc.expected_key)), checks[0])
        raise check.changed(target if check is checks[0] else f"gateway {check.name} of {host.name}", exc) from None
    except paramiko.AuthenticationException as exc:
        raise AuthFailed(f"{target}: authentication failed: {exc}",
                         hint="check `user` and `identity_file` in hosts.yaml, or your ssh-agent") from None
    except TimeoutError:
        raise ConnectionFailed(f"{target}: connection timed out after {CONNECT_TIMEOUT_S} s",
                               hint="is the host up and the port right?") from None
    except socket.gaierror as exc:
        raise ConnectionFailed(f"{target}: cannot resolve host name: {exc.strerror}",
                               hint="check `hostname` in hosts.yaml or your ssh_config") from None
    except paramiko.ssh_exception.NoValidConnectionsError as exc:
        reasons = "; ".join(sorted({e.strerror or str(e) for e in exc.errors.values()}))
        raise ConnectionFailed(f"{target}: cannot connect: {reasons}",
                               hint="is sshd running there and the port right?") from None
    except CONNECTION_ERRORS as exc:
        raise ConnectionFailed(f"{target}: SSH handshake failed: {exc or type(exc).__name__}",
                               hint="is that port an SSH server?") from None
    connection.transport.set_keepalive(KEEPALIVE_S)
    return connection
