"""A run's processes as a call finds them from outside its supervisor (stdlib only): `inv stop`, and
`inv resume` of a lost run, whose driver (or server and client) may outlive its supervisor.

The supervisor records each job it starts in status.json (its process group and every process seen
in it, procs.Job); a process that left those groups is still found by its command line, which names
the run's directory.
"""
import os

from base import procs


def jobs_of(run):
    """The run's current jobs, following the processes its supervisor saw: the driver's, or the
    server's and the client step's (server mode)."""
    status_now = run.status
    jobs = [procs.Job(job["pgid"], seen=job.get("seen")) for job in (status_now.get("jobs") or {}).values()]
    if status_now.get("driver_pgid"):
        jobs.append(procs.Job(status_now["driver_pgid"], seen=status_now.get("job_seen")))
    return jobs


def members(jobs):
    """The live processes of every job."""
    return [member for job in jobs for member in job.members()]


def end(jobs, grace_s):
    """End every job that still has a process: {"pids", "killed", "left"} over them all, or None."""
    ended = [job.terminate(grace_s) for job in jobs if job.members()]
    if not ended:
        return None
    return {key: [item for result in ended for item in result[key]] for key in ("pids", "killed", "left")}


def marked(run):
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
