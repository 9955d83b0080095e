"""The host half of the remote primitive: read the call, run it, print the result.

A call file holds {"command": str, "args": dict, "env": dict, "timeout_s": float|null}.
The command is a wire name of COMMANDS, which names the one function that runs it: f(args) -> dict.
The result is printed as one line, SENTINEL + JSON, so that whatever libraries
print to stdout before it does no harm.
"""
import _thread
import gc
import json
import os
import sys

from base.contract import SENTINEL
from base.failure import RemoteFailure

#: Every command a call may name (the wire name the laptop sends) and the function that runs it,
#: "module:function". One flat table, not a naming pattern and no second dispatch inside a module:
#: a call can reach these functions and nothing else.
COMMANDS = {
    "probe": "probe:run",                                   # the primitive's own diagnostics
    "doctor": "doctor.report:run",                              # what is on the host
    "verify": "drift.verify:run",                           # analyze: drift between the installed packages
    "patch.status": "patching.patch:status",                # patch: what is applied, pending, missing
    "patch.apply": "patching.patch:apply",                  # patch: apply (or dry-run) the patchset
    "patch.revert": "patching.patch:revert",                # patch: put the files back
    "preflight": "run.preflight:run",                       # run: the checks before a launch
    "node-preflight.facts": "run.server.node_preflight:facts",            # run: one node's facts
    "node-preflight.rendezvous": "run.server.node_preflight:rendezvous",  # run: the nodes reach each other
    "shared-token.write": "run.storage:write_token",     # run: is a path one storage for several hosts
    "shared-token.read": "run.storage:read_token",
    "shared-token.remove": "run.storage:remove_token",
    "smoke": "run.smoke:run",                               # run: the driver on a shrunk model
    "runs.launch": "run.launching:launch",                  # run: start a supervised run
    "runs.resume": "run.launching:resume",                  # run: start it again where it stopped
    "runs.status": "run.status:status",                     # run: every run, or one and its log's tail
    "runs.logs": "run.status:logs",
    "runs.stop": "run.stop:stop",                           # run: stop it, then check what is left
    "runs.verify-output": "run.output_check:verify_output",  # run: the run's output, each sample loaded
    "runs.submit-array": "slurm.submission:submit_array",   # run: a sharded run's tasks as one Slurm job array
    "runs.submit-nodes": "slurm.submission:submit_nodes",   # run: a multi-node job's runs as one Slurm job
    "slurm.check": "slurm.jobs:check_request",              # run: could a job of `slurm:` run, its paths shared
    "dataset.verify": "dataset.verify:verify",              # train: is an output trainable, and with which command
    "train.launch": "run.training.launch:launch",           # train: the trainer, supervised, on a verified dataset
    "accept.launch": "run.acceptance.launch:launch",        # train: a draft's acceptance in vLLM, against an untrained one
}
#: The deadline's timer thread may emit while the main thread does. A lock of `_thread`: `threading`
#: (and `signal`) are imported only by a call that arms a deadline.
_print_lock = _thread.allocate_lock()
_printed = False


def emit(payload):
    """Print the result line once; later calls (a racing deadline) are ignored."""
    global _printed
    with _print_lock:
        if _printed:
            return
        _printed = True
        sys.stdout.flush()
        sys.stdout.write("\n" + SENTINEL + " " + json.dumps(payload, default=str) + "\n")
        sys.stdout.flush()


def _arm_deadline(timeout_s):
    """End this process and everything it started once the deadline passes.

    A timer thread, not SIGALRM: it fires even while the main thread is stuck
    inside C code. The process group is killed because commands may have
    started children (nvidia-smi, pip) that would otherwise outlive the call.
    """
    import signal
    import threading

    def expire():
        emit({"ok": False, "error": {"kind": "timeout",
                                     "message": "remote command exceeded its %.0f s deadline" % timeout_s}})
        try:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            os._exit(124)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()


def load_call(path):
    with open(path, encoding="utf-8") as handle:
        call = json.load(handle)
    command = call.get("command")
    if not isinstance(command, str) or command not in COMMANDS:
        raise RemoteFailure("bad-call", "call file %s names no known command: %r (known: %s)"
                            % (path, command, ", ".join(sorted(COMMANDS))))
    return call


#: The name of specrig's cache directory on the host (~/.cache/specrig): its calls/ and bundles/.
CACHE_NAME = "specrig"


def private_cache(call_path):
    """Make specrig's cache directories on the host private (0700) when this call runs from them:
    calls/, bundles/, this bundle and the cache itself. New ones are 0700 already (created under
    `umask 077`); older specrig left them 0755. The call file itself is created 0600 by the command
    that writes it (specrig/transport). Nothing above the cache (~/.cache, the home) is touched:
    those are the user's."""
    calls = os.path.dirname(os.path.abspath(call_path))
    bundle = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # <cache>/bundles/<sha256>
    found = []
    if os.path.basename(calls) == "calls" and os.path.basename(os.path.dirname(calls)) == CACHE_NAME:
        found += [calls, os.path.dirname(calls)]
    bundles = os.path.dirname(bundle)
    if os.path.basename(bundles) == "bundles" and os.path.basename(os.path.dirname(bundles)) == CACHE_NAME:
        found += [bundle, bundles]
    for directory in found:
        try:
            if os.stat(directory).st_mode & 0o077:
                os.chmod(directory, 0o700)
        except OSError:
            pass  # not ours (another user's cache): nothing to tighten


def main(argv):
    if len(argv) != 1:
        emit({"ok": False, "error": {"kind": "bad-call", "message": "usage: entry.py <args.json>"}})
        sys.exit(2)
    path = argv[0]
    private_cache(path)
    try:
        call = load_call(path)
    except RemoteFailure as failure:
        emit({"ok": False, "error": failure.as_error()})
        sys.exit(2)
    finally:
        if os.path.basename(os.path.dirname(os.path.abspath(path))) == "calls":
            # Per-call argument files are single use; leave no litter on the host.
            try:
                os.unlink(path)
            except OSError:
                pass
    os.environ.update({str(k): str(v) for k, v in (call.get("env") or {}).items()})
    if call.get("timeout_s"):
        _arm_deadline(float(call["timeout_s"]))
    try:
        module_name, function = COMMANDS[call["command"]].split(":")
        gc.enable()  # off since entry.py's start
        __import__(module_name)  # importlib.import_module without importing importlib
        result = getattr(sys.modules[module_name], function)(call.get("args") or {})
    except RemoteFailure as failure:
        emit({"ok": False, "error": failure.as_error()})
        os._exit(3)
    except BaseException as exc:  # everything is reported, typed
        import traceback  # only now: a call that succeeds does not pay for its import

        emit({"ok": False, "error": {"kind": "script-error", "message": "%s: %s" % (type(exc).__name__, exc),
                                     "traceback": traceback.format_exc()}})
        os._exit(3)
    emit({"ok": True, "result": result})
    # os._exit: no interpreter teardown that could hang on a library's threads
    # (emit has flushed stdout already).
    os._exit(0)
