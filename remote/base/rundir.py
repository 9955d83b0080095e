"""One run directory per supervised run: <workdir>/runs/<run-id>/ (stdlib only).

    run.json          the launch record: driver arguments, supervision options, env_keys, python
    code/             the remote/ files the run was launched with (bundles may be replaced)
    driver-args.json  what the driver reads (its schema is documented in extract_driver.py)
    heartbeat.json    written by the driver, atomically, every few seconds
    status.json       written by the supervisor: state, attempts, failures, progress, GPUs
    driver.log        the driver's stdout and stderr, all attempts, with supervisor markers
    supervisor.log    the supervisor's own output (empty unless it crashed)
    slurm-job.sh      a run on a Slurm cluster: its job script (slurm/jobs.py), with the job's own
    slurm-<job>.out   output and error beside it; run.json's `slurm` holds the settings and the job id
    exit.json         the final record, once the supervisor is done
    stop.request      present once a stop was asked for; the supervisor does not restart after it

Every JSON file is replaced atomically (write to a temporary name, fsync, rename),
so a reader never sees half a file.

A run is its user's alone: runs/ and every run directory 0700, every file 0600 (the call's
`umask 077`, which the supervisor and its jobs inherit; make_private for what older specrig left
0755/0644, and for code/, copied with the bundle's modes). run.json keeps the names of the
hosts.yaml `env:` variables (`env_keys`), never their values.
"""
import contextlib
import datetime
import fcntl
import os
import random
import shutil
import string
import time

from base import procs, slurm_queries
from base.atomic import read_json, write_json
from base.contract import (
    ACTIVE_STATES,
    FINAL_STATES,
    LOST,
    RESTARTING,
    STARTING,
    STOPPED,
    SUPERVISOR_SILENT_S,
    UNRESPONSIVE,
    pace_now,
    run_kind,
)
from base.failure import RemoteFailure

RUNS = "runs"
#: A run's supervisor's liveness: touched by a thread of its own every SUPERVISOR_BEAT_S (supervisor_loop.py).
SUPERVISOR_BEAT = "supervisor.beat"
#: Modes of what specrig writes in a workdir: directories and files its user's alone.
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def runs_root(workdir):
    return os.path.join(os.path.expanduser(workdir), RUNS)


def make_private(path):
    """`path` and everything under it its user's alone: directories PRIVATE_DIR, files PRIVATE_FILE.
    Symbolic links are not followed (what they point at is not the run's)."""
    if os.path.islink(path) or not os.path.exists(path):
        return
    os.chmod(path, PRIVATE_DIR if os.path.isdir(path) else PRIVATE_FILE)
    for directory, subdirectories, names in os.walk(path):
        for name in subdirectories + names:
            entry = os.path.join(directory, name)
            try:
                if not os.path.islink(entry):
                    os.chmod(entry, PRIVATE_DIR if name in subdirectories else PRIVATE_FILE)
            except FileNotFoundError:
                pass  # a temporary file renamed away meanwhile


def new_run_id():
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return "%s-%s" % (stamp, "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(4)))


def current_names(record):
    """A launch record in today's names. Records written before a sharded run had a word of its own hold
    its shard as "fleet" with "fleet_run_id"; such runs are still resumed and gathered on an upgraded host."""
    old = record.pop("fleet", None)
    if old and "shard" not in record:
        record["shard"] = {("sharded_run_id" if key == "fleet_run_id" else key): value for key, value in old.items()}
    return record


class RunDir:
    """The files of one run and the questions asked of them."""

    def __init__(self, path):
        self.path = path
        self.run_id = os.path.basename(path.rstrip("/"))

    def file(self, name):
        return os.path.join(self.path, name)

    @property
    def record(self):
        return current_names(read_json(self.file("run.json"), {}))

    @property
    def status(self):
        return read_json(self.file("status.json"), {})

    @property
    def exit_record(self):
        return read_json(self.file("exit.json"))

    @property
    def heartbeat(self):
        return read_json(self.file("heartbeat.json"))

    def heartbeat_since(self, since):
        """The heartbeat once written at `since` (a time) or later, else None: an earlier one is an earlier
        attempt's, its phase and counts no longer true."""
        try:
            fresh = os.path.getmtime(self.file("heartbeat.json")) >= since
        except OSError:
            return None
        return self.heartbeat if fresh else None

    def stop_requested(self):
        return os.path.exists(self.file("stop.request"))

    def supervisor_alive(self):
        """Whether the supervisor runs: its pid, here; a Slurm job's, as long as Slurm says the job may run
        a process (its node may be another machine, its pid meaningless here)."""
        if self.slurm_job_id():
            return slurm_queries.holds_processes(self.slurm_job())
        pid = self.status.get("supervisor_pid")
        return bool(pid) and procs.alive(pid) and self.run_id in procs.cmdline(pid)

    def supervisor_unanswering(self):
        """Why the run's live supervisor does not answer ('stopped', 'silent for N s'), or None when it does: a
        Slurm job's runs on its node, whose process this host cannot see (None)."""
        pid = self.status.get("supervisor_pid")
        if self.slurm_job_id() or not pid:
            return None
        if procs.state(pid) in ("T", "t"):
            return "stopped"
        try:
            silent = time.time() - os.path.getmtime(self.file(SUPERVISOR_BEAT))
        except OSError:
            return None  # a supervisor of an earlier specrig, which writes no beat
        return "silent for %.0f s" % silent if silent > SUPERVISOR_SILENT_S else None

    def slurm_job_id(self):
        """The id of the run's Slurm job (its newest, once resumed), or None: not a Slurm run, or not
        submitted yet."""
        return (self.record.get("slurm") or {}).get("job_id")

    def slurm_job(self):
        """What Slurm says of the run's job (base/slurm_queries.py lookup), asked once for this RunDir: one
        answer for every question a call asks of the run."""
        if getattr(self, "_slurm_job", None) is None:
            self._slurm_job = slurm_queries.lookup(self.slurm_job_id())
        return self._slurm_job

    def state(self):
        """The status's state, corrected by the facts: a dead supervisor without an exit record is LOST; a
        Slurm job requeued after its supervisor stopped (its time limit) is RESTARTING until it runs again,
        and STARTING once its shell removed the exit record, until its supervisor writes (its status still
        says how the last job ended), as is a job `inv resume` submitted, while it is queued."""
        exit_record = self.exit_record
        if exit_record:
            if exit_record["state"] == STOPPED and self.slurm_job_id() and self.supervisor_alive():
                return RESTARTING
            return exit_record["state"]
        state = self.status.get("state", STARTING)
        if state in ACTIVE_STATES and not self.supervisor_alive():
            return LOST
        if state in ACTIVE_STATES and self.supervisor_unanswering():
            return UNRESPONSIVE
        if state in FINAL_STATES and self.slurm_job_id() and self.supervisor_alive():
            return STARTING
        return state

    def is_active(self):
        return self.state() in ACTIVE_STATES

    def summary(self):
        """What `status` shows: the status file with the corrected state, the heartbeat and the exit record."""
        status = dict(self.status)
        record = self.record
        status.update(run_id=self.run_id, kind=run_kind(record), path=self.path, state=self.state(), heartbeat=self.heartbeat,
                      exit=self.exit_record, created_at=record.get("created_at"), out=record.get("out"),
                      driver_args=record.get("driver_args"), options=record.get("options"))
        if self.slurm_job_id():
            status["slurm"] = dict(record["slurm"], job=self.slurm_job())
        if status["state"] == UNRESPONSIVE:
            status["supervisor_unanswering"] = self.supervisor_unanswering()
        # How long since the last sample, on this host's clock, while the run is active.
        status["pace"] = pace_now(status.get("pace"), time.time()) if status["state"] in ACTIVE_STATES else None
        return status


def all_runs(workdir):
    """Every run under the workdir, oldest first (run ids start with a UTC timestamp)."""
    root = runs_root(workdir)
    try:
        names = sorted(name for name in os.listdir(root) if os.path.isfile(os.path.join(root, name, "run.json")))
    except FileNotFoundError:
        return []
    return [RunDir(os.path.join(root, name)) for name in names]


# -- the runs a call names ----------------------------------------------------------------------

def workdir_of(args):
    """The call's workdir: every `runs.*` command takes one."""
    workdir = args.get("workdir")
    if not workdir:
        raise RemoteFailure("bad-argument", "runs: no workdir given")
    return workdir


def group_id(run):
    """The id of the sharded run or the multi-node job the run is a part of, or None."""
    record = run.record
    return (record.get("shard") or {}).get("sharded_run_id") or (record.get("nodes") or {}).get("job_id")


def find_run(workdir, run_id, *, prefer_active=False):
    """The run a call names: a run id, a sharded-run id (that host's run of the sharded run) or a multi-node
    job's id (this node's run of the job); None: the newest run, or the newest active one."""
    runs = all_runs(workdir)
    if run_id:
        for run in runs:
            if run.run_id == run_id:
                return run
        # A fleet-run or multi-node job id: this host's run of it (the newest, should there be several).
        for run in reversed(runs):
            if group_id(run) == run_id:
                return run
        known = ", ".join(r.run_id for r in runs[-5:]) or "none"
        raise RemoteFailure("unknown-run", "no run %r under %s (newest: %s)" % (run_id, runs_root(workdir), known))
    if not runs:
        raise RemoteFailure("unknown-run", "no runs under %s yet" % runs_root(workdir))
    if prefer_active:
        active = [run for run in runs if run.is_active()]
        if active:
            return active[-1]
    return runs[-1]


def writers_of(workdir, output_dir, *, excluding=None):
    """Active runs writing `output_dir`."""
    target = os.path.realpath(os.path.expanduser(output_dir))
    return [run for run in all_runs(workdir)
            if run.run_id != excluding and run.is_active()
            and os.path.realpath(run.record.get("out") or "") == target]


# -- a launch's run made --------------------------------------------------------------------------

def lock(workdir):
    """Serialise launches and resumes on this host: the output-directory check and the start are one step."""
    root = runs_root(workdir)
    # The workdir is the user's (hosts.yaml names it; made 0700 when specrig makes it); runs/ is
    # specrig's: its user's alone, even where an older specrig made it 0755.
    os.makedirs(root, mode=PRIVATE_DIR, exist_ok=True)
    os.chmod(root, PRIVATE_DIR)
    handle = open(os.path.join(root, ".lock"), "w")
    os.fchmod(handle.fileno(), PRIVATE_FILE)
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


@contextlib.contextmanager
def claiming(workdir, output_dir):
    """The launches' lock held while a new run writing `output_dir` is made and started, no active run
    writing it (RemoteFailure output-busy)."""
    with lock(workdir):
        busy = writers_of(workdir, output_dir)
        if busy:
            raise RemoteFailure("output-busy", "run %s is already writing %s" % (busy[0].run_id, output_dir),
                                run=busy[0].run_id)
        yield


def create(run, record, code):
    """A new run's directory made, its user's alone, with what its supervisor reads: code/ (copy_code from
    `code`), driver-args.json (the record's driver_args) and run.json (`record`), last: a directory is
    a run (all_runs) once it is whole."""
    os.makedirs(run.path, mode=PRIVATE_DIR)
    copy_code(run, code)
    write_json(run.file("driver-args.json"), record["driver_args"])
    write_json(run.file("run.json"), record)


def copy_code(run, code):
    """A fresh copy of the bundle's remote/ (`code`) as the run's code/, which its supervisor runs: bundles
    may be replaced while the run goes on, and a resume picks up fixes of the driver."""
    copied = run.file("code")
    shutil.rmtree(copied, ignore_errors=True)
    shutil.copytree(code, copied, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    make_private(copied)  # copytree keeps the bundle's modes: 0644 in a bundle of older specrig
