"""The supervisors of a multi-node job's nodes (server/nodes.py), stdlib only.

vLLM couples its nodes at start-up only (measured on the lab, docs/runs.md "Multi-node"): a data-parallel
worker killed with all its processes leaves the head answering /health 200 while the requests routed to
the dead engine hang; a killed head leaves the worker's engine waiting for ever. So specrig couples them.
Each node's supervisor answers on its watch port (Beacon: one JSON line per connection, its run's state)
and asks the others':

- the head (HeadSupervisor) is a server-mode run as on one host (server, client steps, validation,
  restarts); during an attempt it asks every worker every few seconds and fails the attempt
  (`node-lost`, restarted under the usual rules) when a worker that served this attempt no longer does:
  its server exited, its run ended (then not restarted), or its supervisor stopped answering;
- a worker (WorkerSupervisor) runs its headless server once per head attempt: it starts it when the
  head's attempt n runs and ends it when that attempt ends (the head restarts: its new server waits for
  the workers' new ones). When its own server dies it says so and waits for the head's next attempt.
  Its run ends as the head's ended, or failed when the head's supervisor stops answering for good.
"""
import json
import os
import socket
import threading
import time

from contract import FINAL_STATES
from run import rundir
from run.server.supervision import ServerSupervisor
from run.supervision import POLL_S, Supervisor

#: Seconds between two looks at the other nodes.
WATCH_EVERY_S = 2.0
#: Looks in a row without an answer before a node that answered counts as gone.
MISSES = 3
#: How long a finished node keeps answering with its final state, so that every watcher reads it.
LINGER_S = MISSES * WATCH_EVERY_S
#: The head states in which its attempt runs (a worker serves it).
HEAD_RUNNING = ("running", "stalled")
#: A worker's server, as its beacon tells the head.
RUNNING, EXITED = "running", "exited"
ANSWER_BYTES = 64 * 1024


class Beacon:
    """This node's supervisor on the network: each connection to (address, port) gets one JSON line, the
    current answer, and is closed. Served from a thread for as long as the supervisor holds it."""

    def __init__(self, address, port, answer):
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # A resumed run binds the port again while the old connections linger in TIME_WAIT.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((address, port))
            self.socket.listen(16)
        except OSError:
            self.socket.close()
            raise
        self.socket.settimeout(POLL_S)
        self.answer = dict(answer)
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._serve, name="specrig-beacon", daemon=True).start()

    def update(self, **changes):
        with self.lock:
            self.answer.update(changes)

    def _serve(self):
        while not self.closed:
            try:
                connection, _ = self.socket.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                line = (json.dumps(self.answer) + "\n").encode()
            try:
                connection.sendall(line)
            except OSError:
                pass
            finally:
                connection.close()

    def close(self):
        self.closed = True
        self.socket.close()


def ask(address, port, timeout=2.0):
    """The answer of the beacon at (address, port), or None: nothing listens, or no whole line came."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as connection:
            data = b""
            while not data.endswith(b"\n") and len(data) < ANSWER_BYTES:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    try:
        return json.loads(data.decode())
    except ValueError:
        return None


def short_failure(failure):
    """What another node needs of a failure: its kind and its explanation."""
    return failure and {"kind": failure.get("kind"), "explain": failure.get("explain")}


class NodeMixin:
    """What both roles share: the job's record, the beacon, the way a node names another."""

    def setup_node(self):
        self.nodes = self.record["nodes"]
        self.rank = self.nodes["node_rank"]
        self.beacon = None

    def node_name(self, rank):
        role = "the head" if rank == 0 else "node %d" % rank
        return "%s (%s, %s)" % (role, self.nodes["hosts"][rank], self.nodes["addresses"][rank])

    def watch_address(self, rank):
        return self.nodes["addresses"][rank], self.nodes["watch_port"]

    def ask_node(self, rank):
        answer = ask(*self.watch_address(rank))
        return answer if answer and answer.get("job_id") == self.nodes["job_id"] else None

    def open_beacon(self, **answer):
        """Start answering on the watch port; a failure record when the port cannot be had, else None."""
        address, port = self.watch_address(self.rank)
        try:
            self.beacon = Beacon(address, port, dict(answer, job_id=self.nodes["job_id"], node_rank=self.rank,
                                                     role=self.nodes["role"], state=self.status["state"]))
        except OSError as exc:
            return self.failure("node-watch-port", "cannot listen on %s:%d, the job's watch port: %s"
                                % (address, port, exc.strerror or exc),
                                "free the port (`ss -ltnp 'sport = :%d'` names what holds it), or start the job "
                                "with another --watch-port" % port, False)
        return None

    def save(self, **changes):
        Supervisor.save(self, **changes)
        if self.beacon is not None:
            self.beacon.update(state=self.status["state"], failure=short_failure(self.status.get("last_failure")))

    def close_beacon(self):
        """Keep answering with the final state for a while (the others look every few seconds), then stop."""
        if self.beacon is not None:
            time.sleep(LINGER_S)
            self.beacon.close()


class HeadSupervisor(NodeMixin, ServerSupervisor):
    """Node 0: the server with the API, the client steps, and the watch over the workers."""

    def __init__(self, run):
        ServerSupervisor.__init__(self, run)
        self.setup_node()
        #: Per worker rank during an attempt: whether it served the attempt, and looks without an answer.
        self.workers = {}
        self.last_look = 0.0

    def main(self):
        failed = self.open_beacon(attempt=0)
        if failed:
            return self.finish({"state": "failed", "failure": failed})
        return ServerSupervisor.main(self)

    def save(self, **changes):
        NodeMixin.save(self, **changes)
        if self.beacon is not None:
            self.beacon.update(attempt=len(self.status["attempts"]))

    def attempt(self):
        self.workers = {rank: {"served": False, "misses": 0} for rank in range(1, self.nodes["nnodes"])}
        return ServerSupervisor.attempt(self)

    def other_nodes_failure(self):
        """A worker that served this attempt and no longer does ends it (node-lost); None while all serve."""
        now = time.monotonic()
        if now - self.last_look < WATCH_EVERY_S:
            return None
        self.last_look = now
        attempt = len(self.status["attempts"])
        for rank, seen in self.workers.items():
            answer = self.ask_node(rank)
            if answer is None:
                seen["misses"] += 1
                if seen["served"] and seen["misses"] >= MISSES:
                    return self.node_lost(rank, "its supervisor stopped answering at %s:%d" % self.watch_address(rank),
                                          "no answer", retryable=True)
                continue
            seen["misses"] = 0
            if answer.get("state") in FINAL_STATES:
                return self.node_lost(rank, "its run ended %s" % answer["state"], "run ended", retryable=False)
            serving = answer.get("serving") == attempt
            if serving and answer.get("server") == RUNNING:
                seen["served"] = True
            elif serving and answer.get("server") == EXITED:
                failure = answer.get("failure") or {}
                return self.node_lost(rank, failure.get("explain") or "its vLLM server exited",
                                      failure.get("kind") or "server exited", retryable=True)
            elif seen["served"]:
                return self.node_lost(rank, "it no longer serves this attempt", "not serving", retryable=True)
        return None

    def node_lost(self, rank, why, evidence, *, retryable):
        found = self.failure(
            "node-lost", "%s: %s" % (self.node_name(rank), why),
            "`inv status --host %s --run %s` and `inv logs --server` there show why; the whole job restarts on "
            "every node%s" % (self.nodes["hosts"][rank], self.nodes["job_id"],
                              "" if retryable else " with `inv resume --host GROUP --run %s`" % self.nodes["job_id"]),
            retryable, role="node %d" % rank, evidence="node %d: %s" % (rank, evidence))
        self.log_marker("%s; ending this attempt on the head" % found["explain"])
        return found

    def finish(self, outcome):
        result = ServerSupervisor.finish(self, outcome)
        self.close_beacon()
        return result


class WorkerSupervisor(NodeMixin, ServerSupervisor):
    """Node k > 0: the headless server, once per head attempt; no client steps, no outputs of its own.
    An attempt is this node's part of one of the head's attempts; the head's restarts are its restarts."""

    def __init__(self, run):
        ServerSupervisor.__init__(self, run)
        self.setup_node()
        #: The head's last attempt served, whether the head ever answered, looks in a row without an answer.
        self.served, self.answered, self.misses = 0, False, 0
        self.waiting_since = time.monotonic()

    def main(self):
        failed = self.open_beacon(serving=None, server=None)
        if failed:
            return self.finish({"state": "failed", "failure": failed})
        self.heartbeat(phase="waiting", server=None)
        self.log_marker("node %d of job %s: waiting for %s" % (self.rank, self.nodes["job_id"], self.node_name(0)))
        return ServerSupervisor.main(self)

    def attempt(self):
        """Wait for the head's next attempt and serve it ({"state": "retry"}: wait for the one after); the
        run's outcome when the head's run ends, the head is gone, or a stop comes."""
        while not self.stop_requested():
            head = self.ask_node(0)
            if head is None:
                self.misses += 1
                if self.answered and self.misses >= MISSES:
                    return self.head_gone("stopped answering")
                if not self.answered and time.monotonic() - self.waiting_since > self.options["load_timeout_s"]:
                    return self.head_gone("never answered in %d s (load_timeout_s)" % self.options["load_timeout_s"])
            else:
                self.answered, self.misses = True, 0
                if head.get("state") in FINAL_STATES:
                    return self.as_head_ended(head)
                if head.get("state") in HEAD_RUNNING and (head.get("attempt") or 0) > self.served:
                    self.served = head["attempt"]
                    return self.serve(self.served)
            time.sleep(WATCH_EVERY_S)
        return {"state": "stopped"}

    def backoff(self):
        """No delay of this node's own: the head's restart says when the next attempt starts."""
        return not self.stop_requested()

    def serve(self, head_attempt):
        """The server for the head's attempt `head_attempt`, until that attempt ends, the server dies or a
        stop comes ({"state": "retry"}); the run's failure when the server cannot be started at all."""
        number = len(self.status["attempts"]) + 1
        server_log = self.run.file("server.log")
        offsets = {server_log: os.path.getsize(server_log) if os.path.exists(server_log) else 0}
        self.log_marker("attempt %d: starting the headless vLLM server for the head's attempt %d"
                        % (number, head_attempt))
        entry = {"attempt": number, "head_attempt": head_attempt, "started_at": rundir.now_iso(), "pid": None,
                 "ended_at": None, "exit_status": None, "failure": None}
        self.status["attempts"].append(entry)
        self.last_telemetry = 0.0
        self.beacon.update(serving=head_attempt, server=RUNNING)
        try:
            server = self.start("server", self.plan["server_argv"], server_log)
        except OSError as exc:
            self.beacon.update(server=EXITED)
            return self.not_started(number, self.plan["server_argv"], exc, entry=entry)
        entry["pid"] = server.pid
        self.save(state="running", restart_at=None, server_state=RUNNING)
        self.heartbeat(phase="serving", server=RUNNING)
        last_look, misses = time.monotonic(), 0
        while not self.stop_requested():
            if server.poll() is not None:
                entry["failure"] = dict(self.server_failure(server.returncode, offsets), attempt=number)
                self.beacon.update(server=EXITED)
                self.save(last_failure=entry["failure"])
                break
            if time.monotonic() - last_look >= WATCH_EVERY_S:
                last_look = time.monotonic()
                head = self.ask_node(0)
                misses = misses + 1 if head is None else 0
                if misses >= MISSES or (head is not None and (head.get("attempt") != head_attempt
                                                              or head.get("state") not in HEAD_RUNNING)):
                    self.log_marker("the head's attempt %d is over: ending this node's server" % head_attempt)
                    break
            self.sample_gpus(self.members())
            time.sleep(POLL_S)
        if self.stop_requested():
            entry["stopped"] = True
            self.log_marker("attempt %d: stopped (%s)" % (number, self.stop_signal or "stop requested"))
        entry.update(self.end_all(), ended_at=rundir.now_iso(), exit_status=server.poll())
        self.beacon.update(server=EXITED)
        self.save(state="restarting", server_state=None)
        self.heartbeat(phase="waiting", server=None)
        return {"state": "retry"}

    def head_gone(self, how):
        failure = self.failure("node-lost", "%s %s at %s:%d" % ((self.node_name(0), how) + self.watch_address(0)),
                               "`inv status --host %s --run %s` shows the head's run; `inv resume --host GROUP --run "
                               "%s` restarts the job on every node" % (self.nodes["hosts"][0], self.nodes["job_id"],
                                                                       self.nodes["job_id"]),
                               False, role="head")
        self.log_marker(failure["explain"])
        return {"state": "failed", "failure": failure}

    def as_head_ended(self, head):
        """This node's outcome when the head's run ended: the same state (the job's)."""
        self.log_marker("%s ended %s: this node ends with it" % (self.node_name(0), head["state"]))
        if head["state"] != "failed":
            return {"state": head["state"]}
        cause = head.get("failure") or {}
        return {"state": "failed", "failure": self.failure(
            "head-failed", "%s failed: %s" % (self.node_name(0), cause.get("explain") or "see its status"),
            "`inv status --host %s --run %s` shows why" % (self.nodes["hosts"][0], self.nodes["job_id"]), False,
            role="head", evidence=cause.get("kind"))}

    def finish(self, outcome):
        self.heartbeat(phase=outcome["state"], server=None)
        # Supervisor's finish, not ServerSupervisor's: the staging directory is the head's to remove.
        result = Supervisor.finish(self, outcome)
        self.close_beacon()
        return result


def for_node(run):
    """The supervisor of this node's run: the head's or a worker's."""
    return (HeadSupervisor if run.record["nodes"]["node_rank"] == 0 else WorkerSupervisor)(run)
