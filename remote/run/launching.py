"""The `runs.launch` and `runs.resume` remote commands: a supervised run started, or started again
(stdlib only).

    runs.launch   {"workdir", "host", "driver_args": {...}, "env": {...}, "options": {...},
                   "driver_program": path|null, "server_python": path|null, "shard": {...}|null,
                   "nodes": {...}|null, "slurm": {...}|null, "array": {...}|null}
                                                  speculators >= 0.8 on this python: a server-mode
                                                  run (run/server/plan.py); nodes: this node's part
                                                  of a multi-node job (base/nodes.py), server
                                                  mode whatever this python holds; slurm:
                                                  hosts.yaml's `slurm:` settings of a login node:
                                                  the supervisor runs as one Slurm job
                                                  (slurm/submission.py) instead of detached here;
                                                  array: {task, tasks}, a task of a job array, and
                                                  nodes with slurm: submitted together later
                                                  (runs.submit-array, runs.submit-nodes)
    runs.resume   {"workdir", "run": id|null, "whole_sharded_run": bool, "slurm": {...}|null}
                                                  null: the newest run; whole_sharded_run: a run that succeeded
                                                  or is active is left as it is

A launch's call is read once into a LaunchRequest: its arguments checked and made this host's (paths,
the model's snapshot, the supervisor's options) before anything is written, then recorded in run.json.

A launch's `env` (hosts.yaml `env:`; a node's VLLM_HOST_IP) goes into this call's environment, which
the supervisor and its jobs inherit, as the call's own `env` does; run.json keeps the names alone
(`env_keys`): a token in `env:` is never written on the host. A resume's environment is its call's
(hosts.yaml `env:` now), as a launch's.

Runs live in <workdir>/runs/<run-id>/ (see rundir.py). The supervisor is started in a new session
with stdio on files and stdin from /dev/null, so closing the SSH connection that launched it does not
reach it. On a Slurm login node it is a job's program instead (slurm/submission.py): submitted here,
started by Slurm on a node of the allocation.
"""
import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

from base import atomic, contract, hfcache, pkgmeta, rundir
from base.contract import ACTIVE_STATES, FAILED, SUCCEEDED, SUPERVISOR_DEFAULTS, UNRESPONSIVE
from base.failure import RemoteFailure
from run import budget, processes
from run.server import plan
from slurm import submission

#: The bundle's remote/ (this file is remote/run/launching.py): what a run copies into its code/.
REMOTE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Driver arguments that are paths on the host (`~` is expanded here, where it means the host user's home);
#: the model is a path or a Hugging Face repo id (hfcache.resolve).
PATH_ARGS = ("dataset", "output_dir")
SUPERVISOR_START_S = 15


@dataclass(frozen=True)
class LaunchRequest:
    """A `runs.launch` call, checked and made this host's before anything is written: what run.json
    records of the launch (run_record), and what the launch reads to start it."""

    workdir: str
    #: The inventory's name of this host.
    host: Optional[str]
    #: The driver's arguments, its paths absolute here and its model a directory (host_paths).
    driver_args: dict
    #: The supervisor's options: SUPERVISOR_DEFAULTS, the call's over them.
    options: dict
    #: The names of the job's variables (hosts.yaml `env:`), already in this call's environment: their
    #: values are never stored.
    env_keys: list
    #: Another program in the driver's place (same argv and heartbeat contract), absolute: smoke and
    #: process-mechanics checks. None: the bundled extract_driver.py.
    driver_program: Optional[str]
    #: The python of the vLLM server (server mode), when not this call's.
    server_python: Optional[str]
    #: One shard of a sharded run: {sharded_run_id, hosts, shard_index, shard_count}; else None.
    shard: Optional[dict]
    #: One node of a multi-node job (base/nodes.py record: job_id, role, node_rank, ...); else None.
    nodes: Optional[dict]
    #: hosts.yaml's `slurm:` settings of a login node: the run is a Slurm job; else None.
    slurm: Optional[dict]
    #: {task, tasks}: this run is task `task` of a sharded run's job array (runs.submit-array); else None.
    array: Optional[dict]

    @classmethod
    def from_call(cls, args):
        """The request of a call's `args`; RemoteFailure bad-argument for what no launch could take.
        The job's variables go into this call's environment first: the model's snapshot is looked up
        with them (HF_HOME, a token)."""
        workdir = rundir.workdir_of(args)
        env_keys = job_environment(args.get("env"))
        driver_args = host_paths(args.get("driver_args"))
        if not driver_args.get("output_dir"):
            raise RemoteFailure("bad-argument", "no output directory given (driver_args.output_dir)")
        unknown = sorted(set(args.get("options") or {}) - set(SUPERVISOR_DEFAULTS))
        if unknown:
            raise RemoteFailure("bad-argument", "unknown supervisor option(s) %r; known: %s"
                                % (unknown, ", ".join(SUPERVISOR_DEFAULTS)))
        options = dict(SUPERVISOR_DEFAULTS)
        options.update(args.get("options") or {})
        program = args.get("driver_program")
        return cls(workdir=workdir, host=args.get("host"), driver_args=driver_args, options=options,
                   env_keys=env_keys, driver_program=os.path.abspath(os.path.expanduser(program)) if program else None,
                   server_python=args.get("server_python"), shard=args.get("shard"), nodes=args.get("nodes"),
                   slurm=args.get("slurm"), array=args.get("array"))

    def run_record(self, run, driver_args, server):
        """run.json of `run`, launched with `driver_args` (the request's, with the run's heartbeat) and the
        server-mode plan `server` (None: in-process, or another driver program)."""
        return {
            "run_id": run.run_id, "created_at": rundir.now_iso(), "host": self.host,
            "python": sys.executable, "workdir": self.workdir, "out": driver_args["output_dir"],
            "driver_args": driver_args, "options": self.options, "env_keys": self.env_keys,
            "shard": self.shard, "nodes": self.nodes, "driver_program": self.driver_program,
            "server": server, "server_python": self.server_python,
            # The Slurm job's id is filled in once it is submitted; a resume submits another (job_ids).
            "slurm": {"settings": self.slurm, "job_id": None, "job_ids": [], "array": self.array}
            if self.slurm else None}


def host_paths(driver_args):
    """A copy of the driver's arguments with its paths absolute on this host (PATH_ARGS) and its model a
    directory: a Hugging Face repo id becomes its snapshot in this host's cache, the id kept as model_id
    (the run's record holds both). The environment is the call's: hosts.yaml `env:` over the login's."""
    driver_args = dict(driver_args or {})
    for key in PATH_ARGS:
        if driver_args.get(key):
            driver_args[key] = os.path.abspath(os.path.expanduser(driver_args[key]))
    if driver_args.get("model"):
        model = hfcache.resolve(driver_args["model"], os.environ)
        driver_args["model"] = model.path
        if model.repo_id:
            driver_args["model_id"] = model.repo_id
    return driver_args


def job_environment(env):
    """The job's variables (a launch's `env`) into this call's environment, which the supervisor it
    starts inherits and hands on to its jobs; their names, for run.json. The values are written nowhere."""
    env = {str(key): str(value) for key, value in (env or {}).items()}
    os.environ.update(env)
    return sorted(env)


def lock(workdir):
    """Serialise launches and resumes on this host: the output-directory check and the start are one step."""
    root = rundir.runs_root(workdir)
    # The workdir is the user's (hosts.yaml names it; made 0700 when specrig makes it); runs/ is
    # specrig's: its user's alone, even where an older specrig made it 0755.
    os.makedirs(root, mode=rundir.PRIVATE_DIR, exist_ok=True)
    os.chmod(root, rundir.PRIVATE_DIR)
    handle = open(os.path.join(root, ".lock"), "w")
    os.fchmod(handle.fileno(), rundir.PRIVATE_FILE)
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


# -- launch -------------------------------------------------------------------------------------

def launch(args):
    request = LaunchRequest.from_call(args)
    out = request.driver_args["output_dir"]
    with lock(request.workdir):
        busy = rundir.writers_of(request.workdir, out)
        if busy:
            raise RemoteFailure("output-busy", "run %s is already writing %s" % (busy[0].run_id, out),
                                run=busy[0].run_id)
        run = rundir.RunDir(os.path.join(rundir.runs_root(request.workdir), rundir.new_run_id()))
        os.makedirs(run.path, mode=rundir.PRIVATE_DIR)
        driver_args = dict(request.driver_args, heartbeat=run.file("heartbeat.json"))
        atomic.write_json(run.file("driver-args.json"), driver_args)
        server = None if request.driver_program else server_plan(run, driver_args, request.server_python,
                                                                 request.nodes)
        atomic.write_json(run.file("run.json"), request.run_record(run, driver_args, server))
        try:
            pid = start_supervisor(run)
        except RemoteFailure:
            if run.record.get("slurm"):
                shutil.rmtree(run.path, ignore_errors=True)  # Slurm refused the job: nothing was launched
            raise
    # The flags the server gets because this vLLM refuses a default setting with the connector (plan.py),
    # the stored layer ids beside the ones speculators' training takes by default, and the storage type.
    return {"run_id": run.run_id, "path": run.path, "supervisor_pid": pid, "slurm": run.record.get("slurm"),
            "startup_flags": server["startup_flags"] if server else [],
            "layers": {"ids": server["layer_ids"], "training_default": server["training_layer_ids"]} if server else None,
            "storage": {"type": server["storage"], "connector": server["connector"]} if server else None}


# -- resume -------------------------------------------------------------------------------------

def resume(args):
    workdir = rundir.workdir_of(args)
    with lock(workdir):
        run = rundir.find_run(workdir, args.get("run"))
        stored = scrub_env(run)  # before anything may refuse: a finished or active run is scrubbed too
        state = run.state()
        if args.get("whole_sharded_run") and (state in ACTIVE_STATES or state == SUCCEEDED):
            # The whole sharded run resumed: a host whose shard is done or still going is left alone.
            return {"run_id": run.run_id, "path": run.path, "supervisor_pid": None, "resumed_from": state,
                    "skipped": True}
        if state == UNRESPONSIVE:
            raise RemoteFailure("run-active", "run %s is unresponsive: its supervisor (pid %s) is %s; `inv stop --run %s` "
                                "ends it and its processes, then `inv resume`" % (
                                    run.run_id, run.status.get("supervisor_pid"), run.supervisor_unanswering(),
                                    run.run_id))
        if state in ACTIVE_STATES:
            raise RemoteFailure("run-active", "run %s is %s: nothing to resume" % (run.run_id, state))
        if state == SUCCEEDED:
            raise RemoteFailure("run-finished", "run %s already succeeded" % run.run_id)
        busy = rundir.writers_of(workdir, run.record["out"], excluding=run.run_id)
        if busy:
            raise RemoteFailure("output-busy", "run %s is writing %s now" % (busy[0].run_id, run.record["out"]))
        if run.record.get("server"):
            # A resume into a disk that cannot hold the share's missing files would fail as the run did.
            found = budget.share_room(run.record["server"], fix="then resume again; or start a new run with an "
                                                                 "--out that has room (the files here are kept)")
            if found and not found["ok"]:
                raise RemoteFailure("no-room", "run %s: %s" % (run.run_id, found["detail"]), advice=found["advice"],
                                    need=found["need"], free=found["free"], where=found["where"])
        # A lost run's driver (or server and client) may outlive its supervisor; two must not share the output.
        # (A Slurm job's processes ended with the job; their pids are another machine's.)
        if not run.slurm_job_id():
            processes.end(processes.jobs_of(run), run.record["options"]["grace_s"])
        # The run's files its user's alone, where an older specrig left them readable to everyone.
        rundir.make_private(run.path)
        # The driver runs on this call's python: the environment may have been fixed or moved since.
        record = run.record
        record.update(python=sys.executable, resumed_at=record.get("resumed_at", []) + [rundir.now_iso()])
        if record.get("slurm") and args.get("slurm"):
            # hosts.yaml's `slurm:` now: a run that failed for a time limit too short (slurm/time_limit.py)
            # resumes with a longer one (a task of a job array too: its sbatch line carries them, jobs.task_argv).
            record["slurm"]["settings"] = args["slurm"]
        resumed_environment(record, stored)
        if record.get("server"):
            record["server"] = server_plan(run, record["driver_args"], record.get("server_python"),
                                           record.get("nodes"))
        atomic.write_json(run.file("run.json"), record)
        for name in ("exit.json", "stop.request"):
            try:
                os.unlink(run.file(name))
            except FileNotFoundError:
                pass
        pid = start_supervisor(run)
    return {"run_id": run.run_id, "path": run.path, "supervisor_pid": pid, "resumed_from": state,
            "slurm": run.record.get("slurm")}


def scrub_env(run):
    """The values an older specrig stored in run.json (`env`), dropped from it (their names kept in
    `env_keys`) and returned: {} for a run of this specrig."""
    record = run.record
    if "env" not in record:
        return {}
    stored = {str(key): str(value) for key, value in (record.pop("env") or {}).items()}
    record["env_keys"] = sorted(set(record.get("env_keys") or ()) | set(stored))
    atomic.write_json(run.file("run.json"), record)
    return stored


def resumed_environment(record, stored):
    """A resume's environment is its call's (hosts.yaml `env:` now), as a launch's. The values an older
    specrig stored (`stored`, scrub_env) fill what the call has no value for, as that specrig's
    supervisor gave them. A node of a multi-node job gets its address for vLLM again (VLLM_HOST_IP),
    as at its launch."""
    for key, value in stored.items():
        os.environ.setdefault(key, value)
    nodes = record.get("nodes") or {}
    if nodes.get("addresses"):
        os.environ["VLLM_HOST_IP"] = str(nodes["addresses"][nodes["node_rank"]])


# -- what both start with -----------------------------------------------------------------------

def server_plan(run, driver_args, server_python, nodes=None):
    """The server-mode plan when this python's speculators takes the server path (>= 0.8), or the run is a
    node of a multi-node job (a worker runs vLLM alone: its python needs no speculators); else None.
    A plan that cannot be made removes the run directory: nothing was launched."""
    speculators = pkgmeta.versions(("speculators",))["speculators"]
    if not nodes and contract.extraction_mode(speculators) != contract.SERVER:
        return None
    try:
        return plan.make(run.path, run.run_id, driver_args, client_python=sys.executable,
                         server_python=server_python, nodes=nodes)
    except plan.PlanError as exc:
        if not os.path.exists(run.file("run.json")):
            shutil.rmtree(run.path, ignore_errors=True)
        raise RemoteFailure("bad-argument", str(exc)) from None


def start_supervisor(run):
    """Copy the code the run needs into the run directory, then start the supervisor detached: its pid.
    A run on a Slurm cluster is submitted as a job instead (its pid unknown here: None)."""
    code = run.file("code")
    # A fresh copy of this bundle's remote/: bundles may be replaced while the run goes on,
    # and a resume picks up fixes of the driver.
    shutil.rmtree(code, ignore_errors=True)
    shutil.copytree(REMOTE_ROOT, code, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    rundir.make_private(code)  # copytree keeps the bundle's modes: 0644 in a bundle of older specrig
    if run.record.get("slurm"):
        submission.submit_run(run)
        return None
    with open(run.file("supervisor.log"), "ab") as log:
        proc = subprocess.Popen([sys.executable, os.path.join(code, "run", "supervisor.py"), run.path],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=run.path, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + SUPERVISOR_START_S
    while time.monotonic() < deadline:
        status_now = run.status
        if status_now.get("supervisor_pid") == proc.pid:
            if status_now.get("state") == FAILED:
                # Refused before its first attempt (supervisor_loop.py `refused`: the output cannot be
                # written, or has no room): the run's record says why, and so does this call, in one line.
                failure = status_now["last_failure"]
                raise RemoteFailure("run-refused", "run %s: %s; %s" % (run.run_id, failure["explain"],
                                                                      failure["advice"]),
                                    run=run.run_id, failure=failure)
            return proc.pid
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with open(run.file("supervisor.log"), encoding="utf-8", errors="replace") as handle:
        output = handle.read()[-4000:]
    raise RemoteFailure("supervisor-failed", "the supervisor of run %s did not start (exit %s): %s"
                        % (run.run_id, proc.poll(), output.strip().splitlines()[-1:] or "no output"),
                        traceback=output)
