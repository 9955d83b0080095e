"""A server-mode attempt's start-up, off its critical path (issue 26; stdlib only).

An attempt used to run in a line: the server's load, then prepare-data (it renders through the server, so
it cannot start before /health), then generate-offline-data, each client step paying its imports after the
one before it ended. Now, while the server loads:

* the prepared data's key (prepared_cache.py) is hashed in a thread; on a hit the cached directory becomes
  the run's prepared directory and prepare-data does not run;
* each client step's processes start at once through warm_start.py, which imports speculators' CLI and
  waits: generate-offline-data's with the server, prepare-data's as soon as the key says it is needed,
  together with a GPU-less render server (render.py) for it to render through. The supervisor lets
  prepare-data go when the render server answers /health (or, should the model's server answer first, at
  that /health, rendering through the model's server) and generate-offline-data once the prepared data is
  whole, by writing its go file (warm/<attempt>-<job>.go in the run directory: empty, or the step's
  arguments to run instead).

They are the attempt's jobs from their start (status.json "jobs", their output in driver.log, `inv stop`),
and one that exits before its go fails the attempt as its step would have (its log classified). The stall
watch follows a step once it is let go. The times (status.json, the attempt's record and heartbeat.json
"startup") say what the start-up took: the server's start, /health, prepare-data's start and end or the
cache hit, the go of generate-offline-data, its first file, and health_to_first_file_s.
"""
import json
import os
import shutil
import threading
import time

from base import atomic, outputs, prepared
from base.rundir import PRIVATE_DIR
from run.server import client, health, prepared_cache, render

#: speculators' client steps, as logs and failures (`role`) name them.
PREPARE, GENERATE = "prepare-data", "generate-offline-data"
#: The job of prepare-data's process; generate-offline-data's are "client", "client-2", ... (client_job);
#: the render server's, which prepare-data renders through while the model loads.
PREPARE_JOB, CLIENT, RENDER_JOB = "prepare", "client", "render"
#: Seconds between probes of the render server's /health (each given twice that to answer); once it answered,
#: health.UNHEALTHY_PROBES probes in a row without an answer (a render server that hangs: stopped, deadlocked)
#: count it as gone.
RENDER_PROBE_S = 0.5
WARM_START = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_start.py")
#: What the key job found (KeyJob.outcome).
HIT, MISS, NO_KEY = "hit", "miss", "no-key"


def client_job(k):
    """The job name of generate-offline-data's k-th process: "client", then "client-2", ... (plan's generate_argvs)."""
    return CLIENT if k == 0 else "%s-%d" % (CLIENT, k + 1)


class ClientStep:
    """A client step's processes, followed as one: ended when all have ended, 0 when all exited 0, else the
    first failure's status (its siblings are ended with it: they share the share and its log). `processes`
    is a function, asked at each poll: a process replaced meanwhile (prepare-data, when the render server it
    rendered through died) is followed in its place."""

    def __init__(self, processes):
        self.processes = processes

    def poll(self):
        statuses = [proc.poll() for proc in self.processes()]
        failed = [status for status in statuses if status not in (None, 0)]
        if failed:
            return failed[0]
        return None if None in statuses else 0


class PreparedStep(ClientStep):
    """prepare-data's process, done (0) as soon as the prepared directory it writes is whole (prepared.whole),
    before the process exits: its interpreter's own ending took seconds (3.6 s of the lab's 5.5 s from /health
    to the first file), during which generate-offline-data may as well run. A failure before that is its own."""

    def __init__(self, processes, directory):
        super().__init__(processes)
        self.directory, self.ending = directory, False

    def poll(self):
        status = super().poll()
        if status is None and prepared.whole(self.directory):
            self.ending = True  # its process still runs: ended by the step's end, its exit status not waited for
            return 0
        return status


def warm_argv(argv, go_file):
    """A step's argv (`<python> -m speculators <step> ...`) through warm_start.py, let go by `go_file`."""
    return [argv[0], WARM_START, go_file] + list(argv[1:])


class KeyJob:
    """The prepared data's key, hashed in a thread while the server loads; on a hit, the cached directory
    linked as the run's prepared directory. `outcome` HIT, MISS or NO_KEY (`detail` says why) once done."""

    def __init__(self, plan, cache_root, cwd):
        self.plan, self.cache, self.cwd = plan, prepared_cache.PreparedCache(cache_root), cwd
        self.outcome = self.detail = self.key = self.inputs = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.work, name="prepared-key", daemon=True)

    def start(self):
        self.thread.start()
        return self

    def poll(self):
        """0 once done (a step's poll(), for the watch while it is waited for), else None."""
        return 0 if self.done.is_set() else None

    def work(self):
        try:
            self.inputs = prepared_cache.key_inputs(self.plan["prepared_key"], self.cache.hashes(), cwd=self.cwd)
            self.key = prepared_cache.cache_key(self.inputs)
            hit = self.cache.link_into(self.key, self.plan["prepared"])
            self.outcome = HIT if hit else MISS
        except prepared_cache.NoKey as exc:
            self.outcome, self.detail = NO_KEY, str(exc)
        except OSError as exc:  # the cache cannot be read or written: the run prepares as without it
            self.outcome, self.detail = NO_KEY, "the prepared-data cache: %s" % exc
        finally:
            self.done.set()

    def publish(self):
        """Keep the run's prepared directory as the key's: the log's words."""
        try:
            made = self.cache.publish(self.key, self.plan["prepared"], self.inputs)
        except OSError as exc:
            return "not kept in the prepared-data cache: %s" % exc
        return ("kept in the prepared-data cache as %s" % self.key if made
                else "the prepared-data cache has %s already (another run prepared it meanwhile)" % self.key)


class StartUp:
    """One attempt's start-up: the key job, the client steps' warm processes, the times."""

    def __init__(self, workload, entry, previous=None):
        self.workload, self.entry, self.previous = workload, entry, previous
        sup = workload.supervisor
        self.sup, self.plan = sup, workload.plan
        self.go_dir = sup.run.file("warm")
        self.times = {}
        #: Started and not yet let go: {job: (step, process, go file)}.
        self.waiting = {}
        self.key_job = None
        self.prepare_started = False
        self.present_at_go = None
        #: The render server's port while it runs and prepare-data may render through it, else None; its /health.
        self.render_port = self.render_health = None
        #: Whether prepare-data's warm process was started to render through the render server: let go through
        #: the model's server instead, it is given the model's endpoint.
        self.prepare_via_render = False
        #: prepare-data's jobs once let go before the model's server answered (through the render server).
        self.prepare_jobs = None

    # -- the times ----------------------------------------------------------------------------------

    def mark(self, name, when=None, **more):
        self.times[name] = round(time.time() if when is None else when, 3)
        self.times.update(more)
        if "first_file" in self.times and "health" in self.times:
            self.times["health_to_first_file_s"] = round(self.times["first_file"] - self.times["health"], 3)
        self.entry["startup"] = self.sup.status["startup"] = dict(self.times)
        self.workload.heartbeat.update(startup=dict(self.times))

    # -- the processes ------------------------------------------------------------------------------

    def begin(self, started_at):
        """The server runs (since `started_at`): start the key job and the warm processes. A failure found (a
        process that could not be started), else None."""
        self.mark("server_started", started_at)
        if self.previous is not None and self.previous.key_job is not None:
            self.previous.key_job.thread.join()  # it may still link the cache's entry into the run's directory
        shutil.rmtree(self.go_dir, ignore_errors=True)
        os.makedirs(self.go_dir, mode=PRIVATE_DIR)
        prepared_dir = self.plan["prepared"]
        if not prepared.complete(prepared_dir):
            shutil.rmtree(prepared_dir, ignore_errors=True)  # a part-written one would be skipped by prepare-data
            workdir = self.sup.record.get("workdir")
            if self.plan.get("prepared_key") and workdir:
                self.key_job = KeyJob(self.plan, prepared_cache.cache_root(workdir), self.sup.run.path).start()
            else:
                found = self.start_prepare()
                if found:
                    return found
        for k, argv in enumerate(self.plan["generate_argvs"]):
            found = self.start(client_job(k), GENERATE, argv)
            if found:
                return found
        return None

    def start(self, job, step, argv):
        go = os.path.join(self.go_dir, "%d-%s.go" % (self.entry["attempt"], job))
        try:
            proc = self.workload.jobs.start(job, warm_argv(argv, go), self.workload.client_log)
        except OSError as exc:
            return self.workload.not_started(step, exc)
        self.waiting[job] = (step, proc, go)
        self.prepare_started = self.prepare_started or job == PREPARE_JOB
        return None

    def look(self):
        """Every poll of the attempt's watch: prepare-data's warm process started once the key job found it
        needed; a failure when a process that waits for its go has exited, else None."""
        job = self.key_job
        if job is not None and job.done.is_set() and job.outcome != HIT and not self.prepare_started:
            self.key_job_done()
            found = self.start_prepare()
            if found:
                return found
        found = self.look_at_render()
        if found:
            return found
        for name, (step, proc, _go) in self.waiting.items():
            status = proc.poll()
            if status is not None:
                self.sup.log_marker("%s (%s) exited with status %s before its go" % (step, name, status))
                return self.workload.step_failed(step, status if status != 0 else 1)
        return None

    def start_prepare(self, through_render=True):
        """prepare-data's warm process, and the render server it renders through when the plan has one (and
        `through_render`: not once the render server it had is gone)."""
        argv = self.plan["prepare_argv"]
        self.prepare_via_render = False
        if through_render and self.plan.get("render_argv"):
            port = render.free_port()
            try:
                self.workload.jobs.start(RENDER_JOB, render.argv_on(self.plan["render_argv"], port),
                                         self.sup.run.file("render.log"))
            except OSError as exc:
                self.sup.log_marker("the render server could not be started (%s): prepare-data renders through "
                                    "the model's server" % exc)
            else:
                self.render_port = port
                self.render_health = health.ServerHealth(port, health.LOADING, every_loading_s=RENDER_PROBE_S,
                                                         every_s=RENDER_PROBE_S, timeout=RENDER_PROBE_S * 2)
                self.prepare_via_render = True
                self.mark("render_started")
                argv = render.with_endpoint(argv, client.endpoint(port))
        return self.start(PREPARE_JOB, PREPARE, argv)

    def look_at_render(self):
        """While prepare-data waits for its go, or renders through the render server: let it go once the render
        server answers /health; once the render server is gone (exited, or silent RENDER_SILENT_PROBES probes
        in a row after it answered), end it, and a prepare-data that rendered through it is started again
        through the model's server (a failure found when it cannot be, else None)."""
        if self.render_port is None or (PREPARE_JOB not in self.waiting and self.prepare_jobs is None):
            return None
        proc = self.workload.jobs.running.get(RENDER_JOB, (None,))[0]
        if proc is None or proc.poll() is not None:
            return self.render_gone("exited with status %s (render.log)" % (proc.poll() if proc else None))
        was = self.render_health.state
        state = self.render_health.look()
        if state == health.UNHEALTHY:
            return self.render_gone("did not answer /health %d times in a row" % self.render_health.unhealthy)
        if was == health.LOADING and state == health.READY:
            self.mark("render_ready")
            self.sup.log_marker("prepare-data: rendering through the render server (port %d) while the model "
                                "loads" % self.render_port)
            self.mark("prepare_started", prepare="ran", render="render server")
            self.prepare_jobs = self.let_go(PREPARE)
        return None

    def render_gone(self, why):
        """The render server is gone (`why`): end what is left of it; prepare-data, if it rendered through it,
        is ended and started again, through the model's server: let go now when that server answers, else at
        its /health. A failure found when it cannot be started, else None."""
        rendering = self.prepare_jobs
        self.sup.log_marker("the render server %s: prepare-data renders through the model's server%s"
                            % (why, " (started again: it was rendering through the render server)" if rendering
                               else ""))
        self.end_render()
        if not rendering:
            return None
        for job in rendering:
            self.workload.jobs.end(job)
        self.prepare_jobs = None
        shutil.rmtree(self.plan["prepared"], ignore_errors=True)  # prepare-data would skip a part-written one
        found = self.start_prepare(through_render=False)
        if found is None and "health" in self.times:
            self.prepare_jobs = self.let_go(PREPARE)
        return found

    def end_render(self):
        self.render_port = None
        if RENDER_JOB in self.workload.jobs.running:
            self.workload.jobs.end(RENDER_JOB)

    def key_job_done(self):
        """Say once what the key job found."""
        job = self.key_job
        if "prepared_key" in self.times:
            return
        if job.outcome == HIT:
            self.sup.log_marker("prepare-data: not run, the prepared-data cache has key %s (%s)"
                                % (job.key, self.plan["prepared"]))
            self.mark("prepared_key", prepare="cached", key=job.key)
        elif job.outcome == MISS:
            self.mark("prepared_key", key=job.key)
        else:
            self.sup.log_marker("prepare-data: no cache (%s)" % job.detail)
            self.mark("prepared_key", key=None)

    def let_go(self, step, words=None):
        """Let `step`'s waiting processes go: their jobs, in order; `words` (speculators' step and its arguments)
        replace those they were started with."""
        jobs = [name for name, (waiting_step, _proc, _go) in self.waiting.items() if waiting_step == step]
        for name in jobs:
            _step, _proc, go = self.waiting.pop(name)
            ready = _read(go + ".ready")
            # Whole or absent to warm_start.py, which reads it once it exists: empty, or the arguments to run
            # instead of those it was started with (JSON).
            atomic.write_bytes(go, json.dumps(words).encode() if words else b"")
            if ready is not None:
                self.times.setdefault("imports_s", {})[name] = ready
        return jobs

    # -- the steps ----------------------------------------------------------------------------------

    def prepare(self):
        """At /health: the prepared data, from the run's own directory, the cache, or prepare-data let go.
        (exit status, failure) of what ran: (0, None) when the data is whole."""
        workload = self.workload
        if self.key_job is not None and not self.key_job.done.is_set():
            status, found = workload.follow(PREPARE, self.key_job)
            if status is None:
                return status, found
        if self.key_job is not None:
            self.key_job_done()
            found = self.look()  # prepare-data's warm process, unless the key hit
            if found:
                return None, found
        if PREPARE_JOB not in self.waiting and self.prepare_jobs is None:
            if prepared.complete(self.plan["prepared"]) and self.key_job is None:
                self.sup.log_marker("prepare-data: %s is complete, not run again" % self.plan["prepared"])
                self.mark("prepared_key", prepare="kept")
            return 0, None
        jobs = self.prepare_jobs
        if jobs is None:  # the model's server answered first: prepare-data renders through it
            self.mark("prepare_started", prepare="ran", render="the model's server")
            words = self.plan["prepare_argv"][3:] if self.prepare_via_render else None
            self.end_render()
            jobs = self.let_go(PREPARE, words)
            self.prepare_jobs = jobs
        steps = []
        try:
            status, found = workload.client_step(PREPARE, jobs, lambda processes: steps.append(
                PreparedStep(processes, self.plan["prepared"])) or steps[0])
        finally:
            self.end_render()
        self.mark("prepare_ended")
        if steps and steps[0].ending and status == 0:
            self.sup.log_marker("prepare-data: %s is whole; its process, still exiting, was ended"
                                % self.plan["prepared"])
        if status == 0 and not found and self.key_job is not None and self.key_job.outcome == MISS:
            self.sup.log_marker("prepare-data: %s" % self.key_job.publish())
        return status, found

    def generate(self):
        """Let generate-offline-data go: its jobs."""
        self.present_at_go = set(outputs.existing_indices(self.plan["out"]))
        jobs = self.let_go(GENERATE)
        self.mark("generate_released")
        return jobs

    def arrived(self):
        """While generate-offline-data runs: its first new file's time (when renamed into the output, its
        ctime), once there."""
        if self.present_at_go is None or "first_file" in self.times:
            return
        out = self.plan["out"]
        new = set(outputs.existing_indices(out)) - self.present_at_go
        times = []
        for index in new:
            try:
                times.append(os.stat(os.path.join(out, outputs.file_name(index))).st_ctime)
            except OSError:
                pass
        if times:
            self.mark("first_file", min(times))


def _read(path):
    try:
        with open(path) as handle:
            return round(float(handle.read().strip()), 3)
    except (OSError, ValueError):
        return None
