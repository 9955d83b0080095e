"""Process groups and sessions on a Linux host, read from /proc (stdlib only).

A supervised job runs in its own session (setsid), so its session id and
process group id are its pid. vLLM's tensor-parallel workers are its children:
when the parent dies they are reparented to init but keep the session and the
group, and keep their GPU memory. So a job is "every process whose session or
process group is the job's id" (found again after the parent is gone), plus
the descendants of those (a child that left with setsid()), remembered once seen.
"""
import os
import signal
import time

#: /proc's unit of CPU time.
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat(pid):
    """(ppid, pgid, sid, state, starttime, CPU ticks used: user and system) of a process, or None once it is
    gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            text = handle.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[2]), int(fields[3]), fields[0], int(fields[19]), int(fields[11]) + int(fields[12])


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _live_table():
    """{pid: stat} of every process that is not a zombie."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[3] != "Z":
                table[int(name)] = stat
    return table


class Job:
    """The processes of one job, remembered once seen.

    A member is in the job's session or process group, or descends from one that is; once seen it
    stays the job's (matched by pid and start time), so a worker that called setsid() is still
    followed after its parent is gone.
    """

    def __init__(self, job_id, seen=None):
        self.job_id = job_id
        #: {pid: start time} of every process seen in the job; JSON-safe through `saved()`.
        self.seen = {int(pid): start for pid, start in (seen or {}).items()}

    def saved(self):
        """`seen` for a JSON file: another process (inv stop) follows the same processes."""
        return {str(pid): start for pid, start in self.seen.items()}

    def members(self):
        """[{pid, ppid, pgid, sid, state, cpu_s, cmdline}] of the job's live processes (cpu_s: the CPU time each
        has used, user and system, in seconds)."""
        table = _live_table()
        inside = {pid for pid, stat in table.items() if self.job_id in (stat[1], stat[2])}
        inside |= {pid for pid, start in self.seen.items() if pid in table and table[pid][4] == start}
        children = {}
        for pid, stat in table.items():
            children.setdefault(stat[0], []).append(pid)
        pending = list(inside)
        while pending:
            for child in children.get(pending.pop(), []):
                if child not in inside:
                    inside.add(child)
                    pending.append(child)
        self.seen.update((pid, table[pid][4]) for pid in inside)
        return [{"pid": pid, "ppid": table[pid][0], "pgid": table[pid][1], "sid": table[pid][2],
                 "state": table[pid][3], "cpu_s": table[pid][5] / CLOCK_TICKS_PER_S, "cmdline": cmdline(pid)[:200]}
                for pid in sorted(inside)]

    def signal(self, signum):
        """The signal to the job's group and to each member (those in other groups or sessions too)."""
        left = self.members()
        try:
            os.killpg(self.job_id, signum)
        except (ProcessLookupError, PermissionError):
            pass
        for member in left:
            try:
                os.kill(member["pid"], signum)
            except (ProcessLookupError, PermissionError):
                pass

    def wait_gone(self, timeout_s, reap=None):
        """Wait until no member is left; the members still alive at the deadline.

        `reap` is called while waiting so that a parent can collect its own child (a child it
        has not waited for stays a zombie, which does not count).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if reap:
                reap()
            left = self.members()
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)

    def terminate(self, grace_s, reap=None):
        """SIGTERM, `grace_s` to exit, then SIGKILL: {"pids": all, "killed": after the grace, "left": alive}."""
        before = [m["pid"] for m in self.members()]
        self.signal(signal.SIGTERM)
        # A stopped process (SIGSTOP, a debugger: a fault the supervisor meets) takes its SIGTERM only once
        # continued: without this it would wait out the grace for its SIGKILL, its handlers never run.
        self.signal(signal.SIGCONT)
        left = self.wait_gone(grace_s, reap)
        killed = [m["pid"] for m in left]
        if left:
            self.signal(signal.SIGKILL)
            left = self.wait_gone(10, reap)
        return {"pids": before, "killed": killed, "left": left}


def members(job_id):
    """The live processes of the job `job_id` (see Job)."""
    return Job(job_id).members()


def terminate_job(job_id, grace_s, reap=None):
    return Job(job_id).terminate(grace_s, reap)


def alive(pid):
    """True while `pid` runs (a zombie is dead)."""
    return state(pid) not in (None, "Z")


def state(pid):
    """The state letter of `pid` in /proc (R, S, D, T stopped, Z ...), or None once it is gone."""
    stat = _stat(pid) if pid else None
    return stat and stat[3]
