"""A supervised run as one Slurm job, from the login node (stdlib only): the checks before it is submitted,
its job script, the submission, what Slurm says of the job, its cancellation; a sharded run's tasks as
one job array; a call (`smoke`) as a job, waited for.

The job runs the run's own supervisor, `<python> <run>/code/run/supervisor.py <run>`: the program
run/launching.py starts detached over SSH, with the same run directory, records, heartbeat and retry policy.
The job script changes only who starts it (Slurm, on a node of the allocation, not the SSH call), and
requeues the job when its time limit comes (supervised()). The run directory is on a filesystem the
nodes share with the login node, so the login node reads the supervisor's files as they are written,
and Slurm (scontrol, sacct) says what it knows of the job.
"""
import json
import os
import shlex
import shutil
import socket
import sys
import tempfile
import time

from base.contract import SENTINEL, SLURM_SETTINGS
from base.failure import RemoteFailure
from base.slurm_queries import SlurmError, holds_processes, lookup, slurm_output
from slurm import cluster, formats, partition_fit

SCRIPT = "slurm-job.sh"
#: A call run as a job (run_call): its file, in a directory of its own under ~/.cache/specrig/<CALLS>.
CALL, CALLS = "call.json", "slurm-calls"
#: The bundle's remote/ (this file is remote/slurm/jobs.py): its entry.py runs a call.
REMOTE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The job's own output and error, in the run directory (%j: the job id; a requeued job appends).
OUTPUT, ERROR = "slurm-%j.out", "slurm-%j.err"
#: A job array's: each task's, by the array's id (%A) and the task's (%a).
ARRAY_LOGS = ("slurm-%A_%a.out", "slurm-%A_%a.err")
#: Seconds before the time limit at which Slurm sends the job's shell USR1 (`--signal=B:USR1@<s>`):
#: time for the supervisor to end the attempt's processes (its grace_s) before Slurm kills the job.
SIGNAL_BEFORE_END_S = 120
#: Filesystems every node of a cluster mounts from elsewhere: a path on one is shared without a test job.
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs", "fuse.glusterfs",
                       "wekafs", "panfs", "pvfs2", "orangefs", "cifs", "smb3", "fuse.juicefs", "virtiofs")
#: The name the shared-filesystem test's file starts with (it is removed at once).
CHECK_FILE = ".specrig-shared-check-"
CANCEL_WAIT_S = 120
#: Seconds between a worker's step that ended and its next (a multi-node job's node_steps()).
NODE_STEP_RESTART_S = 5


class JobRefused(Exception):
    """Slurm refused the job (sbatch's words), or its script cannot say what the run needs."""


# -- before submitting -------------------------------------------------------------------------

def check_request(args):
    """`slurm.check` {"settings": hosts.yaml's `slurm:`, "paths": [...]}: check() of them."""
    return check(args["settings"], args.get("paths") or [])


def check(settings, paths):
    """Whether a job of `settings` could ever run here, and writes where every node sees: {problems
    (partition_fit.problems', [] when it could run), shared: [{path, fstype, shared, detail}] for each of
    `paths` (the run directory's root, the output), partitions_error (sinfo's words, or None)}."""
    try:
        partitions = cluster.partitions()
    except SlurmError as failure:
        return {"problems": [], "shared": [], "partitions_error": str(failure)}
    return {"problems": partition_fit.problems(settings, partitions), "partitions_error": None,
            "shared": [shared(settings, path) for path in paths]}


def shared(settings, path):
    """Whether the compute nodes see `path` (or, while it does not exist, the directory it will be made
    in) as this node does: a network filesystem's mount says so; any other is tested by a job of as many
    nodes as the settings' (slurm.nodes: every node of a multi-node job's allocation, at once) that
    reads a file written there on each (cluster.seen_by_a_node)."""
    path = os.path.abspath(os.path.expanduser(path))
    existing = path
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    fstype = filesystem_type(existing)
    if fstype in NETWORK_FILESYSTEMS:
        return {"path": path, "fstype": fstype, "shared": True, "detail": "a %s mount" % fstype}
    seen = cluster.seen_by_a_node(settings, existing, prefix=CHECK_FILE, nodes=settings.get("nodes") or 1)
    return {"path": path, "fstype": fstype, "shared": seen["shared"],
            "detail": "%s (%s, tested in %s)" % (seen["detail"], fstype, existing)}


def filesystem_type(path):
    """The type of the filesystem holding `path`: its longest mount point in /proc/self/mounts."""
    real = os.path.realpath(path)
    best, found = "", None
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) < 3:
                continue
            point = fields[1].replace("\\040", " ")
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, found = point, fields[2]
    return found


# -- the job script and the submission ---------------------------------------------------------

def settings_options(settings):
    """hosts.yaml's `slurm:` as sbatch options: its settings (SLURM_SETTINGS' order), then its extra_sbatch."""
    found = ["%s=%s" % (spec["sbatch"], settings[key]) for key, spec in SLURM_SETTINGS.items()
             if spec["sbatch"] and settings.get(key) is not None]
    return found + list(settings.get("extra_sbatch") or [])


def options(settings, *, name, directory, logs=(OUTPUT, ERROR)):
    """A job's sbatch options: hosts.yaml's settings (settings_options), then specrig's own: the name, the
    directory, the output and error there (`logs`: their names)."""
    return settings_options(settings) + ["--job-name=%s" % name, "--chdir=%s" % directory, "--output=%s" % os.path.join(directory, logs[0]),
                    "--error=%s" % os.path.join(directory, logs[1])]


def script(settings, *, run_path, run_id, python):
    """The job script of one run: its sbatch options (requeued, and warned before its time limit), then
    the run's supervisor on the run's python (supervised())."""
    _check_directory(run_path)
    return _script(options(settings, name="specrig-%s" % run_id, directory=run_path) + requeue_options(settings),
                   ["RUN=%s" % shlex.quote(run_path)] + supervised(python), directory=run_path,
                   about="specrig run %s: its supervisor, as `inv extract` starts it over SSH" % run_id)


def array_script(settings, *, directory, sharded_run_id, run_paths, python):
    """The job script of a sharded run's job array: task k (SLURM_ARRAY_TASK_ID) runs the supervisor of
    the k-th run, as script() does for one run. One script for every task: a task resubmitted alone is
    `sbatch --array=k` of it. `directory` holds it and the tasks' output and error."""
    for path in run_paths:
        _check_directory(path)
    sbatch = options(settings, name="specrig-%s" % sharded_run_id, directory=directory, logs=ARRAY_LOGS)
    sbatch += ["--array=0-%d" % (len(run_paths) - 1)] + requeue_options(settings)
    runs = "RUNS=(%s)" % " ".join(shlex.quote(path) for path in run_paths)
    return _script(sbatch, [runs, 'RUN="${RUNS[$SLURM_ARRAY_TASK_ID]}"'] + supervised(python), directory=directory,
                   about="specrig sharded run %s: task k runs the supervisor of shard k" % sharded_run_id)


def nodes_script(settings, *, directory, job_id, run_paths, python):
    """The job script of a multi-node job (base/nodes.py) in one allocation of len(run_paths) nodes: run
    k is node k's part. The allocation's first node, where the script runs, is the head: its supervisor
    runs there as script()'s does (supervised()); each worker's supervisor runs in a job step on its node
    (node_steps()), and starts the headless vLLM there as over SSH."""
    for path in run_paths:
        _check_directory(path)
    sbatch = options(settings, name="specrig-%s" % job_id, directory=directory) + requeue_options(settings)
    runs = "RUNS=(%s)" % " ".join(shlex.quote(path) for path in run_paths)
    return _script(sbatch, [runs] + node_steps(settings, python) + ['RUN="${RUNS[0]}"'] + supervised(python)
                   + ["# The workers follow the head's end within seconds (node_roles.py): wait for their steps.",
                      "wait"], directory=directory,
                   about="specrig multi-node job %s: the head's supervisor here, each worker's in a step on its "
                         "node" % job_id)


def node_steps(settings, python):
    """The shell lines before supervised() in a multi-node job: the allocation's nodes, the head first
    (`scontrol show hostnames`; the batch script runs on the first); each run's part of the job made from
    them (run/slurm_allocation.py: hosts, addresses, the server's command), the addresses printed for
    VLLM_HOST_IP; NCCL's and gloo's interface pinned to slurm.fabric_interface; then each worker's
    supervisor in a step of its own on its node (`srun --overlap`: beside the batch step, on the
    allocation's resources), started again when the step ends while the worker's run has not (the step
    killed: the node lost; the head's next attempt waits for it), as `inv resume` would, until the head's
    run has ended (checked after a step: a requeued job's head still has its old exit.json until
    supervised() removes it). A requeued job starts each worker's run again as supervised() starts the
    head's."""
    interface = settings.get("fabric_interface")
    step = ("srun --overlap --nodes=1 --ntasks=1 -w \"${NODES[$rank]}\" --job-name=node-$rank "
            '%s "$run/code/run/supervisor.py" "$run"' % shlex.quote(python))
    return [
        'NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        'ADDRESSES=($(%s "${RUNS[0]}/code/run/slurm_allocation.py" "${RUNS[@]}" "${NODES[@]}")) || exit 1'
        % shlex.quote(python),
    ] + (["export NCCL_SOCKET_IFNAME=%s GLOO_SOCKET_IFNAME=%s" % ((shlex.quote(interface),) * 2)] if interface else []) + [
        'for rank in $(seq 1 $((${#RUNS[@]} - 1))); do',
        '    run="${RUNS[$rank]}"',
        '    if [ -n "${SLURM_RESTART_COUNT:-}" ] && ! grep -qs \'"state": "succeeded"\' "$run/exit.json"; then',
        '        rm -f "$run/exit.json"',
        '    fi',
        '    (until [ -e "$run/exit.json" ]; do',
        '        VLLM_HOST_IP="${ADDRESSES[$rank]}" %s' % step,
        '        sleep %d' % NODE_STEP_RESTART_S,
        '        # The head\'s run ended: there is no next attempt to serve (a worker that cannot start ends here).',
        '        [ -e "${RUNS[0]}/exit.json" ] && break',
        '    done) &',
        'done',
        'export VLLM_HOST_IP="${ADDRESSES[0]}"',
    ]


def requeue_options(settings):
    """Requeued when Slurm ends the job for it (a node lost, preemption) or the job asks (its time limit),
    and warned before the limit (signal_before_end_s)."""
    return ["--requeue", "--signal=B:USR1@%d" % signal_before_end_s(settings)]


def signal_before_end_s(settings):
    """Seconds before the time limit at which the supervisor is told to stop: SIGNAL_BEFORE_END_S, or a
    quarter of a short limit (sbatch's own resolution is a minute: a warning as long as the limit would
    come at the start)."""
    limit = formats.seconds(settings["time"]) if settings.get("time") is not None else None
    return SIGNAL_BEFORE_END_S if limit is None else min(SIGNAL_BEFORE_END_S, limit // 4)


def supervised(python):
    """The shell lines that run the supervisor of the run at $RUN inside its job, and requeue the job
    when its time limit comes: USR1 (`--signal=B:USR1`, to this shell alone) is handed to the supervisor,
    which stops the attempt cleanly, then `scontrol requeue` puts the job back in the queue. The supervisor
    ends the run `stopped` (exit.json) only when this job's attempts wrote samples, and `failed` otherwise
    (slurm/time_limit.py): a job whose time goes to the model's load is not requeued forever. SIGTERM
    (scancel) is handed on too, and the shell waits: a shell that died first would leave
    the supervisor outside the job where Slurm tracks processes by their parents (proctrack/linuxproc). The requeued job (SLURM_RESTART_COUNT set) continues the run from its files, as `inv resume`
    does: exit.json removed, unless the run had succeeded."""
    return [
        'if [ -n "${SLURM_RESTART_COUNT:-}" ]; then',
        '    grep -qs \'"state": "succeeded"\' "$RUN/exit.json" && exit 0',
        '    rm -f "$RUN/exit.json"',
        'fi',
        'trap \'time_limit=1; kill -USR1 "$supervisor"\' USR1',
        '# scancel: this shell waits for the supervisor to end the attempt, so that Slurm\'s process tracking',
        '# (its KillWait, then SIGKILL) still holds the supervisor and what it started.',
        'trap \'kill -TERM "$supervisor"\' TERM',
        '%s "$RUN/code/run/supervisor.py" "$RUN" &' % shlex.quote(python),
        'supervisor=$!',
        '# wait returns early when USR1 comes: wait again until the supervisor has ended.',
        'wait "$supervisor"',
        'while kill -0 "$supervisor" 2>/dev/null; do wait "$supervisor"; done',
        'if [ -n "${time_limit:-}" ] && grep -qs \'"state": "stopped"\' "$RUN/exit.json"; then',
        '    exec scontrol requeue "$SLURM_JOB_ID"',
        'fi',
    ]


def call_script(settings, *, directory, command, python, entry):
    """The job script of one specrig call (`smoke`): the bundle's `entry` (entry.py) on the call's file in
    `directory`, as the SSH transport runs it."""
    return _script(options(settings, name="specrig-%s" % command, directory=directory),
                   ["exec %s" % " ".join(shlex.quote(word) for word in (python, entry, os.path.join(directory, CALL)))],
                   directory=directory, about="specrig %s: the call, as specrig runs it over SSH" % command)


def _script(sbatch, body, *, directory, about):
    """A job script: its #SBATCH lines, then `body` (shell lines) under umask 077."""
    _check_directory(directory)
    return "\n".join(["#!/bin/bash", "# %s (docs/slurm.md)." % about]
                     + ["#SBATCH %s" % option for option in sbatch] + ["", "umask 077"] + list(body) + [""])


def _check_directory(directory):
    if any(char.isspace() or char in "\"'$" for char in directory):
        # sbatch reads #SBATCH lines itself, without a shell's quoting.
        raise JobRefused("the job's directory %r holds a space, a quote or a $, which an #SBATCH line cannot; "
                         "choose a workdir without them" % directory)


def submit(settings, *, run_path, run_id, python):
    """Write the run's job script in its directory and submit it: {job_id, script}. The job inherits this
    call's environment (sbatch's default, --export=ALL): hosts.yaml `env:` reaches the supervisor as over
    SSH, and no value is written in the script. JobRefused with sbatch's words when it refuses."""
    path = os.path.join(run_path, SCRIPT)
    return {"job_id": _sbatch(path, script(settings, run_path=run_path, run_id=run_id, python=python)),
            "script": path}


def submit_array(settings, *, directory, sharded_run_id, run_paths, python):
    """Write a sharded run's array script in `directory` and submit it: the array job's id; task k's
    job id is "<id>_<k>"."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return _sbatch(os.path.join(directory, SCRIPT), array_script(settings, directory=directory,
                                                                 sharded_run_id=sharded_run_id,
                                                                 run_paths=run_paths, python=python))


def submit_nodes(settings, *, directory, job_id, run_paths, python):
    """Write a multi-node job's script in `directory` and submit it: the job's id (every node's run's)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return _sbatch(os.path.join(directory, SCRIPT), nodes_script(settings, directory=directory, job_id=job_id,
                                                                 run_paths=run_paths, python=python))


def resubmit_task(script_path, task, settings):
    """Task `task` of an array alone, from the array's script: its job id."""
    argv = task_argv(script_path, task, settings)
    try:
        printed = slurm_output(argv)
    except SlurmError as failure:
        raise JobRefused(str(failure)) from None
    return "%s_%d" % (printed.strip().split(";")[0], task)


def task_argv(script_path, task, settings):
    """`sbatch --array=<task>` of the array's script, with hosts.yaml's `slurm:` now on the command line,
    where it overrides the script's #SBATCH lines: a task resumed after a time limit too short for it
    (slurm/time_limit.py) takes the longer `slurm.time` its advice asks for, as a one-job run does."""
    return (["sbatch", "--parsable", "--array=%d" % task] + settings_options(settings) + requeue_options(settings)
            + [script_path])


def _sbatch(path, text):
    """Write the job script at `path` and submit it: the job's id."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    try:
        printed = slurm_output(["sbatch", "--parsable", path])
    except SlurmError as failure:
        raise JobRefused(str(failure)) from None
    return printed.strip().split(";")[0]


def run_call(settings, command, args, *, wait_s):
    """One specrig call as a Slurm job on a node, waited for: the call's file and its job script in a
    private directory under ~/.cache/specrig (the home the nodes share), entry.py run on it as over SSH,
    its result line read from the job's output. The call's result, or RemoteFailure as the call raised
    it; a job not done within `wait_s` (queued included) is cancelled. The directory is removed after."""
    root = os.path.join(os.path.expanduser("~"), ".cache", "specrig", CALLS)
    os.makedirs(root, mode=0o700, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="%s-" % command, dir=root)
    try:
        with open(os.path.join(directory, CALL), "w", encoding="utf-8") as handle:
            json.dump({"command": command, "args": args}, handle)
        try:
            job_id = _sbatch(os.path.join(directory, SCRIPT),
                             call_script(settings, directory=directory, command=command, python=sys.executable,
                                         entry=os.path.join(REMOTE_ROOT, "entry.py")))
        except JobRefused as refused:
            raise RemoteFailure("slurm-refused", "%s: %s; nothing was queued" % (command, refused)) from None
        deadline = time.monotonic() + wait_s
        while holds_processes(lookup(job_id)):
            if time.monotonic() > deadline:
                cancel(job_id)
                raise RemoteFailure("timeout", "Slurm job %s (%s) was not done in %.0f s: cancelled"
                                    % (job_id, command, wait_s))
            time.sleep(1)
        return _call_result(job_id, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _call_result(job_id, directory):
    """The result line entry.py printed in the job's output: the result, or its failure raised again."""
    printed = ""
    for name in (OUTPUT, ERROR):
        try:
            with open(os.path.join(directory, name.replace("%j", job_id)), encoding="utf-8", errors="replace") as out:
                printed += out.read()
        except FileNotFoundError:
            pass
    lines = [line for line in printed.splitlines() if line.startswith(SENTINEL + " ")]
    if not lines:
        raise RemoteFailure("script-error", "Slurm job %s printed no result (%s)" % (job_id, lookup(job_id).get("state")),
                            traceback=printed[-4000:])
    answer = json.loads(lines[-1][len(SENTINEL) + 1:])
    if answer.get("ok"):
        return answer["result"]
    error = dict(answer["error"])
    raise RemoteFailure(error.pop("kind"), error.pop("message"), **error)


def cancel(job_id):
    """scancel, then wait (CANCEL_WAIT_S) until the job has left the queue: its processes signalled
    (SIGTERM, KillWait, SIGKILL) and gone. What Slurm says of it last."""
    slurm_output(["scancel", str(job_id)])
    deadline = time.monotonic() + CANCEL_WAIT_S
    while True:
        job = lookup(job_id)
        if not holds_processes(job) or time.monotonic() > deadline:
            return job
        time.sleep(0.5)


def on_this_machine(node_names):
    """Whether every node named (a Slurm node list: "lab-node1", "lab-node[1-2]") is this machine (its
    NodeHostName is this hostname, as in the lab): only then are its processes visible from here."""
    if not node_names or node_names in ("(null)", "None"):
        return False
    try:
        hosts = slurm_output(["scontrol", "show", "hostnames", node_names]).split()
        text = slurm_output(["scontrol", "show", "node", "-o", ",".join(hosts)])
    except SlurmError:
        return False
    names = [word.split("=", 1)[1] for word in text.split() if word.startswith("NodeHostName=")]
    return len(names) == len(hosts) and set(names) == {socket.gethostname()}
