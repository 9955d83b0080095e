"""The one remote primitive: run remote/<command>.py on a host with JSON in and JSON out.

    with connect(host) as remote:
        result = remote.call("doctor", {}, timeout=60)

Over SSH, one connection serves the whole task. A call is one exec channel:

    'test' '-f' BUNDLE/.complete || 'exit' '86'; 'mkdir' '-p' CALLS &&
    'cat' > CALLS/ID.json && exec PYTHON BUNDLE/remote/entry.py CALLS/ID.json

with the argument JSON on stdin. Exit 86 means the bundle is missing: it is
uploaded once (a tar on stdin of one more channel) and the call is repeated.
Paths are relative to the login directory (the remote home), since a quoted
`~` is not expanded.
"""
from __future__ import annotations

import io
import json
import logging
import os
import shutil
import socket
import subprocess
import tarfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import paramiko

from specrig import hostkeys
from specrig.bundle import Bundle, current_bundle
from specrig.errors import (AuthFailed, ConnectionFailed, RemotePythonError, RemoteScriptError, RemoteTimeout,
                            SpecrigError, UsageError)
from specrig.inventory import Host
from specrig.quoting import AND, OR, THEN, WRITE_TO, command_line

# paramiko logs a traceback for every failed handshake; specrig reports one line instead.
logging.getLogger("paramiko").setLevel(logging.CRITICAL)

SENTINEL = "@@SPECRIG-RESULT@@"
CACHE = ".cache/specrig"
BUNDLE_MISSING = 86
#: Extra seconds the laptop waits past a call's deadline for the host to report it.
DEADLINE_GRACE_S = 10
CONNECT_TIMEOUT_S = 10
#: Shorter than CONNECT_TIMEOUT_S, which paramiko also spends on the key exchange: a silent
#: port then fails on the banner, with that cause, instead of a later "No existing session".
BANNER_TIMEOUT_S = 7
KEEPALIVE_S = 15


class Remote:
    """A host to run calls on. Subclasses supply `_run(call_json, timeout) -> (rc, stdout, stderr)`."""

    def __init__(self, host: Host):
        self.host = host
        #: Round trips spent (exec channels opened); the latency benchmark reads it.
        self.exec_count = 0

    def call(self, command: str, args: dict | None = None, *, timeout: float | None = 120,
             env: dict | None = None) -> dict:
        """Run remote/<command>.py's run(args) and return its dict, or raise a typed error."""
        payload = {"command": command, "args": args or {}, "env": {**self.host.env, **(env or {})},
                   "timeout_s": timeout}
        body = json.dumps(payload).encode()
        rc, out, err = self._run(body, timeout)
        return self._result(command, rc, out, err)

    def _run(self, body: bytes, timeout: float | None) -> tuple[int, str, str]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _result(self, command: str, rc: int, out: str, err: str) -> dict:
        line = next((l for l in reversed(out.splitlines()) if l.startswith(SENTINEL)), None)
        if line is None:
            raise self._no_result(rc, out, err)
        reply = json.loads(line[len(SENTINEL):])
        if reply.get("ok"):
            return reply["result"]
        error = reply.get("error") or {}
        kind, message = error.get("kind", "script-error"), error.get("message", "unknown error")
        where = f"{self.host.name}: {command}"
        if kind == "python-too-old":
            raise RemotePythonError(f"{where}: {message}",
                                    hint=f"point `python` of host {self.host.name!r} in hosts.yaml at Python 3.9+")
        if kind == "timeout":
            raise RemoteTimeout(f"{where}: {message}; the remote process was ended")
        raise RemoteScriptError(f"{where}: {message}", kind=kind, error=error, detail=error.get("traceback"))

    def _no_result(self, rc: int, out: str, err: str) -> SpecrigError:
        tail = (err.strip() or out.strip()).splitlines()[-1:] or [f"exit status {rc}"]
        if rc in (126, 127) or "not found" in err or "No such file" in err:
            return RemotePythonError(
                f"{self.host.name}: remote python {self.host.python!r} cannot be run: {tail[0]}",
                hint="set `python` in hosts.yaml to the interpreter of the environment holding vLLM")
        return RemoteScriptError(f"{self.host.name}: remote command ended without a result (exit {rc}): {tail[0]}",
                                 detail=err or out)


class LocalRemote(Remote):
    """`--host local`: the same bundle and entry.py as over SSH, run in a subprocess, no SSH."""

    def __init__(self, host: Host, bundle: Bundle):
        super().__init__(host)
        self.bundle = bundle
        self.cache = Path.home() / CACHE
        self.bundle_path = self.cache / "bundles" / bundle.digest
        self.uploaded = False

    def _unpack_bundle(self) -> None:
        if (self.bundle_path / ".complete").exists():
            return
        staging = self.bundle_path.parent / f".incoming-{uuid.uuid4().hex}"
        staging.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(self.bundle.tar_bytes), mode="r:gz") as tar:
            tar.extractall(staging, filter="data")
        try:
            staging.rename(self.bundle_path)
        except OSError:  # another process unpacked the same bundle first
            shutil.rmtree(staging, ignore_errors=True)
        self.uploaded = True

    def _run(self, body: bytes, timeout: float | None) -> tuple[int, str, str]:
        self._unpack_bundle()
        calls = self.cache / "calls"
        calls.mkdir(parents=True, exist_ok=True)
        call_file = calls / f"{uuid.uuid4().hex}.json"
        call_file.write_bytes(body)
        self.exec_count += 1
        try:
            # A new session: the deadline kills the call's process group, never us.
            proc = subprocess.run([self.host.python, str(self.bundle_path / "remote" / "entry.py"), str(call_file)],
                                  stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout + DEADLINE_GRACE_S if timeout else None, start_new_session=True)
        except FileNotFoundError:
            raise RemotePythonError(f"local python {self.host.python!r} not found") from None
        except subprocess.TimeoutExpired:
            raise RemoteTimeout(f"local: call exceeded {timeout:.0f} s") from None
        finally:
            call_file.unlink(missing_ok=True)
        return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")


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

    def _run(self, body: bytes, timeout: float | None) -> tuple[int, str, str]:
        call_file = f"{CACHE}/calls/{uuid.uuid4().hex}.json"
        command = command_line(
            "test", "-f", f"{self.bundle_path}/.complete", OR, "exit", str(BUNDLE_MISSING), THEN,
            "mkdir", "-p", f"{CACHE}/calls", AND, "cat", WRITE_TO, call_file, AND,
            "exec", self.python, f"{self.bundle_path}/remote/entry.py", call_file)
        rc, out, err = self.exec(command, stdin=body, timeout=timeout)
        if rc == BUNDLE_MISSING:
            self.upload_bundle()
            rc, out, err = self.exec(command, stdin=body, timeout=timeout)
        return rc, out, err

    def upload_bundle(self) -> None:
        staging = f"{CACHE}/bundles/.incoming-{uuid.uuid4().hex}"
        # Two clients may race; the bundle is content-addressed, so the loser's copy is simply dropped.
        command = command_line(
            "mkdir", "-p", staging, AND, "tar", "-xzf", "-", "-C", staging, AND,
            "test", "-d", self.bundle_path, OR, "mv", staging, self.bundle_path, THEN, "rm", "-rf", staging)
        rc, out, err = self.exec(command, stdin=self.bundle.tar_bytes, timeout=120)
        if rc != 0:
            raise RemoteScriptError(f"{self.host.name}: could not unpack the specrig bundle: {(err or out).strip()}")
        self.uploaded = True

    def exec(self, command: str, *, stdin: bytes = b"", timeout: float | None) -> tuple[int, str, str]:
        """Run one command line on the host; stdin is sent then closed."""
        self.exec_count += 1
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionFailed(f"{self.host.name}: the SSH connection was lost")
        channel = transport.open_session(timeout=CONNECT_TIMEOUT_S)
        try:
            channel.exec_command(command)
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


def _drain(channel: paramiko.Channel, limit: float | None, name: str) -> tuple[int, str, str]:
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + limit if limit else None
    channel.settimeout(0.2)
    while True:
        progressed = False
        while channel.recv_ready():
            out += channel.recv(65536)
            progressed = True
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(65536)
            progressed = True
        if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
            # Data may still arrive after the exit status; read to EOF.
            try:
                while chunk := channel.recv(65536):
                    out += chunk
            except socket.timeout:
                pass
            return channel.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace")
        if deadline and time.monotonic() > deadline:
            raise RemoteTimeout(f"{name}: no answer within {limit:.0f} s; the channel was closed")
        if not progressed:
            time.sleep(0.005 if channel.transport.is_active() else 0)
            if not channel.transport.is_active():
                raise ConnectionFailed(f"{name}: the SSH connection dropped during a call")


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
    hostkeys.install(connection.client, known_hosts=host.known_hosts, policy=host.host_key_policy)
    if isinstance(connection.gateway, fabric.Connection):
        hostkeys.install(connection.gateway.client, known_hosts=host.known_hosts, policy=host.host_key_policy)
    return connection


def open_ssh(host: Host):
    """An open Fabric connection with host keys verified and keepalive on; typed errors otherwise."""
    connection = _fabric_connection(host)
    target = f"{host.name} ({connection.user}@{connection.host}:{connection.port})"
    try:
        connection.open()
    except SpecrigError:
        raise
    except paramiko.BadHostKeyException as exc:
        raise hostkeys.changed_key_error(target, exc, host.known_hosts) from None
    except paramiko.AuthenticationException as exc:
        raise AuthFailed(f"{target}: authentication failed: {exc}",
                         hint="check `user` and `identity_file` in hosts.yaml, or your ssh-agent") from None
    except (socket.timeout, TimeoutError):
        raise ConnectionFailed(f"{target}: connection timed out after {CONNECT_TIMEOUT_S} s",
                               hint="is the host up and the port right?") from None
    except socket.gaierror as exc:
        raise ConnectionFailed(f"{target}: cannot resolve host name: {exc.strerror}",
                               hint="check `hostname` in hosts.yaml or your ssh_config") from None
    except paramiko.ssh_exception.NoValidConnectionsError as exc:
        reasons = "; ".join(sorted({e.strerror or str(e) for e in exc.errors.values()}))
        raise ConnectionFailed(f"{target}: cannot connect: {reasons}",
                               hint="is sshd running there and the port right?") from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise ConnectionFailed(f"{target}: SSH handshake failed: {exc or type(exc).__name__}",
                               hint="is that port an SSH server?") from None
    connection.transport.set_keepalive(KEEPALIVE_S)
    return connection


@contextmanager
def connect(host: Host, *, bundle: Bundle | None = None) -> Iterator[Remote]:
    """A Remote for `host`: local subprocesses for `local`, else one SSH connection for the task."""
    bundle = bundle or current_bundle()
    remote: Remote = LocalRemote(host, bundle) if host.is_local else SshRemote(host, open_ssh(host), bundle)
    try:
        yield remote
    finally:
        remote.close()
