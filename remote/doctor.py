"""What the host is: shell, Python, installed packages, GPUs, free disk.

A host may hold two environments: speculators' (the host's `python`, which runs this call) and the
vLLM server's (`server_python` in hosts.yaml). The second is read by this very file run as a
program with that interpreter, in a process of its own (`<server_python> doctor.py`): it prints
one JSON line, the environment's Python and package versions, read from metadata (nothing imported).
"""
import json
import os
import platform
import pwd
import shutil
import subprocess
import sys

import pkgmeta
import telemetry

#: Read in speculators' environment (the host's `python`).
PACKAGES = ("speculators", "vllm", "torch", "transformers", "hs-connectors")
#: Read in the vLLM server's environment (`server_python`), when it is another one.
SERVER_PACKAGES = ("vllm", "torch", "transformers", "hs-connectors")
#: Starting an interpreter from a cold network disk can take a while; the laptop gives doctor 60 s.
SERVER_TIMEOUT_S = 30


def _existing_parent(path):
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def environment(packages):
    """This interpreter's environment: {executable, version, prefix, packages: {name: version or None}}."""
    return {"executable": sys.executable, "version": platform.python_version(), "prefix": sys.prefix,
            "packages": pkgmeta.versions(packages)}


def _resolve(python):
    """`python` as hosts.yaml gives it (`~/x`, a name on PATH, a path) as a path, or None if not found."""
    python = os.path.expanduser(python)
    if os.sep not in python:
        return shutil.which(python)
    return os.path.abspath(python)


def server_environment(python, timeout=SERVER_TIMEOUT_S):
    """The server's environment (`python`, run in a process of its own), or None when it is this one.

    {"python": as given, executable, version, prefix, packages, "error": None or why it could not be read}
    """
    found = _resolve(python)
    if found and found == os.path.abspath(sys.executable):
        return None
    failed = {"python": python, "executable": found, "version": None, "prefix": None,
              "packages": dict.fromkeys(SERVER_PACKAGES)}
    if not found or not os.path.isfile(found):
        return dict(failed, error="%s: not found" % python)
    try:
        proc = subprocess.run([found, os.path.abspath(__file__)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return dict(failed, error="%s did not answer within %d s" % (python, timeout))
    except OSError as exc:
        return dict(failed, error="cannot run %s: %s" % (python, exc.strerror or exc))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        return dict(failed, error="%s exited with %s: %s" % (python, proc.returncode,
                                                            said[-1] if said else "no output"))
    return dict(json.loads(lines[-1]), python=python, error=None)


def run(args):
    """{"workdir", "server_python" (optional: read that environment too), "versions_only" (optional:
    the Pythons and packages alone, for a task's cheap check before it starts anything)}."""
    facts = {"python": {key: value for key, value in environment(()).items() if key != "packages"},
             "packages": pkgmeta.versions(PACKAGES)}
    facts["server_env"] = server_environment(args["server_python"]) if args.get("server_python") else None
    if args.get("versions_only"):
        return facts
    workdir = os.path.expanduser(args.get("workdir") or "~")
    usage = shutil.disk_usage(_existing_parent(workdir))
    facts.update({
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "hostname": platform.node(),
        "login_shell": pwd.getpwuid(os.getuid()).pw_shell,
        "gpu": telemetry.gpus(),
        "disk": {"path": workdir, "exists": os.path.isdir(workdir), "free_bytes": usage.free,
                 "total_bytes": usage.total},
    })
    return facts


if __name__ == "__main__":
    # `<server_python> doctor.py`: the environment of that interpreter, as one JSON line.
    print(json.dumps(environment(SERVER_PACKAGES)))
