"""One of speculators' CLI steps, started warm: its imports done before it is let go.

    <python> warm_start.py GO_FILE -m speculators STEP [ARGS...]

Runs in the client's environment (hosts.yaml `python`), as the step would. It imports speculators' CLI
(typer, torch, transformers, datasets, openai: most of a step's start-up, about 15 s on the H200 host of
issue 26), writes GO_FILE.ready, then waits for GO_FILE: the supervisor creates it when the step's input is
there (server/warm_steps.py: prepare-data at the server's /health, generate-offline-data once the prepared
data is whole). Then it runs `-m speculators STEP ARGS` as `python -m` does (runpy, the same sys.argv), and
exits as the step exits. A go file that is not empty holds the step and arguments to run instead, as JSON
(prepare-data started to render through the render server, let go to render through the model's server). Its supervisor gone before the go (another parent), it exits 1 without running.
"""
import json
import os
import runpy
import sys
import time

#: Seconds between looks for the go file: a stat, cheap enough, and no later than this after the go.
POLL_S = 0.02
MARK = "[specrig-warm-start]"


def main(argv):
    if len(argv) < 5 or argv[2] != "-m":
        sys.stderr.write("usage: warm_start.py GO_FILE -m MODULE STEP [ARGS...]\n")
        return 2
    go, module, words = argv[1], argv[3], argv[4:]
    # As `python -m` has it: the working directory first on the path, not this program's directory (whose
    # modules are specrig's, named like others': client, plan, health).
    sys.path[0] = os.getcwd()
    parent, began = os.getppid(), time.monotonic()
    try:
        __import__(module + ".cli")
    except Exception:
        # In one write, not as the interpreter prints a traceback (in pieces: "ModuleNotFoundError", ": ", the
        # message): the other step's warm process, started beside this one from the same environment, fails
        # the same way at the same moment into the same log, and two tracebacks interleaved within their lines
        # cannot be classified (the run would end `unknown`, not `missing-package`).
        import traceback

        os.write(2, traceback.format_exc().encode("utf-8", "replace"))
        return 1
    imported = time.monotonic()
    with open(go + ".ready", "w") as ready:
        ready.write("%.3f\n" % (imported - began))
    print("%s %s %s: imported in %.1f s, waiting for the go" % (MARK, module, words[0], imported - began), flush=True)
    while not os.path.exists(go):
        if os.getppid() != parent:
            print("%s the supervisor is gone: not running %s" % (MARK, words[0]), flush=True)
            return 1
        time.sleep(POLL_S)
    with open(go) as handle:  # written whole (renamed into place) by the supervisor
        instead = handle.read().strip()
    if instead:
        words = json.loads(instead)
        print("%s %s: let go with other arguments: %s" % (MARK, words[0], " ".join(words[1:])), flush=True)
    sys.argv = [module] + words
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
