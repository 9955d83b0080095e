"""Slurm's commands run, and what Slurm says of a job: the queries a run's records (base/rundir.py) and the
Slurm stage (slurm/) both ask, so they lie in the ground (stdlib only).
"""
import shutil
import subprocess

#: Each of sinfo's and squeue's answers: the controller answers in well under a second when it is up;
#: when it is down, Slurm's own retries give up after about 10 s (22.05, MessageTimeout's default).
QUERY_TIMEOUT_S = 25
#: scontrol's job states after which none of the job's processes runs (COMPLETING: still ending them).
ENDED = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "SPECIAL_EXIT", "TIMEOUT")
#: scontrol's fields a job's view keeps, by the name specrig gives them.
JOB_FIELDS = {"JobState": "state", "Reason": "reason", "StartTime": "start_time", "SubmitTime": "submitted_at",
              "RunTime": "run_time", "TimeLimit": "time_limit", "NodeList": "nodes", "BatchHost": "batch_host",
              "ExitCode": "exit_code", "Restarts": "restarts", "Partition": "partition"}


class SlurmError(Exception):
    """A Slurm command could not run or failed: the message is its last word, `said` all it wrote."""

    def __init__(self, message, said=""):
        super().__init__(message)
        self.said = said


def slurm_output(argv, *, timeout=QUERY_TIMEOUT_S):
    """A Slurm command's stdout; SlurmError with its own words when it is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        raise SlurmError("%s not found on PATH" % argv[0])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError("%s gave no answer in %d s" % (argv[0], timeout)) from None
    if done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip()
        last = said.splitlines()[-1] if said else "no message"
        raise SlurmError("%s failed (exit %d): %s" % (argv[0], done.returncode, last), said)
    return done.stdout


def lookup(job_id):
    """What Slurm says of the job: {job_id, source, ...JOB_FIELDS' names}. From `scontrol show job` while
    the controller knows the job (pending, running, and MinJobAge after its end), then sacct; sacct
    without accounting storage (the lab: no slurmdbd) knows nothing, and the answer says so:
    {job_id, source: None, state: None, detail}."""
    try:
        text = slurm_output(["scontrol", "show", "job", "-o", str(job_id)])
    except SlurmError as failure:
        if "Invalid job id" not in failure.said:
            return {"job_id": job_id, "source": None, "state": None, "detail": str(failure)}
        return accounted(job_id)
    return dict(parse_job(text), job_id=job_id, source="scontrol")


def parse_job(text):
    """JOB_FIELDS of `scontrol show job -o`'s line (key=value words; a value holds no space)."""
    fields = dict(word.split("=", 1) for word in text.split() if "=" in word)
    return {name: fields.get(key) for key, name in JOB_FIELDS.items()}


def accounted(job_id):
    """sacct's record of a job the controller no longer holds."""
    try:
        text = slurm_output(["sacct", "-j", str(job_id), "-n", "-P", "-X", "-o", "State,ExitCode,NodeList,Start"])
    except SlurmError as failure:
        return {"job_id": job_id, "source": None, "state": None,
                "detail": "no longer in the queue, and sacct has no record: %s" % failure}
    lines = [line.split("|") for line in text.splitlines() if line.strip()]
    if not lines:
        return {"job_id": job_id, "source": None, "state": None, "detail": "no longer in the queue; sacct: no record"}
    state, exit_code, nodes, start = (lines[0] + [None] * 4)[:4]
    # sacct writes "CANCELLED by 1000": the state is its first word.
    return {"job_id": job_id, "source": "sacct", "state": state.split()[0], "exit_code": exit_code, "nodes": nodes,
            "start_time": start}


def holds_processes(job):
    """Whether the job may still run a process of the run (pending, running, requeued, ending), as far as
    Slurm says: an unknown job (None state) holds none."""
    return job["state"] is not None and job["state"] not in ENDED
