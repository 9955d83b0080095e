"""A multi-node job's worker as the supervisor's workload (stdlib only): its `--headless` server for one of
the head's attempts, until the head's attempt is over (its node role, server/node_roles.py, says when), the
server dies or a stop comes. The head's workload is server/workload.py's ServerExtraction."""
import time

from base.contract import PHASE_SERVING, PHASE_WAITING
from run.attempt import POLL_S, NotStarted, Watch, log_size
from run.server.attempt_jobs import SERVER, Heartbeat, Jobs, server_status
from run.server.health import SERVER_RUNNING
from run.server.workload import server_failure


class HeadlessServer:
    """A worker node's part of the head's attempt: its server, no client steps, no outputs of its own
    (SAMPLE_FILE None). Its node role (server/node_roles.py Worker) decides everything its attempts
    lead to, so it has no FINISHED and no attempt_log."""
    STARTS = "starting the headless vLLM server"
    SAMPLE_FILE = None

    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.plan = supervisor.record["server"]
        self.jobs = Jobs(supervisor)
        self.heartbeat = Heartbeat(supervisor.run.file("heartbeat.json"))
        self.server_log = supervisor.run.file("server.log")
        self.offset = 0
        self.server = None

    def status_fields(self, previous):
        return server_status(previous)

    def disk_use(self):
        return None  # the head watches the staging directory every node's connector writes

    def wait(self):
        """Between the head's attempts: no server."""
        self.heartbeat.update(phase=PHASE_WAITING, server=None)

    def prepare(self, entry):
        self.offset = log_size(self.server_log)

    def run(self, entry):
        """The server until it dies ((its exit status, its failure)) or a stop comes ((None, None)); the
        head's attempt being over ends it from the node role's look (AttemptEnds)."""
        sup = self.supervisor
        try:
            self.server = self.jobs.start(SERVER, self.plan["server_argv"], self.server_log)
        except OSError as exc:
            raise NotStarted(self.plan["server_argv"], exc) from None
        entry["pid"] = self.server.pid
        sup.started(server_state=SERVER_RUNNING)
        self.heartbeat.update(phase=PHASE_SERVING, server=SERVER_RUNNING)
        # A stopped engine here hangs the head's collectives: named on this node, where it is seen, and the
        # attempt ended (the head reads the failure through the node role).
        clock = Watch(sup, self.server_log, self.offset, processes=self.jobs.processes)
        while not sup.stop_requested():
            if self.server.poll() is not None:
                return self.server.returncode, server_failure(sup, self.offset, self.server.returncode)
            sup.look(self.jobs.members())
            stall = clock.stopped()
            if stall:
                return None, stall
            time.sleep(POLL_S)
        return None, None

    def end(self):
        """The server ended; the attempt's exit status is its own, whoever ended it."""
        ended = dict(self.jobs.end_all(), exit_status=self.server.poll())
        self.supervisor.save(server_state=None)
        self.wait()
        return ended

    def finish(self, outcome):
        # The heartbeat's last phase is the run's final state. The staging directory is the head's to remove.
        self.heartbeat.update(phase=outcome["state"], server=None)
        return outcome
