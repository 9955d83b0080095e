"""The `runs.*` remote commands: launch, status, logs, stop and resume supervised runs (stdlib only).

    runs.launch   {"workdir", "host", "driver_args": {...}, "env": {...}, "options": {...},
                   "driver_program": path|null, "server_python": path|null, "nodes": {...}|null,
                   "slurm": {...}|null}
                                                  slurm: hosts.yaml's `slurm:` settings of a login
                                                  node: the supervisor runs as one Slurm job
                                                  (slurm/jobs.py) instead of detached here;
                                                  "array": {task, tasks}: a task of a job array,
                                                  submitted by runs.submit-array
    runs.submit-array {"workdir", "fleet_run_id"} the array's task runs submitted as one job array
                                                  speculators >= 0.8 on this python: a server-mode
                                                  run (run/server/plan.py); nodes: this node's part
                                                  of a multi-node job (run/server/nodes.py), server
                                                  mode whatever this python holds; with slurm:
                                                  submitted by runs.submit-nodes
    runs.submit-nodes {"workdir", "job_id"}       a multi-node job's runs submitted as one job of its nodes
    runs.status   {"workdir", "run": id|null}     null: every run
    runs.logs     {"workdir", "run": id|null, "offset": int|null, "lines": int,
                   "log": "driver"|"server"}      driver.log: the driver, or speculators' CLI steps;
                                                  server.log: the vLLM server
    runs.stop     {"workdir", "run": id|null}     null: the newest active run
    runs.resume   {"workdir", "run": id|null, "fleet": bool}   null: the newest run; fleet: a run
                                                  that succeeded or is active is left as it is
    runs.verify-output {"workdir", "run": id|null}   the run's output: sample indices, each loaded

A launch's `env` (hosts.yaml `env:`; a node's VLLM_HOST_IP) goes into this call's environment, which
the supervisor and its jobs inherit, as the call's own `env` does; run.json keeps the names alone
(`env_keys`): a token in `env:` is never written on the host. A resume's environment is its call's
(hosts.yaml `env:` now), as a launch's.

`run` is a run id, a fleet-run id (launch's `fleet.fleet_run_id`: that host's run of the fleet run) or
a multi-node job's id (`nodes.job_id`: this node's run of the job).

Runs live in <workdir>/runs/<run-id>/ (see rundir.py). The supervisor is
started in a new session with stdio on files and stdin from /dev/null, so
closing the SSH connection that launched it does not reach it. On a Slurm login node it is a job's
program instead (slurm/jobs.py): submitted here, started by Slurm on a node of the allocation.
"""
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import atomic
import contract
import hfcache
import pkgmeta
import procs
import telemetry
from contract import ACTIVE_STATES, FAILED, GPU_RELEASE_S, STOPPED, SUCCEEDED, SUPERVISOR_DEFAULTS
from rpc import RemoteFailure
from run import budget, rundir
from run.server import client, outputs, plan
from slurm import jobs as slurm_jobs

#: The bundle's remote/ (this file is remote/run/runs.py): what a run copies into its code/.
REMOTE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Driver arguments that are paths on the host (`~` is expanded here, where it means the host user's home);
#: the model is a path or a Hugging Face repo id (hfcache.resolve).
PATH_ARGS = ("dataset", "output_dir")
SUPERVISOR_START_S = 15
LOG_LINES = 50
#: The logs a run keeps, by the name `logs` takes.
LOGS = {"driver": "driver.log", "server": "server.log"}


def workdir_of(args):
    """The call's workdir: every `runs.*` command takes one."""
    workdir = args.get("workdir")
    if not workdir:
        raise RemoteFailure("bad-argument", "runs: no workdir given")
    return workdir


# -- finding runs -------------------------------------------------------------------------------

def group_id(run):
    """The id of the fleet run or the multi-node job the run is a part of, or None."""
    record = run.record
    return (record.get("fleet") or {}).get("fleet_run_id") or (record.get("nodes") or {}).get("job_id")


def find_run(workdir, run_id, *, prefer_active=False):
    runs = rundir.all_runs(workdir)
    if run_id:
        for run in runs:
            if run.run_id == run_id:
                return run
        # A fleet-run or multi-node job id: this host's run of it (the newest, should there be several).
        for run in reversed(runs):
            if group_id(run) == run_id:
                return run
        known = ", ".join(r.run_id for r in runs[-5:]) or "none"
        raise RemoteFailure("unknown-run", "no run %r under %s (newest: %s)" % (run_id, rundir.runs_root(workdir),
                                                                               known))
    if not runs:
        raise RemoteFailure("unknown-run", "no runs under %s yet" % rundir.runs_root(workdir))
    if prefer_active:
        active = [run for run in runs if run.is_active()]
        if active:
            return active[-1]
    return runs[-1]


def _lock(workdir):
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


def writers_of(workdir, output_dir, *, excluding=None):
    """Active runs writing `output_dir`."""
    target = os.path.realpath(os.path.expanduser(output_dir))
    return [run for run in rundir.all_runs(workdir)
            if run.run_id != excluding and run.is_active()
            and os.path.realpath(run.record.get("out") or "") == target]


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


# -- actions ------------------------------------------------------------------------------------

def launch(args):
    workdir = workdir_of(args)
    env_keys = job_environment(args.get("env"))
    driver_args = host_paths(args.get("driver_args"))
    if not driver_args.get("output_dir"):
        raise RemoteFailure("bad-argument", "no output directory given (driver_args.output_dir)")
    options = dict(SUPERVISOR_DEFAULTS)
    unknown = sorted(set(args.get("options") or {}) - set(SUPERVISOR_DEFAULTS))
    if unknown:
        raise RemoteFailure("bad-argument", "unknown supervisor option(s) %r; known: %s"
                            % (unknown, ", ".join(SUPERVISOR_DEFAULTS)))
    options.update(args.get("options") or {})
    with _lock(workdir):
        busy = writers_of(workdir, driver_args["output_dir"])
        if busy:
            raise RemoteFailure("output-busy", "run %s is already writing %s" % (busy[0].run_id,
                                                                               driver_args["output_dir"]),
                                run=busy[0].run_id)
        run = rundir.RunDir(os.path.join(rundir.runs_root(workdir), rundir.new_run_id()))
        os.makedirs(run.path, mode=rundir.PRIVATE_DIR)
        driver_args["heartbeat"] = run.file("heartbeat.json")
        program = args.get("driver_program")
        atomic.write_json(run.file("driver-args.json"), driver_args)
        server_python = args.get("server_python")
        server = None if program else _server_plan(run, driver_args, server_python, args.get("nodes"))
        atomic.write_json(run.file("run.json"), {
            "run_id": run.run_id, "created_at": rundir.now_iso(), "host": args.get("host"),
            "python": sys.executable, "workdir": workdir, "out": driver_args["output_dir"],
            "driver_args": driver_args, "options": options,
            # The names of the job's variables (hosts.yaml `env:`): their values are never stored.
            "env_keys": env_keys,
            # One shard of a fleet run: {fleet_run_id, hosts, shard_index, shard_count}; else None.
            "fleet": args.get("fleet"),
            # One node of a multi-node job (run/server/nodes.py record: job_id, role, node_rank, ...); else None.
            "nodes": args.get("nodes"),
            # Another program in the driver's place (same argv and heartbeat contract): smoke and
            # process-mechanics checks. None: the bundled extract_driver.py.
            "driver_program": os.path.abspath(os.path.expanduser(program)) if program else None,
            # Server mode (speculators >= 0.8): the plan of the server and the client steps; else None.
            "server": server, "server_python": server_python,
            # A run on a Slurm cluster: hosts.yaml's `slurm:` settings, then its job's id; else None.
            # "array": {task, tasks}: this run is task `task` of a sharded run's job array (submit_array).
            "slurm": {"settings": args["slurm"], "job_id": None, "job_ids": [], "array": args.get("array")}
            if args.get("slurm") else None})
        try:
            pid = _start_supervisor(run)
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


def resume(args):
    workdir = workdir_of(args)
    with _lock(workdir):
        run = find_run(workdir, args.get("run"))
        stored = scrub_env(run)  # before anything may refuse: a finished or active run is scrubbed too
        state = run.state()
        if args.get("fleet") and (state in ACTIVE_STATES or state == SUCCEEDED):
            # The whole fleet run resumed: a host whose shard is done or still going is left alone.
            return {"run_id": run.run_id, "path": run.path, "supervisor_pid": None, "resumed_from": state,
                    "skipped": True}
        if state in ACTIVE_STATES:
            raise RemoteFailure("run-active", "run %s is %s: nothing to resume" % (run.run_id, state))
        if state == SUCCEEDED:
            raise RemoteFailure("run-finished", "run %s already succeeded" % run.run_id)
        busy = writers_of(workdir, run.record["out"], excluding=run.run_id)
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
            _terminate(_jobs(run), run.record["options"]["grace_s"])
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
            record["server"] = _server_plan(run, record["driver_args"], record.get("server_python"),
                                            record.get("nodes"))
        atomic.write_json(run.file("run.json"), record)
        for name in ("exit.json", "stop.request"):
            try:
                os.unlink(run.file(name))
            except FileNotFoundError:
                pass
        pid = _start_supervisor(run)
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


def _server_plan(run, driver_args, server_python, nodes=None):
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


def _start_supervisor(run):
    """Copy the code the run needs into the run directory, then start the supervisor detached: its pid.
    A run on a Slurm cluster is submitted as a job instead (its pid unknown here: None)."""
    code = run.file("code")
    # A fresh copy of this bundle's remote/: bundles may be replaced while the run goes on,
    # and a resume picks up fixes of the driver.
    shutil.rmtree(code, ignore_errors=True)
    shutil.copytree(REMOTE_ROOT, code, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    rundir.make_private(code)  # copytree keeps the bundle's modes: 0644 in a bundle of older specrig
    if run.record.get("slurm"):
        _submit(run)
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
                # Refused before its first attempt (supervision.py `refused`: the output cannot be written,
                # or has no room): the run's record says why, and so does this call, in one line.
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


def _submit(run):
    """The run's supervisor as a Slurm job (slurm/jobs.py), its id recorded in run.json; RemoteFailure
    slurm-refused with sbatch's words when Slurm refuses it (nothing is queued). A task of a job array is
    submitted with its array (submit_array) at its launch, and alone, from the array's script, again."""
    record = run.record
    slurm = record["slurm"]
    if (slurm.get("array") or record.get("nodes")) and not slurm["job_id"]:
        return
    if record.get("nodes"):
        raise RemoteFailure("bad-argument", "run %s is node %d of multi-node job %s, one Slurm job: resuming it "
                            "alone is not built; start the job again with `inv extract --nodes`"
                            % (run.run_id, record["nodes"]["node_rank"], record["nodes"]["job_id"]))
    try:
        if slurm.get("array"):
            submitted = {"job_id": slurm_jobs.resubmit_task(slurm["script"], slurm["array"]["task"],
                                                            slurm["settings"])}
        else:
            submitted = slurm_jobs.submit(slurm["settings"], run_path=run.path, run_id=run.run_id,
                                          python=record["python"])
    except slurm_jobs.JobRefused as refused:
        raise RemoteFailure("slurm-refused", "run %s: %s; nothing was queued" % (run.run_id, refused)) from None
    _record_job(run, record, submitted)


def _record_job(run, record, submitted):
    """The run's (newest) job in run.json: {job_id, script...}, its id added to job_ids."""
    record["slurm"].update(submitted, job_ids=record["slurm"]["job_ids"] + [submitted["job_id"]],
                           submitted_at=rundir.now_iso())
    atomic.write_json(run.file("run.json"), record)


def submit_array(args):
    """`runs.submit-array` {"workdir", "fleet_run_id"}: the runs launched as the tasks of a sharded run's
    job array (launch's `array`), submitted as one array: its script and outputs in
    <workdir>/runs/<fleet_run_id>/. {job_id, script, runs: [run ids by task]}. Refused by sbatch: the
    task runs are removed, nothing was queued."""
    workdir = workdir_of(args)
    fleet_run_id = args.get("fleet_run_id")
    tasks = sorted((run for run in rundir.all_runs(workdir) if group_id(run) == fleet_run_id
                    and (run.record.get("slurm") or {}).get("array")),
                   key=lambda run: run.record["slurm"]["array"]["task"])
    if not tasks or [run.record["slurm"]["array"]["task"] for run in tasks] != list(range(len(tasks))):
        raise RemoteFailure("bad-argument", "no job array's runs of %r under %s" % (fleet_run_id, workdir))
    directory = os.path.join(rundir.runs_root(workdir), fleet_run_id)
    first = tasks[0].record
    return _submit_together(
        tasks, directory, "sharded run %s" % fleet_run_id, lambda job_id, task: "%s_%d" % (job_id, task),
        lambda: slurm_jobs.submit_array(first["slurm"]["settings"], directory=directory, sharded_run_id=fleet_run_id,
                                        run_paths=[run.path for run in tasks], python=first["python"]))


def submit_nodes(args):
    """`runs.submit-nodes` {"workdir", "job_id"}: the runs launched as the nodes of a multi-node job on a
    Slurm login node (launch's `nodes` and `slurm`), submitted as one job of as many nodes (slurm/jobs.py
    nodes_script): its script and output in <workdir>/runs/<job_id>/. {job_id (Slurm's), script, runs:
    [run ids by node rank]}. Refused by sbatch: the runs are removed, nothing was queued."""
    workdir = workdir_of(args)
    job_id = args.get("job_id")
    members = sorted((run for run in rundir.all_runs(workdir) if (run.record.get("nodes") or {}).get("job_id") == job_id
                      and run.record.get("slurm")), key=lambda run: run.record["nodes"]["node_rank"])
    ranks = [run.record["nodes"]["node_rank"] for run in members]
    if len(members) < 2 or ranks != list(range(members[0].record["nodes"]["nnodes"])):
        raise RemoteFailure("bad-argument", "no multi-node job's runs of %r under %s (ranks found: %s)"
                            % (job_id, workdir, ranks))
    directory = os.path.join(rundir.runs_root(workdir), job_id)
    first = members[0].record
    return _submit_together(
        members, directory, "multi-node job %s" % job_id, lambda slurm_job_id, rank: slurm_job_id,
        lambda: slurm_jobs.submit_nodes(first["slurm"]["settings"], directory=directory, job_id=job_id,
                                        run_paths=[run.path for run in members], python=first["python"]))


def _submit_together(runs, directory, what, job_of, submit):
    """`runs` submitted as one Slurm submission (`submit()`: its job id, its script in `directory`), each
    run's job recorded (job_of(job id, its index)): {job_id, script, runs}. Refused by sbatch: the runs and
    `directory` are removed, nothing was queued (RemoteFailure slurm-refused, naming `what`)."""
    try:
        job_id = submit()
    except slurm_jobs.JobRefused as refused:
        for run in runs:
            shutil.rmtree(run.path, ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)
        raise RemoteFailure("slurm-refused", "%s: %s; nothing was queued" % (what, refused)) from None
    script = os.path.join(directory, slurm_jobs.SCRIPT)
    for index, run in enumerate(runs):
        _record_job(run, run.record, {"job_id": job_of(job_id, index), "script": script})
    return {"job_id": job_id, "script": script, "runs": [run.run_id for run in runs]}


def place_node(run, *, hosts, addresses):
    """Node `run` of a multi-node job in a Slurm allocation, at its job's start (slurm/allocation.py): its
    part of the job made from the allocation's nodes (`hosts`, `addresses`, the head first), and its
    server's command made again with them, as resume() makes it."""
    record = run.record
    record["nodes"].update(hosts=list(hosts), addresses=list(addresses), master_addr=addresses[0])
    record["server"] = _server_plan(run, record["driver_args"], record.get("server_python"), record["nodes"])
    atomic.write_json(run.file("run.json"), record)


def status(args):
    workdir = workdir_of(args)
    if args.get("run"):
        run = find_run(workdir, args["run"])
        return {"runs": [_summary(run)], "log_tail": _tail(run.file("driver.log"), args.get("lines") or 10)}
    return {"runs": [_summary(run) for run in rundir.all_runs(workdir)]}


def _summary(run):
    return dict(run.summary(), fleet=run.record.get("fleet"), nodes=run.record.get("nodes"))


def logs(args):
    """The last `lines` lines, or (with `offset`) everything written since that byte offset."""
    workdir = workdir_of(args)
    run = find_run(workdir, args.get("run"))
    path = _log_path(run, args.get("log"))
    size = os.path.getsize(path) if os.path.exists(path) else 0
    offset = args.get("offset")
    if offset is None:
        text = _tail(path, args.get("lines") or LOG_LINES, exact=True)
    else:
        with open(path, "rb") as handle:
            handle.seek(min(offset, size))
            text = handle.read(4 * 1024 * 1024).decode(errors="replace")
            size = handle.tell()
    return {"run_id": run.run_id, "text": text, "offset": size, "state": run.state()}


def _log_path(run, name):
    if (name or "driver") not in LOGS:
        raise RemoteFailure("bad-argument", "unknown log %r; known: %s" % (name, ", ".join(LOGS)))
    return run.file(LOGS[name or "driver"])


def _tail(path, lines, exact=False):
    """The last `lines` lines, without the last line end. `exact` (`logs`, whose text `inv logs --raw`
    shows as it is): lines end at line feeds alone, and the text is the file's; else every line
    boundary of str.splitlines (a progress bar's carriage returns) ends one (status's log tail)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - 256 * 1024))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    if not exact:
        return "\n".join(text.splitlines()[-lines:])
    found = text.split("\n")
    if found[-1] == "":
        found.pop()
    return "\n".join(found[-lines:])


def _jobs(run):
    """The run's current jobs, following the processes its supervisor saw: the driver's, or the
    server's and the client step's (server mode)."""
    status_now = run.status
    jobs = [procs.Job(job["pgid"], seen=job.get("seen")) for job in (status_now.get("jobs") or {}).values()]
    if status_now.get("driver_pgid"):
        jobs.append(procs.Job(status_now["driver_pgid"], seen=status_now.get("job_seen")))
    return jobs


def _members(jobs):
    return [member for job in jobs for member in job.members()]


def _terminate(jobs, grace_s):
    """End every job that still has a process: {"pids", "killed", "left"} over them all, or None."""
    ended = [job.terminate(grace_s) for job in jobs if job.members()]
    if not ended:
        return None
    return {key: [item for result in ended for item in result[key]] for key in ("pids", "killed", "left")}


def stop(args):
    """Stop the run's supervisor and driver, then check what is left: processes, and GPU memory."""
    workdir = workdir_of(args)
    run = find_run(workdir, args.get("run"), prefer_active=True)
    state = run.state()
    if run.slurm_job_id():
        return _stop_job(run, state)
    grace = float(args.get("grace_s") or run.record.get("options", {}).get("grace_s", SUPERVISOR_DEFAULTS["grace_s"]))
    status_now = run.status
    jobs = _jobs(run)
    # Every pid the jobs had, and the GPU memory they held, before anything is killed.
    pids = {m["pid"] for m in _members(jobs)}
    before = telemetry.snapshot()
    with open(run.file("stop.request"), "w") as handle:
        handle.write(rundir.now_iso() + "\n")
    supervisor = status_now.get("supervisor_pid") if run.supervisor_alive() else None
    if supervisor:
        os.kill(supervisor, signal.SIGTERM)
        deadline = time.monotonic() + grace + 30
        while procs.alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.1)
    # No supervisor to do it (lost), or it did not finish: end the jobs from here.
    ended_by_us = _terminate(jobs, grace)
    if supervisor and procs.alive(supervisor):
        os.kill(supervisor, signal.SIGKILL)
    if not run.exit_record:
        atomic.write_json(run.file("exit.json"), {"state": STOPPED, "ended_at": rundir.now_iso(),
                                                  "stopped_by": "inv stop", "was": state})
    left = _members(jobs)
    gpu = telemetry.wait_released(before, pids | {m["pid"] for m in left}, GPU_RELEASE_S)
    return {"run_id": run.run_id, "was": state, "state": run.state(), "pids": sorted(pids),
            "supervisor_pid": supervisor, "ended_by_stop_command": ended_by_us, "left": left,
            "gpu_memory_held": gpu["held"], "gpu_memory": gpu["gpus"],
            "clean": not left and not gpu["held"] and not any(g["not_released"] for g in gpu["gpus"])}


def _stop_job(run, state):
    """Stop a run that is a Slurm job: scancel (Slurm sends SIGTERM to the supervisor and its jobs, which
    ends the attempt as `inv stop` over SSH does, then SIGKILL after KillWait), wait until the job has
    left the queue, then look for what is left of the run's processes: on the job's nodes where they
    are this machine (the lab), by the run's process groups, as a stop over SSH does; elsewhere the
    supervisor's own end of its jobs, on its node, is what there is (its last attempt's left_behind)."""
    job_id = run.slurm_job_id()
    before = run.slurm_job()
    # A multi-node job's runs (one a node) share its Slurm job: the scancel ends every one of them.
    runs = [run] + ([other for other in rundir.all_runs(run.record["workdir"])
                     if other.run_id != run.run_id and other.slurm_job_id() == job_id] if run.record.get("nodes") else [])
    was = {member.run_id: member.state() for member in runs}
    jobs = [job for member in runs for job in _jobs(member)]
    here = slurm_jobs.on_this_machine(before.get("nodes") or before.get("batch_host"))
    pids = {m["pid"] for m in _members(jobs)} if here else set()
    for member in runs:
        with open(member.file("stop.request"), "w") as handle:
            handle.write(rundir.now_iso() + "\n")
    after = slurm_jobs.cancel(job_id) if slurm_jobs.holds_processes(before) else before
    for member in runs:
        if not member.exit_record:
            atomic.write_json(member.file("exit.json"), {"state": STOPPED, "ended_at": rundir.now_iso(),
                                                         "stopped_by": "inv stop (scancel %s)" % job_id,
                                                         "was": was[member.run_id]})
    grouped = {m["pid"] for m in _members(jobs)}
    left = (_members(jobs) + [m for member in runs for m in _marked(member) if m["pid"] not in grouped]
            if here else None)
    attempts = run.status.get("attempts") or [{}]
    return {"run_id": run.run_id, "was": state, "state": rundir.RunDir(run.path).state(), "pids": sorted(pids),
            "supervisor_pid": run.status.get("supervisor_pid"), "ended_by_stop_command": None,
            "slurm": {"job_id": job_id, "before": before, "after": after, "in_queue": slurm_jobs.holds_processes(after),
                      "checked_here": here, "supervisor_left_behind": attempts[-1].get("left_behind")},
            "left": left or [], "gpu_memory_held": [], "gpu_memory": [],
            "clean": not slurm_jobs.holds_processes(after) and (not left if here else
                                                                not attempts[-1].get("left_behind"))}


def _marked(run):
    """Live processes whose command line names the run's directory (its supervisor, the driver's
    argument file): the run's markers, however they left its process groups."""
    marker = run.path.rstrip("/") + "/"
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid() and procs.alive(int(name)):
            line = procs.cmdline(int(name))
            if marker in line + "/":
                found.append({"pid": int(name), "ppid": None, "pgid": None, "sid": None, "state": "alive",
                              "cmdline": line[:200]})
    return found


VERIFY_TIMEOUT_S = 3600


def verify_output(args):
    """The run's output directory: which data_{i}.pt it holds and which fail to load whole, checked
    by run/verify_output.py on the run's python (torch is imported there, not in this call)."""
    workdir = workdir_of(args)
    run = find_run(workdir, args.get("run"))
    out = run.record.get("out")
    result = {"run_id": run.run_id, "state": run.state(), "out": out, "fleet": run.record.get("fleet")}
    if not out or not os.path.isdir(out):
        return dict(result, indices=[], unloadable=[], layers=None, dataset_samples=None, missing_dir=True)
    model = (run.record.get("driver_args") or {}).get("model")
    # What a shard must share with the others to be merged (specrig/run/sharded_runs.py union()).
    result["identity"] = {"model": hfcache.fingerprint(model) if model else None}
    if run.record.get("server"):
        found = _server_output(run)
        result["identity"].update(layer_ids=run.record["server"]["layer_ids"], dtype=found.pop("dtype"),
                                  storage=_storage(run.record["server"]))
        return dict(result, missing_dir=False, **found)
    python = run.record.get("python") or sys.executable
    if not os.path.exists(python):
        python = sys.executable
    program = os.path.join(REMOTE_ROOT, "run", "verify_output.py")
    try:
        done = subprocess.run([python, program, out], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=VERIFY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RemoteFailure("timeout", "verifying %s took longer than %d s" % (out, VERIFY_TIMEOUT_S)) from None
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RemoteFailure("verify-failed", "verifying %s with %s failed (exit %s): %s"
                            % (out, python, done.returncode, done.stderr.decode(errors="replace").strip()[-500:]),
                            traceback=done.stderr.decode(errors="replace")[-4000:])
    found = json.loads(lines[-1])
    result["identity"].update(layer_ids=found.pop("layer_ids", None), dtype=None)
    return dict(result, missing_dir=False, **found)


def _storage(plan):
    """A server-mode plan's storage type: runs planned before fp8 storage existed stored bf16."""
    return plan.get("storage", contract.BF16)


def _server_output(run):
    """verify_output.py's answer for a server-mode run's hs_{i}.safetensors, checked here (stdlib:
    run/server/outputs.py reads every header and scans the states for NaN/Inf)."""
    server = run.record["server"]
    present = outputs.existing_indices(server["out"])
    total = run.status.get("samples_total")
    fleet = run.record.get("fleet") or {}
    if fleet.get("shared_out") and total is not None:
        # One directory holds every shard (`inv extract --shared-out`): this shard is its own indices there.
        # (a run made before --clients has no "clients": one process)
        own = set(client.shard_indices(total, server["max_samples"], fleet["shard_count"], fleet["shard_index"],
                                       server.get("clients", 1)))
        present = [index for index in present if index in own]
    report = outputs.check_dataset(server["out"], None, indices=present, n_layers=len(server["layer_ids"]),
                                   hidden_size=server["hidden_size"], storage=_storage(server))
    dtype = None
    for index in present:  # the states' dtype, from the first file whose header reads
        try:
            dtype = outputs.read_header(os.path.join(server["out"], outputs.file_name(index)))["tensors"][
                "hidden_states"]["dtype"]
            break
        except (outputs.SafetensorsError, OSError, KeyError):
            continue
    return {"indices": present, "layers": len(server["layer_ids"]), "dtype": dtype,
            "unloadable": [{"index": index, "reason": "%s: %s" % (found["status"], found["detail"])}
                           for index, found in sorted(report["files"].items())],
            # The samples the run covers: min(max_samples, N) as generate-offline-data counts them.
            "dataset_samples": None if total is None else min(total, server["max_samples"] or total),
            "shard_index": fleet.get("shard_index"), "shard_count": fleet.get("shard_count")}

