"""A call's channel, read to its end without polling (transport/ssh.py: _drain), on the real lab host:
stdout and stderr both past the SSH window, the exit status, the laptop's own deadline, and a
connection that drops during a call."""
import socket
import threading

import pytest

from specrig.errors import ConnectionFailed, RemoteTimeout
from specrig.transport import connect, ssh


def test_both_streams_past_the_window_and_the_exit_status(lab):
    with connect(lab.host("lab")) as remote:
        assert remote.exec("echo out; echo err >&2; exit 3", timeout=30) == (3, "out\n", "err\n")
        # 3 MB on each stream, more than paramiko's 2 MB window: neither may stall the other. The exit
        # status may overtake stderr's last bytes (it did, about one call in twenty): every byte counts.
        for _ in range(10):
            rc, out, err = remote.exec("head -c 3000000 /dev/zero; head -c 3000000 /dev/zero >&2", timeout=30)
            assert (rc, len(out), len(err)) == (0, 3000000, 3000000)


def test_the_laptop_deadline_closes_a_silent_call(lab, monkeypatch):
    monkeypatch.setattr(ssh, "DEADLINE_GRACE_S", 0.5)
    with connect(lab.host("lab")) as remote:
        with pytest.raises(RemoteTimeout, match="no answer within"):
            remote.exec("sleep 30", timeout=1)


def test_a_connection_dropped_during_a_call_is_a_connection_failure(lab):
    with connect(lab.host("lab")) as remote:
        timer = threading.Timer(0.5, remote.connection.transport.close)
        timer.start()
        try:
            with pytest.raises(ConnectionFailed, match="dropped during a call"):
                remote.exec("sleep 20; echo late", timeout=60)
        finally:
            timer.cancel()


def test_a_connection_ended_just_before_a_call_is_a_connection_failure(lab):
    """The peer ends the connection between the call's liveness check and its channel request: paramiko
    re-raises its reader thread's error (EOFError, a reset) to the opener; it must read as a lost
    connection, which the live view explains, not as a traceback (the CI run at 3bbe5d0)."""
    for _ in range(10):
        with connect(lab.host("lab")) as remote:
            remote.exec("true", timeout=30)
            remote.connection.transport.sock.shutdown(socket.SHUT_RDWR)
            with pytest.raises(ConnectionFailed, match="connection"):
                remote.exec("true", timeout=30)
