"""A diagnostic probe of the remote primitive itself: echo, wait, fail on request.

`inv doctor` and the test-suite use it to show that arguments arrive
byte-exact, that deadlines end the remote process, and that failures come back typed.
"""
import os
import time

from base.failure import RemoteFailure


def run(args):
    if args.get("fail"):
        raise ValueError(args["fail"])
    if args.get("refuse"):
        raise RemoteFailure("refused", args["refuse"])
    if args.get("sleep"):
        # Record our pid first, so a test can check the deadline really ended this process.
        if args.get("pid_file"):
            with open(os.path.expanduser(args["pid_file"]), "w") as handle:
                handle.write(str(os.getpid()))
        time.sleep(float(args["sleep"]))
    return {"echo": args.get("echo"), "pid": os.getpid()}
