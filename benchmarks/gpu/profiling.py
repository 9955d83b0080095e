"""Where an arm's time goes (issues 19 and 26): a window in the arm's steady part, over its three processes.

    window = Window(label, trigger)     # trigger(): True once the arm is in its steady part
    window.start() ... window.join()    # the arm's own work runs meanwhile; window.result after

In the window (WINDOW_S seconds), for the EngineCore, the API server (its parent) and the client
(generate-offline-data or the bare client):
- every thread's CPU time from /proc (utime + stime), as a share of the window: which threads were busy;
- the stacks of every Python thread, from sampler/sitecustomize.py (on the arm's PYTHONPATH), and from
  py-spy where the machine lets it attach (it needs ptrace): what the busy threads were doing;
- the GPU's utilization, from nvidia-smi every 100 ms: whether the GPU waited.
The stacks go to extras/profile-<label>/; the result (CPU by thread, GPU utilization) to the arm's record.
"""
import glob
import os
import shutil
import subprocess
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLER = os.path.join(HERE, "sampler")
WINDOW_S = 8
TICKS = os.sysconf("SC_CLK_TCK")


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def processes():
    """{role: pid} for the arm's EngineCore, API server and client processes, where they run: "client" for
    the first (lowest pid) generate-offline-data or bare client, "client-2", ... for the others (specrig's
    --clients N), as specrig's status names its client jobs."""
    found, clients = {}, []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        cmd = _read("/proc/%s/cmdline" % entry).replace("\0", " ")
        comm = _read("/proc/%s/comm" % entry).strip()
        if "EngineCor" in comm or "EngineCore" in cmd:
            found["engine"] = int(entry)
            stat = _read("/proc/%s/stat" % entry)
            found["api"] = int(stat[stat.rindex(")") + 2:].split()[1])
        elif "generate-offline-data" in cmd or "bare-client" in cmd:
            clients.append(int(entry))
    for k, pid in enumerate(sorted(clients)):
        found["client" if k == 0 else "client-%d" % (k + 1)] = pid
    return found


def thread_ticks(pid):
    """{tid: (name, CPU ticks)} of one process's threads."""
    ticks = {}
    for task in glob.glob("/proc/%d/task/*" % pid):
        stat = _read(task + "/stat")
        if stat:
            fields = stat[stat.rindex(")") + 2:].split()
            ticks[int(os.path.basename(task))] = (_read(task + "/comm").strip(), int(fields[11]) + int(fields[12]))
    return ticks


def cpu_by_thread(before, after, seconds):
    """[tid, comm, share of one core] of each thread busy in the window, busiest first, and the whole
    process's share last (tid None). The sampler's files name the tids' Python threads."""
    shares = [[tid, name, round((ticks - before.get(tid, (name, 0))[1]) / TICKS / seconds, 3)]
              for tid, (name, ticks) in after.items()]
    busy = sorted((item for item in shares if item[2] >= 0.01), key=lambda item: -item[2])
    return busy + [[None, "all", round(sum(item[2] for item in shares), 3)]]


def enable(env, directory):
    """The environment of an arm's processes with the sampler on, writing under `directory`."""
    env = dict(env)
    env["GPU_PROFILE_DIR"] = directory
    env["PYTHONPATH"] = SAMPLER + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class Window(threading.Thread):
    """The profile of one arm's steady part (module docstring); `directory` is the sampler's."""

    def __init__(self, directory, trigger, timeout=400):
        threading.Thread.__init__(self, daemon=True)
        self.directory, self.trigger, self.timeout = directory, trigger, timeout
        self.result = {"window_s": WINDOW_S}
        #: Set by the harness once the arm has ended: a window still waiting for its trigger gives up at once
        #: instead of at its timeout (the call's budget is the device's).
        self.cancelled = False
        os.makedirs(directory, exist_ok=True)

    def run(self):
        deadline = time.time() + self.timeout
        while not self.trigger():
            if time.time() > deadline or self.cancelled:
                self.result["error"] = "never reached its steady part"
                return self._close()
            time.sleep(0.1)
        procs = processes()
        self.result["pids"] = procs
        before = {role: thread_ticks(pid) for role, pid in procs.items()}
        open(os.path.join(self.directory, "on"), "w").close()
        spies = self._py_spy(procs)
        gpu = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) \
            if shutil.which("nvidia-smi") else None
        started = time.time()
        time.sleep(WINDOW_S)
        seconds = time.time() - started
        # when, so that the record can say the window lay in the arm's steady part (first to last file)
        self.result.update(started_at=round(started, 2), ended_at=round(started + seconds, 2))
        after = {role: thread_ticks(pid) for role, pid in procs.items()}
        self._close()
        self.result["cpu_by_thread"] = {role: cpu_by_thread(before[role], after[role], seconds) for role in procs}
        if gpu:
            gpu.terminate()
            values = [int(line) for line in gpu.communicate()[0].split() if line.strip().isdigit()]
            self.result["gpu_utilization"] = {"mean": round(sum(values) / len(values), 1) if values else None,
                                              "samples": len(values), "values": values}
        for role, spy in spies.items():
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
            err = spy.stderr.read()[-400:] if spy.stderr else ""
            self.result.setdefault("py_spy", {})[role] = {"exit": spy.returncode, "stderr": err}

    def _py_spy(self, procs):
        spy = shutil.which("py-spy")
        if not spy:
            self.result["py_spy"] = "not installed"
            return {}
        return {role: subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(WINDOW_S), "--rate", "200",
                                        "--format", "raw", "--threads", "--idle", "--nonblocking",
                                        "-o", os.path.join(self.directory, "py-spy-%s.txt" % role)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for role, pid in procs.items()}

    def _close(self):
        open(os.path.join(self.directory, "off"), "w").close()
