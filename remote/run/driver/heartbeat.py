"""The progress file the supervisor, `inv status` and the live view read (its keys: the
docstring of remote/run/extract_driver.py)."""
import json
import os
import threading
import time

from base import atomic
from base.contract import FAILED, PHASE_LOADING

HEARTBEAT_S = 2.0


class Heartbeat:
    """The progress file, rewritten by a thread every HEARTBEAT_S and at each phase change."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        # The thread's beats and the phase changes would share write_json's temporary name.
        self.writing = threading.Lock()
        self.state = {"phase": PHASE_LOADING, "samples_done": 0, "samples_total": None, "tokens_per_s": None,
                      "eta_s": None, "last_error": None, "pid": os.getpid()}
        self.started = None
        self.done_at_start = 0
        self.tokens = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def start(self):
        self.write()
        self.thread.start()

    def update(self, **fields):
        with self.lock:
            self.state.update(fields)
        if "phase" in fields:
            self._beat_now()

    def begin_extraction(self, done, total):
        with self.lock:
            self.started = time.time()
            self.done_at_start = done
            self.state.update(samples_done=done, samples_total=total)

    def sample_written(self, tokens):
        with self.lock:
            self.state["samples_done"] += 1
            self.tokens += tokens

    def snapshot(self):
        with self.lock:
            state = dict(self.state, updated_at=time.time())
            if self.started is not None:
                elapsed = max(time.time() - self.started, 1e-6)
                made = state["samples_done"] - self.done_at_start
                state["tokens_per_s"] = round(self.tokens / elapsed, 1)
                left = (state["samples_total"] or 0) - state["samples_done"]
                state["eta_s"] = round(left * elapsed / made, 1) if made else None
        return state

    def write(self):
        with self.writing:
            atomic.write_json(self.path, self.snapshot())

    def _beat(self):
        while not self.stopped.wait(HEARTBEAT_S):
            self._beat_now()

    def _beat_now(self):
        try:
            self.write()
        except OSError:
            pass  # a full disk shows up as a failed sample write; the next beat tries again

    def stop(self):
        """The last beat; none of the thread's lands after it."""
        self.stopped.set()
        self.thread.join()
        state = self.snapshot()
        try:
            atomic.write_json(self.path, state)
        except OSError:
            # A full disk has no block for write_json's temporary; rewritten in place, the file
            # takes back the block its truncation frees. Only this last beat risks a torn read.
            try:
                with open(self.path, "w", encoding="utf-8") as handle:
                    json.dump(state, handle)
            except OSError:
                pass  # stderr and the exit status still say how the run ended

    def fail(self, error):
        """The last beat, saying phase FAILED (the run state: the driver's last word) and `error`."""
        with self.lock:
            self.state.update(phase=FAILED, last_error=error)
        self.stop()
