"""A server-mode attempt's processes and its progress file (stdlib only): Jobs, the attempt's jobs by name, each
a session of its own, and Heartbeat, heartbeat.json, which the supervisor writes itself in server mode (no
driver does). The workloads are server/workload.py (the head, one host) and server/headless.py (a worker).
"""
import os
import subprocess

from base import atomic, procs
from base.contract import PHASE_STARTING
from run.attempt import child_env

#: The attempt's jobs (status.json "jobs"): the server, then the client steps' processes (warm_steps.client_job).
SERVER = "server"


def server_status(previous):
    """What server mode adds to status.json; N, the prepared rows, survives a resume with the prepared
    directory it was read from."""
    return {"jobs": {}, "server_state": None, "result": previous.get("result"),
            "samples_total": previous.get("samples_total")}


class Heartbeat:
    """heartbeat.json of a server-mode run, written by its supervisor."""

    def __init__(self, path):
        self.path = path
        self.beat = {"phase": PHASE_STARTING, "samples_done": 0, "samples_total": None, "samples_per_s": None,
                     "tokens_per_s": None, "eta_s": None, "server": None, "last_error": None, "pid": os.getpid()}

    def update(self, **changes):
        self.beat.update(changes)
        atomic.write_json(self.path, self.beat)


class Jobs:
    """The attempt's jobs by name (SERVER, client_job), each a session of its own; status.json's "jobs" names them with the
    processes seen in each, so that `inv stop` finds them too."""

    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.running = {}

    def start(self, name, argv, log_path):
        # speculators logs through rich, which wraps at 80 columns without a terminal (and pads every line
        # to the width): wide enough for most records on one line; `skipped()` does not need the summary's.
        env = child_env(COLUMNS="200")
        # The client talks to 127.0.0.1: a proxy set on the host must not carry those requests.
        env["NO_PROXY"] = env["no_proxy"] = ",".join(filter(None, [env.get("NO_PROXY"), "127.0.0.1", "localhost"]))
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.supervisor.run.path, env=env, start_new_session=True)
        self.running[name] = (proc, procs.Job(proc.pid))
        self.supervisor.status["jobs"][name] = {"pid": proc.pid, "pgid": proc.pid, "argv": argv, "seen": {}}
        return proc

    def members(self):
        return {m["pid"] for m in self.processes()}

    def processes(self):
        """The live processes of every job, each with its job's name ("job")."""
        found = []
        for name, (_proc, job) in self.running.items():
            found += [dict(m, job=name) for m in job.members()]
            self.supervisor.status["jobs"][name]["seen"] = job.saved()
        return found

    def end(self, name):
        """End one job and what it left (vLLM's workers outlive a killed parent); its cleanup record."""
        proc, job = self.running.pop(name)
        ended = self.supervisor.end_job(proc, job)
        self.supervisor.status["jobs"].pop(name, None)
        return ended

    def end_all(self):
        merged = {"orphans_ended": None, "left_behind": None, "gpu_memory": None}
        for name in sorted(self.running, key=lambda n: n == SERVER):  # the clients first: they talk to the server
            for key, value in self.end(name).items():
                if value:
                    merged[key] = (merged[key] or []) + value
        return merged
