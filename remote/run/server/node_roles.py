"""The node roles of a multi-node job's supervisors (server/nodes.py), stdlib only: what the head and a
worker add to the supervisor's loop (run/supervisor_loop.py NodeRole).

vLLM couples its nodes at start-up only (measured on the lab, docs/runs.md "Multi-node"): a data-parallel
worker killed with all its processes leaves the head answering /health 200 while the requests routed to
the dead engine hang; a killed head leaves the worker's engine waiting for ever. So specrig couples them.
Each node's supervisor answers on its watch port (Beacon: one JSON line per connection, its run's state)
and asks the others':

- the head (Head; its workload server/workload.py ServerExtraction, as on one host) asks every worker
  every few seconds during an attempt and fails the attempt (`node-lost`, restarted under the usual rules)
  when a worker that served this attempt no longer does: its server exited, its run ended (then not
  restarted), or its supervisor stopped answering. An attempt that failed first (a killed worker makes the
  head's server or client fail within a second, a traceback in its log, before the watch missed enough
  answers) is judged only after a fresh look at the workers: one gone by then makes it `node-lost`, the
  head's own failure kept as its evidence;
- a worker (Worker; its workload HeadlessServer) runs its headless server once per head attempt: it starts
  it when the head's attempt n runs and ends it when that attempt ends (the head restarts: its new server
  waits for the workers' new ones). When its own server dies it says so and waits for the head's next
  attempt: the head's restarts are its own. Its run ends as the head's ended, or failed when the head's
  supervisor stops answering for good.
"""
import json
import socket
import threading
import time

from base import nodes as node_layout
from base.contract import FAILED, FINAL_STATES, RESTARTING, RUNNING, STALLED, STOPPED
from run import classify
from run.attempt import POLL_S, RETRY, AttemptEnds, found_failure
from run.server.health import SERVER_EXITED, SERVER_RUNNING
from run.supervisor_loop import NodeRole

#: The failure kind of a node gone during an attempt.
NODE_LOST = "node-lost"
#: Seconds between two looks at the other nodes.
WATCH_EVERY_S = 2.0
#: Looks in a row without an answer before a node that answered counts as gone.
MISSES = 3
#: How long a finished node keeps answering with its final state, so that every watcher reads it.
LINGER_S = MISSES * WATCH_EVERY_S
#: The head's run states in which its attempt runs (a worker serves it).
HEAD_RUNNING = (RUNNING, STALLED)
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


class Node:
    """What both roles hold: the job's record (run.json "nodes"), this node's beacon, the others' names."""

    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.nodes = supervisor.record["nodes"]
        self.rank = self.nodes["node_rank"]
        self.beacon = None

    def name(self, rank):
        role = "the head" if rank == 0 else "node %d" % rank
        return "%s (%s, %s)" % (role, self.nodes["hosts"][rank], self.nodes["addresses"][rank])

    def watch_address(self, rank):
        return self.nodes["addresses"][rank], node_layout.watch_port(self.nodes, rank)

    def ask(self, rank):
        answer = ask(*self.watch_address(rank))
        return answer if answer and answer.get("job_id") == self.nodes["job_id"] else None

    def open(self, **answer):
        """Start answering on the watch port; the run's failed outcome when the port cannot be had, else None."""
        address, port = self.watch_address(self.rank)
        try:
            self.beacon = Beacon(address, port, dict(answer, job_id=self.nodes["job_id"], node_rank=self.rank,
                                                     role=self.nodes["role"], state=self.supervisor.status["state"]))
        except OSError as exc:
            return {"state": FAILED, "failure": found_failure(
                "node-watch-port", "cannot listen on %s:%d, the job's watch port: %s" % (address, port,
                                                                                        exc.strerror or exc),
                "free the port (`ss -ltnp 'sport = :%d'` names what holds it), or start the job with another "
                "--watch-port" % port, False)}
        return None

    def tell(self, **changes):
        """The others read these in this node's answer from now on (nothing before the beacon is open)."""
        if self.beacon is not None:
            self.beacon.update(**changes)

    def tell_state(self, **changes):
        status = self.supervisor.status
        self.tell(state=status["state"], failure=short_failure(status.get("last_failure")), **changes)

    def close(self):
        """Keep answering with the final state for a while (the others look every few seconds), then stop."""
        if self.beacon is not None:
            time.sleep(LINGER_S)
            self.beacon.close()


class Head(NodeRole):
    """Node 0: the server with the API, the client steps, and the watch over the workers."""

    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.node = Node(supervisor)
        #: Per worker rank during an attempt: whether it served the attempt, and looks without an answer.
        self.workers = {}
        self.last_look = 0.0

    def open(self):
        return self.node.open(attempt=0)

    def saved(self):
        self.node.tell_state(attempt=len(self.supervisor.status["attempts"]))

    def next_attempt(self):
        self.workers = {rank: {"served": False, "misses": 0} for rank in range(1, self.node.nodes["nnodes"])}
        return None

    def look(self):
        """A worker that served this attempt and no longer does ends it (node-lost)."""
        now = time.monotonic()
        if now - self.last_look < WATCH_EVERY_S:
            return
        self.last_look = now
        attempt = len(self.supervisor.status["attempts"])
        for rank in self.workers:
            lost = self.worker_lost(rank, attempt)
            if lost:
                raise AttemptEnds(self.node_lost(rank, *lost, then="ending this attempt on the head"))

    def worker_lost(self, rank, attempt):
        """Worker `rank` asked once: (why, evidence, retryable) when it served this attempt and no longer does,
        else None (it serves it, has not yet, or missed fewer than MISSES looks in a row)."""
        seen = self.workers[rank]
        answer = self.node.ask(rank)
        if answer is None:
            seen["misses"] += 1
            if seen["served"] and seen["misses"] >= MISSES:
                return ("its supervisor stopped answering at %s:%d" % self.node.watch_address(rank), "no answer",
                        True)
            return None
        seen["misses"] = 0
        if answer.get("state") in FINAL_STATES:
            return "its run ended %s" % answer["state"], "run ended", False
        serving = answer.get("serving") == attempt
        if serving and answer.get("server") == SERVER_RUNNING:
            seen["served"] = True
        elif serving and answer.get("server") == SERVER_EXITED:
            failure = answer.get("failure") or {}
            return failure.get("explain") or "its vLLM server exited", failure.get("kind") or "server exited", True
        elif seen["served"]:
            return "it no longer serves this attempt", "not serving", True
        return None

    def judge(self, entry, exit_status, found):
        """A failed attempt is node-lost when a worker that served it is gone by now, whatever the head's own
        processes said: a worker's step killed makes the head's server or client fail within a second (a
        traceback in its log), before the watch has missed MISSES answers. A failure that names a cause that
        will not go away (not retryable: drift, a bad setting, a full disk) is the head's own and decides."""
        sup = self.supervisor
        if sup.stop_requested() or (exit_status == 0 and found is None) or (found or {}).get("kind") == NODE_LOST:
            return None
        cause = found or classify.classify(sup.workload.attempt_log(), exit_status, host=sup.host())
        gone = self.gone_worker(len(sup.status["attempts"])) if cause["retryable"] else None
        if gone is None:
            return sup.judge(entry, exit_status, cause)
        rank, (why, evidence, retryable) = gone
        head_failure = {key: cause.get(key) for key in ("kind", "rule", "evidence")}
        lost = self.node_lost(rank, why, "%s; the head's own failure: %s: %s" % (
            evidence, cause["kind"], cause.get("evidence") or cause["explain"]), retryable,
            then="the head's attempt failed with it (%s)" % cause["kind"], head_failure=head_failure)
        return sup.judge(entry, exit_status, lost)

    def gone_worker(self, attempt):
        """(rank, worker_lost's answer) of a worker that served this attempt and is gone, looked at afresh;
        one that does not answer is asked again every WATCH_EVERY_S until it answers or has missed MISSES
        in a row (a bounded wait, a few seconds); None when every one that served it still serves it."""
        waiting = [rank for rank, seen in self.workers.items() if seen["served"]]
        while waiting:
            for rank in list(waiting):
                lost = self.worker_lost(rank, attempt)
                if lost:
                    return rank, lost
                if self.workers[rank]["misses"] == 0:
                    waiting.remove(rank)
            if waiting:
                time.sleep(WATCH_EVERY_S)
        return None

    def node_lost(self, rank, why, evidence, retryable, *, then, **fields):
        nodes = self.node.nodes
        found = found_failure(
            NODE_LOST, "%s: %s" % (self.node.name(rank), why),
            "`inv status --host %s --run %s` and `inv logs --server` there show why; the whole job restarts on "
            "every node%s" % (nodes["hosts"][rank], nodes["job_id"],
                              "" if retryable else " with `inv resume --host GROUP --run %s`" % nodes["job_id"]),
            retryable, role="node %d" % rank, evidence="node %d: %s" % (rank, evidence), **fields)
        self.supervisor.log_marker("%s; %s" % (found["explain"], then))
        return found

    def close(self, outcome):
        self.node.close()


class Worker(NodeRole):
    """Node k > 0: an attempt is this node's part of one of the head's attempts; the head's restarts are
    its restarts, so it judges none and backs off never."""

    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.node = Node(supervisor)
        #: The head's last attempt served, whether the head ever answered, looks in a row without an answer.
        self.served, self.answered, self.misses = 0, False, 0
        self.waiting_since = time.monotonic()
        #: During an attempt: the last look at the head, and looks in a row without an answer.
        self.last_look, self.attempt_misses = 0.0, 0
        #: The head's final answer when an attempt's look saw it. Ending this node's server can outlast the
        #: head's LINGER_S on a loaded host; the head then no longer answers, and the run has still ended so.
        self.head_ended = None

    def open(self):
        failed = self.node.open(serving=None, server=None)
        if failed:
            return failed
        # A supervisor started again on its run (a resume; a Slurm job's worker step killed and started
        # again) never joins a head attempt it served before: that attempt's engines started without this
        # node's new server, and its requests would hang. It waits for the head's next attempt.
        self.served = max([entry.get("head_attempt") or 0 for entry in self.supervisor.status.get("attempts") or []]
                          + [0])
        self.supervisor.workload.wait()
        self.supervisor.log_marker("node %d of job %s: waiting for %s" % (self.node.rank, self.node.nodes["job_id"],
                                                                         self.node.name(0)))
        return None

    def saved(self):
        self.node.tell_state()

    def next_attempt(self):
        """Wait for the head's next attempt (None: serve it); the run's outcome when the head's run ends,
        the head is gone, or a stop comes."""
        sup = self.supervisor
        if self.head_ended is not None:
            return self.as_head_ended(self.head_ended)
        while not sup.stop_requested():
            head = self.node.ask(0)
            if head is None:
                self.misses += 1
                if self.answered and self.misses >= MISSES:
                    return self.head_gone("stopped answering")
                if not self.answered and time.monotonic() - self.waiting_since > sup.options["load_timeout_s"]:
                    return self.head_gone("never answered in %d s (load_timeout_s)" % sup.options["load_timeout_s"])
            else:
                self.answered, self.misses = True, 0
                if head.get("state") in FINAL_STATES:
                    return self.as_head_ended(head)
                if head.get("state") in HEAD_RUNNING and (head.get("attempt") or 0) > self.served:
                    self.served = head["attempt"]
                    return None
            time.sleep(WATCH_EVERY_S)
        return {"state": STOPPED}

    def begin_attempt(self, entry):
        entry["head_attempt"] = self.served
        self.last_look, self.attempt_misses = time.monotonic(), 0
        self.node.tell(serving=self.served, server=SERVER_RUNNING)
        return " for the head's attempt %d" % self.served

    def look(self):
        """The head's attempt this node serves is over (another attempt, the run no longer running, or no
        answer MISSES times): AttemptEnds, with no failure of this node's."""
        if time.monotonic() - self.last_look < WATCH_EVERY_S:
            return
        self.last_look = time.monotonic()
        head = self.node.ask(0)
        self.attempt_misses = self.attempt_misses + 1 if head is None else 0
        if head is not None and head.get("state") in FINAL_STATES:
            self.head_ended = head
        if self.attempt_misses >= MISSES or (head is not None and (head.get("attempt") != self.served
                                                                   or head.get("state") not in HEAD_RUNNING)):
            self.supervisor.log_marker("the head's attempt %d is over: ending this node's server" % self.served)
            raise AttemptEnds(None)

    def attempt_ended(self, entry, found):
        """Its server died (`found`) or is about to be ended: the head reads it at once."""
        if found:
            entry["failure"] = dict(found, attempt=entry["attempt"])
            self.supervisor.save(last_failure=entry["failure"])
        self.node.tell(server=SERVER_EXITED)

    def judge(self, entry, exit_status, found):
        sup = self.supervisor
        if sup.stop_requested():
            entry["stopped"] = True
            sup.log_marker("attempt %d: stopped (%s)" % (entry["attempt"], sup.stop_signal or "stop requested"))
        sup.save(state=RESTARTING)
        return {"state": RETRY}

    def back_off(self):
        """No delay of this node's own: the head's restart says when the next attempt starts."""
        return not self.supervisor.stop_requested()

    def head_gone(self, how):
        nodes = self.node.nodes
        failure = found_failure(
            NODE_LOST, "%s %s at %s:%d" % ((self.node.name(0), how) + self.node.watch_address(0)),
            "`inv status --host %s --run %s` shows the head's run; `inv resume --host GROUP --run %s` restarts the "
            "job on every node" % (nodes["hosts"][0], nodes["job_id"], nodes["job_id"]), False, role="head")
        self.supervisor.log_marker(failure["explain"])
        return {"state": FAILED, "failure": failure}

    def as_head_ended(self, head):
        """This node's outcome when the head's run ended: the same state (the job's)."""
        nodes = self.node.nodes
        self.supervisor.log_marker("%s ended %s: this node ends with it" % (self.node.name(0), head["state"]))
        if head["state"] != FAILED:
            return {"state": head["state"]}
        cause = head.get("failure") or {}
        return {"state": FAILED, "failure": found_failure(
            "head-failed", "%s failed: %s" % (self.node.name(0), cause.get("explain") or "see its status"),
            "`inv status --host %s --run %s` shows why" % (nodes["hosts"][0], nodes["job_id"]), False,
            role="head", evidence=cause.get("kind"))}

    def close(self, outcome):
        self.node.close()
