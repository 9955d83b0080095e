"""A wall-clock stack sampler for every Python process of a profiled arm (benchmarks/gpu/profiling.py).

On the PYTHONPATH of an arm's processes (the API server, the EngineCore vLLM spawns, the client), it
does nothing unless GPU_PROFILE_DIR is set. Then a daemon thread waits for `<dir>/on`, samples every
thread's stack (sys._current_frames) about 100 times a second until `<dir>/off`, and writes the counts
as collapsed stacks, `<thread name>;<frame>;<frame>... <count>`, to `<dir>/stacks-<pid>-<comm>.txt`,
after a line that maps the threads' native ids (/proc's tids) to their names.

It needs no ptrace (py-spy does, and a container may not allow it). It samples only when it holds the
GIL, so a thread that keeps the GIL in C code shows at its next release; /proc's per-thread CPU times
(profiling.py) say which threads were busy.
"""
import collections
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("GPU_PROFILE_DIR")
_PERIOD_S = 0.01


def _frames(frame):
    names = []
    while frame is not None:
        code = frame.f_code
        names.append("%s (%s:%d)" % (code.co_name, os.path.basename(code.co_filename), frame.f_lineno))
        frame = frame.f_back
    return ";".join(reversed(names))


def _sample():
    on, off = os.path.join(_DIR, "on"), os.path.join(_DIR, "off")
    while not os.path.exists(on):
        if os.path.exists(off):
            return
        time.sleep(0.2)
    me, counts, native = threading.get_ident(), collections.Counter(), {}
    while not os.path.exists(off):
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        native.update((thread.native_id, thread.name) for thread in threading.enumerate())
        for ident, frame in sys._current_frames().items():
            if ident != me:
                counts["%s;%s" % (names.get(ident, "thread-%d" % ident), _frames(frame))] += 1
        time.sleep(_PERIOD_S)
    try:
        with open("/proc/self/comm") as f:
            comm = f.read().strip().replace("/", "_").replace(" ", "_")
    except OSError:
        comm = "python"
    path = os.path.join(_DIR, "stacks-%d-%s.txt" % (os.getpid(), comm))
    with open(path, "w") as out:
        out.write("# %s\n" % " ".join(sys.argv)[:500])
        out.write("# threads %s\n" % json.dumps(native))
        for stack, n in counts.most_common():
            out.write("%s %d\n" % (stack.replace(" ", "_"), n))


if _DIR:
    threading.Thread(target=_sample, name="gpu-profile-sampler", daemon=True).start()
