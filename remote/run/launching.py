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

Runs live in <workdir>/runs/<run-id>/ (see rundir.py). The supervisor is started detached, or on a
Slurm login node submitted as a job's program (run/supervisor_start.py).
"""
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Optional

from base import atomic, hfcache, rundir
from base.contract import ACTIVE_STATES, SUCCEEDED, SUPERVISOR_DEFAULTS, UNRESPONSIVE
from base.failure import RemoteFailure
from run import budget, processes, supervisor_start
from run.server import plan

#: The bundle's remote/ (this file is remote/run/launching.py): what a run copies into its code/.
REMOTE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Driver arguments that are paths on the host (`~` is expanded here, where it means the host user's home);
#: the model is a path or a Hugging Face repo id (hfcache.resolve).
PATH_ARGS = ("dataset", "output_dir")


@dataclass(frozen=True)
class LaunchRequest:
    """A `runs.launch` call, checked and made this host's before anything is written: the run it starts
    (its directory not made yet), what the launch's stages read, and the run.json they write."""

    workdir: str
    #: The new run, its id chosen: its directory is made once the launch holds the lock (rundir.create).
    run: rundir.RunDir
    #: The driver's arguments, its paths absolute here, its model a directory (host_paths) and its heartbeat
    #: the run's: driver-args.json.
    driver_args: dict
    #: Another program in the driver's place (same argv and heartbeat contract), absolute: smoke and
    #: process-mechanics checks. None: the bundled extract_driver.py.
    driver_program: Optional[str]
    #: The python of the vLLM server (server mode), when not this call's.
    server_python: Optional[str]
    #: One node of a multi-node job (base/nodes.py record: job_id, role, node_rank, ...); else None.
    nodes: Optional[dict]
    #: run.json of the launch but for what its stages fill in: the server-mode plan ("server": None:
    #: in-process, or another driver program) and when it was written ("created_at").
    record: dict

    @property
    def out(self):
        return self.driver_args["output_dir"]

    @classmethod
    def from_call(cls, args):
        """The request of a call's `args`; RemoteFailure bad-argument for what no launch could take.
        The job's variables go into this call's environment first: the model's snapshot is looked up
        with them (HF_HOME, a token)."""
        env_keys = job_environment(args.get("env"))
        driver_args = host_paths(args.get("driver_args"))
        workdir = rundir.workdir_of(args)
        run = rundir.RunDir(os.path.join(rundir.runs_root(workdir), rundir.new_run_id()))
        driver_args["heartbeat"] = run.file("heartbeat.json")
        if not driver_args.get("output_dir"):
            raise RemoteFailure("bad-argument", "no output directory given (driver_args.output_dir)")
        options = supervisor_options(args.get("options"))
        program = args.get("driver_program")
        driver_program = os.path.abspath(os.path.expanduser(program)) if program else None
        slurm = args.get("slurm")
        record = {
            "run_id": run.run_id, "created_at": None, "host": args.get("host"),
            "python": sys.executable, "workdir": workdir, "out": driver_args["output_dir"],
            "driver_args": driver_args, "options": options, "env_keys": env_keys,
            "shard": args.get("shard"), "nodes": args.get("nodes"), "driver_program": driver_program,
            "server": None, "server_python": args.get("server_python"),
            # The Slurm job's id is filled in once it is submitted; a resume submits another (job_ids).
            "slurm": {"settings": slurm, "job_id": None, "job_ids": [], "array": args.get("array")}
            if slurm else None}
        return cls(workdir=workdir, run=run, driver_args=driver_args, driver_program=driver_program,
                   server_python=args.get("server_python"), nodes=args.get("nodes"), record=record)


def supervisor_options(given):
    """The supervisor's options: SUPERVISOR_DEFAULTS with the call's `given` ones; bad-argument for an unknown one."""
    unknown = sorted(set(given or {}) - set(SUPERVISOR_DEFAULTS))
    if unknown:
        raise RemoteFailure("bad-argument", "unknown supervisor option(s) %r; known: %s"
                            % (unknown, ", ".join(SUPERVISOR_DEFAULTS)))
    return dict(SUPERVISOR_DEFAULTS, **(given or {}))


def whole_number(args, name, *, minimum, default=None):
    """The call's whole-number argument `name` (`default` when absent, None included), at least `minimum`;
    bad-argument naming the option and the value otherwise. For the launches of every run kind."""
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RemoteFailure("bad-argument", "--%s %r: give a whole number, at least %d"
                            % (name.replace("_", "-"), value, minimum))
    return value


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


# -- launch -------------------------------------------------------------------------------------

def launch(args):
    """A new run, in stages that each take what they need from the call's LaunchRequest: the request read
    (checked, made this host's); under the launches' lock, the output claimed (rundir.claiming), the
    server-mode plan made, the run's directory made and its files written (rundir.create), its supervisor
    started (or its Slurm job submitted)."""
    request = LaunchRequest.from_call(args)
    run = request.run
    with rundir.claiming(request.workdir, request.out):
        server = None if request.driver_program else plan.of_run(
            run.path, run.run_id, request.driver_args, client_python=sys.executable,
            server_python=request.server_python, nodes=request.nodes)
        pid = create_and_start(run, dict(request.record, created_at=rundir.now_iso(), server=server))
    # The flags the server gets because this vLLM refuses a default setting with the connector (plan.py),
    # the stored layer ids beside the ones speculators' training takes by default, and the storage type.
    return {"run_id": run.run_id, "path": run.path, "supervisor_pid": pid, "slurm": run.record.get("slurm"),
            "startup_flags": server["startup_flags"] if server else [],
            "layers": {"ids": server["layer_ids"], "training_default": server["training_layer_ids"]} if server else None,
            "storage": {"type": server["storage"], "connector": server["connector"]} if server else None}


def launch_kind(args, *, kind, out, plan):
    """A new run of another kind than an extraction (base/contract.py RUN_KINDS: a training, an acceptance
    measurement), through the same stages as launch: `out` is the directory it writes, claimed as an
    extraction's output is (no two active runs write one); `plan(run)` its part of run.json (run.json[kind]),
    made once the run's id and directory are known, under the lock. The call's `env`, `options`, `host` and
    `slurm` are an extraction's."""
    workdir = rundir.workdir_of(args)
    env_keys = job_environment(args.get("env"))
    options = supervisor_options(args.get("options"))
    run = rundir.RunDir(os.path.join(rundir.runs_root(workdir), rundir.new_run_id()))
    slurm = args.get("slurm")
    with rundir.claiming(workdir, out):
        record = {
            "run_id": run.run_id, "kind": kind, kind: plan(run), "created_at": rundir.now_iso(),
            "host": args.get("host"), "python": sys.executable, "workdir": workdir, "out": out,
            "driver_args": {"output_dir": out}, "options": options, "env_keys": env_keys, "shard": None,
            "nodes": None, "driver_program": None, "server": None, "server_python": args.get("server_python"),
            "slurm": {"settings": slurm, "job_id": None, "job_ids": [], "array": None} if slurm else None}
        pid = create_and_start(run, record)
    return {"run_id": run.run_id, "path": run.path, "supervisor_pid": pid, "slurm": run.record.get("slurm"),
            "kind": kind, kind: run.record[kind]}


def create_and_start(run, record):
    """The run's directory made with its `record` (rundir.create) and its supervisor started (or its Slurm job
    submitted): its pid. A Slurm job refused leaves no run behind, since nothing was launched."""
    rundir.create(run, record, REMOTE_ROOT)
    try:
        return supervisor_start.start(run)
    except RemoteFailure:
        if record.get("slurm"):
            shutil.rmtree(run.path, ignore_errors=True)
        raise


# -- resume -------------------------------------------------------------------------------------

def resume(args):
    workdir = rundir.workdir_of(args)
    with rundir.lock(workdir):
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
            record["server"] = plan.of_run(run.path, run.run_id, record["driver_args"], client_python=sys.executable,
                                           server_python=record.get("server_python"), nodes=record.get("nodes"))
        atomic.write_json(run.file("run.json"), record)
        for name in ("exit.json", "stop.request"):
            try:
                os.unlink(run.file(name))
            except FileNotFoundError:
                pass
        rundir.copy_code(run, REMOTE_ROOT)
        pid = supervisor_start.start(run)
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
