"""The vLLM server's health endpoint, asked without a proxy (stdlib only).

`GET /health` answers 200 once the engine serves, 503 once the engine is dead (vLLM 0.16-0.32
entrypoints/serve/instrumentator/health.py); before the model is loaded nothing listens. http.client,
not urllib: urllib would send a loopback request through $http_proxy when the host sets one.
"""
import http.client
import socket
import time

#: The server's states as /health tells them: status.json's `server_state` and the heartbeat's `server`
#: (a worker's headless server, which serves no /health, has its own: SERVER_RUNNING, SERVER_EXITED). A third
#: vocabulary beside the run states and the heartbeat phases (remote/base/contract.py); LOADING is the same
#: word as PHASE_LOADING, and while the server loads the attempt's phase is that one.
LOADING, READY, UNHEALTHY = "loading", "ready", "unhealthy"
#: A worker's headless server, as status.json's `server_state`, its heartbeat and its beacon tell it: no
#: /health to ask (LOADING/READY are the head's), only whether its process runs.
SERVER_RUNNING, SERVER_EXITED = "running", "exited"


def probe(port, host="127.0.0.1", timeout=2.0):
    """READY (200), UNHEALTHY (any other answer) or LOADING (no answer: not listening yet, or busy)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/health")
        status = connection.getresponse().status
    except (OSError, socket.timeout, http.client.HTTPException):
        return LOADING
    finally:
        connection.close()
    return READY if status == 200 else UNHEALTHY


#: Seconds between health probes while the server loads, and once it serves.
HEALTH_EVERY_LOADING_S = 1.0
HEALTH_EVERY_S = 5.0
#: Probes in a row that must find a served server unhealthy (503, or no answer) before it counts as dead.
UNHEALTHY_PROBES = 3


class ServerHealth:
    """A server's /health, asked every `every_loading_s` while it loads and every `every_s` once it serves (the
    model's server: 1 s and 5 s; the render server, which prepare-data waits on, more often), each probe given
    `timeout` seconds."""

    def __init__(self, port, state, *, every_loading_s=HEALTH_EVERY_LOADING_S, every_s=HEALTH_EVERY_S, timeout=2.0):
        self.port, self.state = port, state
        self.every_loading_s, self.every_s, self.timeout = every_loading_s, every_s, timeout
        self.last_probe, self.unhealthy, self.answer = 0.0, 0, None

    def look(self):
        """The server's state: LOADING until it first answers 200, then READY, UNHEALTHY once
        UNHEALTHY_PROBES probes in a row found it otherwise (`answer` the last one)."""
        now = time.monotonic()
        if now - self.last_probe < (self.every_loading_s if self.state == LOADING else self.every_s):
            return self.state
        self.last_probe = now
        self.answer = probe(self.port, timeout=self.timeout)
        if self.state == LOADING:
            self.state = READY if self.answer == READY else LOADING
            return self.state
        self.unhealthy = 0 if self.answer == READY else self.unhealthy + 1
        return UNHEALTHY if self.unhealthy >= UNHEALTHY_PROBES else self.state
