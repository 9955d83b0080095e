"""The host-independent half of a call: the payload sent and the result read back.

A call runs remote/entry.py with one JSON argument file; its stdout ends with one line,
SENTINEL + JSON, holding the result or a typed failure. A failure's kind picks the laptop error
from one table (specrig.transport.failures).
"""
from __future__ import annotations

import json

from specrig.contract import SENTINEL
from specrig.errors import RemotePythonError, RemoteScriptError, SpecrigError
from specrig.inventory import Host
from specrig.transport.failures import error_for

#: Extra seconds the laptop waits past a call's deadline for the host to report it.
DEADLINE_GRACE_S = 10
#: Where specrig keeps its bundles and call files, relative to the remote home.
CACHE = ".cache/specrig"


class Remote:
    """A host to run calls on. Subclasses supply `_run(call_json, timeout) -> (rc, stdout, stderr)`."""

    def __init__(self, host: Host):
        self.host = host
        #: Round trips spent (exec channels opened); the latency benchmark reads it.
        self.exec_count = 0

    def call(self, command: str, args: dict | None = None, *, timeout: float | None = 120,
             env: dict | None = None, python: str | None = None) -> dict:
        """Run remote/<command>.py's run(args) and return its dict, or raise a typed error.

        `python`: the interpreter to run it with instead of hosts.yaml's `python` (e.g. the
        host's server_python, for a call that works in the vLLM server's environment).
        """
        payload = {"command": command, "args": args or {}, "env": {**self.host.env, **(env or {})},
                   "timeout_s": timeout}
        body = json.dumps(payload).encode()
        interpreter = python or self.host.python
        rc, out, err = self._run(body, timeout, interpreter)
        return self._result(command, rc, out, err, interpreter)

    def _run(self, body: bytes, timeout: float | None, python: str) -> tuple[int, str, str]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _result(self, command: str, rc: int, out: str, err: str, python: str | None = None) -> dict:
        line = next((l for l in reversed(out.splitlines()) if l.startswith(SENTINEL)), None)
        if line is None:
            raise self._no_result(rc, out, err, python or self.host.python)
        reply = json.loads(line[len(SENTINEL):])
        if reply.get("ok"):
            return reply["result"]
        raise error_for(self.host, command, reply.get("error") or {})

    def _no_result(self, rc: int, out: str, err: str, python: str | None = None) -> SpecrigError:
        tail = (err.strip() or out.strip()).splitlines()[-1:] or [f"exit status {rc}"]
        python = python or self.host.python
        if rc in (126, 127) or "not found" in err or "No such file" in err:
            key = "server_python" if python != self.host.python else "python"
            return RemotePythonError(
                f"{self.host.name}: remote python {python!r} cannot be run: {tail[0]}",
                hint=f"set `{key}` in hosts.yaml to the interpreter of the environment holding "
                     f"{'the vLLM server' if key == 'server_python' else 'vLLM'}")
        return RemoteScriptError(f"{self.host.name}: remote command ended without a result (exit {rc}): {tail[0]}",
                                 detail=err or out)
