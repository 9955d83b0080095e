"""The output's files checked as they arrive while generate-offline-data runs (stdlib only): ArrivalCheck,
a thread of the supervisor's server-mode workload (server/workload.py), so that the check at the end reads
nothing again."""
import concurrent.futures
import multiprocessing
import os
import threading

from base import outputs

#: Seconds between counts of the output directory.
COUNT_EVERY_S = 2.0
#: Processes checking the files as they arrive: the NaN/Inf scan reads about 1 GB/s on one core, and an 8B
#: model's client landed files at 1.4-1.5 GB/s on an H200 (issue 19, run 2: 5 s of them were left for the
#: end). A quarter of the host's cores, 4 at most, keep up without taking the server's; on a small host
#: one thread of the supervisor does it.
CHECK_WORKERS = max(1, min(4, (os.cpu_count() or 1) // 4))


class ArrivalCheck:
    """While generate-offline-data runs, a thread checks each file of the share once it is in the output
    (speculators' client moves it there whole), on CHECK_WORKERS processes where the host has the cores;
    after the client's exit 0, finish() checks what is left on all of them at once, so that the check at
    the end (validate) reads nothing again."""

    def __init__(self, workload, wanted, workers=CHECK_WORKERS):
        self.workload, self.wanted, self.workers = workload, wanted, workers
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.follow, name="arrival-check", daemon=True)
        self.pool = None

    def __enter__(self):
        if self.workers > 1:
            # spawn, not fork: the supervisor has threads of its own.
            self.pool = concurrent.futures.ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"))
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)  # a stop or a failure waits for no backlog
        self.thread.join()
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def follow(self):
        while not self.done.wait(COUNT_EVERY_S):
            self.check_arrived(interruptible=True)

    def finish(self):
        """The client exited 0: stop following, and check every file not yet known ok."""
        self.done.set()
        self.thread.join()
        self.check_arrived(interruptible=False)

    def check_arrived(self, *, interruptible):
        checked, out = self.workload.checked, self.workload.plan["out"]
        try:
            arrived = [i for i in outputs.existing_indices(out) if i in self.wanted and i not in checked.ok]
        except OSError:
            return
        files = [(index, os.path.join(out, outputs.file_name(index))) for index in arrived]
        checks = self.workload.file_checks()
        if self.pool is not None:
            checked.check_all(files, checks, self.pool)
            return
        for index, path in files:  # one by one: a stop or a failure is not kept waiting for a backlog
            if interruptible and self.done.is_set():
                return
            checked.check(index, path, **checks)
