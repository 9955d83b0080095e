"""What a Slurm cluster's login node sees of its cluster, for doctor: the Slurm version, the partitions
(GPU gres, nodes idle and allocated, time limit), the user's jobs, and whether the home directory is the
one the compute nodes see.

Everything is asked of Slurm's own commands (sinfo, squeue, srun), as the user would. A command that is
missing or fails is a fact of the report ("error"), never an exception: doctor shows what it could read.
The shared home is tested, not assumed: a one-task job reads a file written here a moment before.
"""
import os
import secrets

from base.slurm_queries import SlurmError, slurm_output
from slurm import formats, partition_fit

#: How long the home test waits for a node (srun --immediate): a busy cluster is reported as such.
ALLOCATION_WAIT_S = 15
#: The home test's whole deadline: the allocation, the step, the job's end.
HOME_TEST_TIMEOUT_S = 40
#: sinfo's fields, one partition's nodes of one kind a line: name (default marked *), availability,
#: time limit, node counts allocated/idle/other/total, gres.
PARTITION_FORMAT = "%P|%a|%l|%F|%G"
JOB_FORMAT = "%i|%j|%T|%P|%D|%M|%l|%R"
JOB_FIELDS = ("id", "name", "state", "partition", "nodes", "elapsed", "time_limit", "where")
HOME_TEST_JOB = "specrig-home-check"


def version():
    """sinfo's version ("22.05.8" of "slurm-wlm 22.05.8")."""
    return slurm_output(["sinfo", "--version"]).split()[-1]


def gpus_in(gres):
    """The GPUs of one gres text ("gpu:h100:8(S:0-1),nic:1" -> 8; "(null)" -> 0; one we cannot read: 0)."""
    try:
        return sum(count for name, _, count in formats.gres(gres) if name == "gpu")
    except ValueError:
        return 0


def partitions():
    """Each partition once, its lines (nodes of one gres each) added up: {name, default, available,
    time_limit (sinfo's text), time_limit_s (None: no limit), nodes: {allocated, idle, other, total},
    node_kinds: [{gres (sinfo's text), nodes}] (its nodes by what each has: what partition_fit weighs a
    request against), gpus_per_node (the most any of its nodes has)}."""
    return parse_partitions(slurm_output(["sinfo", "-h", "-o", PARTITION_FORMAT]))


def parse_partitions(text):
    """partitions() of sinfo's text in PARTITION_FORMAT."""
    found = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5:
            continue
        name, available, limit, counts, gres = fields
        entry = found.setdefault(name.rstrip("*"), {
            "name": name.rstrip("*"), "default": name.endswith("*"), "available": available,
            "time_limit": limit, "time_limit_s": _limit_seconds(limit),
            "nodes": dict.fromkeys(("allocated", "idle", "other", "total"), 0), "node_kinds": [],
            "gpus_per_node": 0})
        numbers = [int(count) if count.isdigit() else 0 for count in counts.split("/")]
        for key, count in zip(("allocated", "idle", "other", "total"), numbers):
            entry["nodes"][key] += count
        entry["node_kinds"].append({"gres": gres, "nodes": numbers[-1] if numbers else 0})
        entry["gpus_per_node"] = max(entry["gpus_per_node"], gpus_in(gres))
    return list(found.values())


def _limit_seconds(text):
    try:
        return formats.seconds(text)
    except ValueError:
        return None  # a limit sinfo writes in a way we do not read ("n/a"): the text is still shown


def jobs(user):
    """The user's jobs in the queue (running, pending, ...): JOB_FIELDS; `where` is the node list of a
    running job and the reason of a pending one."""
    found = []
    for line in slurm_output(["squeue", "-h", "-u", user, "-o", JOB_FORMAT]).splitlines():
        fields = line.strip().split("|")
        if len(fields) == len(JOB_FIELDS):
            found.append(dict(zip(JOB_FIELDS, fields)))
    return found


def job_options(settings):
    """The sbatch/srun options of hosts.yaml's partition, account and qos: where the user may run jobs."""
    return ["--%s=%s" % (name, settings[name]) for name in ("partition", "account", "qos") if settings.get(name)]


def shared_home(settings):
    """Whether a compute node sees this home directory: a file with a random token written under
    ~/.cache/specrig (private: 0600 in 0700 directories), then a one-task job that prints it.
    {shared: True, False or None (not tested), path, detail}."""
    directory = os.path.join(os.path.expanduser("~"), ".cache", "specrig", "slurm-home-check")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return seen_by_a_node(settings, directory)


def seen_by_a_node(settings, directory, *, prefix="", nodes=1):
    """Whether `nodes` compute nodes at once see `directory` as this node does: a file named `prefix` and
    a random token (0600) written there, a job of one task on each node that prints it (hosts.yaml's
    partition, account and qos), the file removed. {shared: True, False or None (not tested: no `nodes`
    nodes free in ALLOCATION_WAIT_S, the job refused), path, detail}."""
    token = secrets.token_hex(16)
    path = os.path.join(directory, prefix + token)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(token + "\n")
    argv = ["srun", "--job-name=" + HOME_TEST_JOB, "--nodes=%d" % nodes, "--ntasks=%d" % nodes,
            "--ntasks-per-node=1", "--time=1",
            "--immediate=%d" % ALLOCATION_WAIT_S, "--quiet"] + job_options(settings) + ["cat", path]
    try:
        printed = slurm_output(argv, timeout=HOME_TEST_TIMEOUT_S)
    except SlurmError as failure:
        return _home_failure(path, failure)
    finally:
        os.unlink(path)
    if printed.split() == [token] * nodes:
        where = "a job on a compute node" if nodes == 1 else "a job's task on each of %d compute nodes" % nodes
        return {"shared": True, "path": path, "detail": "%s read the file written here" % where}
    return {"shared": False, "path": path, "detail": "a job printed %r, not the token written here%s"
            % (printed[:80], "" if nodes == 1 else " by each of its %d nodes" % nodes)}


def _home_failure(path, failure):
    """The test job failed: the file missing on the node (cat said so) means not shared; anything else
    (no node free, the job refused) leaves it untested."""
    if "No such file or directory" in failure.said:
        return {"shared": False, "path": path, "detail": "the job on a compute node found no such file"}
    return {"shared": None, "path": path, "detail": "not tested: %s" % failure}


def facts(settings, user):
    """doctor's Slurm section: {version, partitions, jobs, shared_home, request_problems, errors}: a part
    whose Slurm command failed is None, and `errors` holds what the command said, by part ({} when all
    ran). request_problems: why a job of hosts.yaml's `slurm:` could never run here (partition_fit.py; []
    when it could). No home test and no request weighed (None) when sinfo could not read the partitions."""
    report = {"errors": {}}
    for key, read in (("version", version), ("partitions", partitions), ("jobs", lambda: jobs(user))):
        try:
            report[key] = read()
        except SlurmError as failure:
            report[key] = None
            report["errors"][key] = str(failure)
    # No controller to answer sinfo: no job to run either, nothing to weigh hosts.yaml's request against.
    known = report["partitions"] is not None
    report["shared_home"] = shared_home(settings) if known else None
    report["request_problems"] = partition_fit.problems(settings, report["partitions"]) if known else None
    return report
