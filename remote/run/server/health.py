"""The vLLM server's health endpoint, asked without a proxy (stdlib only).

`GET /health` answers 200 once the engine serves, 503 once the engine is dead (vLLM 0.16-0.32
entrypoints/serve/instrumentator/health.py); before the model is loaded nothing listens. http.client,
not urllib: urllib would send a loopback request through $http_proxy when the host sets one.
"""
import http.client
import socket

#: The server's states as /health tells them: status.json's `server_state` and the heartbeat's `server`
#: (a worker's headless server, which serves no /health, has its own: server/workload.py). A third
#: vocabulary beside the run states and the heartbeat phases (remote/contract.py); LOADING is the same
#: word as PHASE_LOADING, and while the server loads the attempt's phase is that one.
LOADING, READY, UNHEALTHY = "loading", "ready", "unhealthy"


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
