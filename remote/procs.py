"""Process groups and sessions on a Linux host, read from /proc (stdlib only).

A supervised job runs in its own session (setsid), so its session id and
process group id are its pid. vLLM's tensor-parallel workers are its children:
when the parent dies they are reparented to init but keep the session and the
group, and keep their GPU memory. So a job is "every process whose session or
process group is the job's id", found again after the parent is gone.
"""
import os
import signal
import time


def _stat(pid):
    """(ppid, pgid, sid, state) of a process, or None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            text = handle.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[2]), int(fields[3]), fields[0]


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def members(job_id):
    """Live processes of the job: [{pid, ppid, pgid, sid, state, cmdline}]; zombies are not counted."""
    found = []
    for pid in _pids():
        stat = _stat(pid)
        if stat is None:
            continue
        ppid, pgid, sid, state = stat
        if (pgid == job_id or sid == job_id) and state != "Z":
            found.append({"pid": pid, "ppid": ppid, "pgid": pgid, "sid": sid, "state": state,
                          "cmdline": cmdline(pid)[:200]})
    return found


def alive(pid):
    """True while `pid` runs (a zombie is dead)."""
    stat = _stat(pid) if pid else None
    return stat is not None and stat[3] != "Z"


def signal_job(job_id, signum):
    """Send a signal to the job's group and to every member that left it (setpgid) but kept the session."""
    try:
        os.killpg(job_id, signum)
    except (ProcessLookupError, PermissionError):
        pass
    for member in members(job_id):
        try:
            os.kill(member["pid"], signum)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(job_id, timeout_s, reap=None):
    """Wait until no member of the job is left; return the members still alive at the deadline.

    `reap` is called while waiting so that a parent can collect its own child (a
    child it has not waited for stays a zombie, which `members` ignores anyway).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if reap:
            reap()
        left = members(job_id)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def terminate_job(job_id, grace_s, reap=None):
    """SIGTERM to the job, `grace_s` to exit, then SIGKILL; {"terminated", "killed", "left"} pid lists."""
    before = [m["pid"] for m in members(job_id)]
    signal_job(job_id, signal.SIGTERM)
    left = wait_gone(job_id, grace_s, reap)
    killed = [m["pid"] for m in left]
    if left:
        signal_job(job_id, signal.SIGKILL)
        left = wait_gone(job_id, 10, reap)
    return {"pids": before, "killed": killed, "left": left}
