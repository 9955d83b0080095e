"""What the device scripts (gpu_check.py, gpu_check_tp.py) share: specrig's host code called as
`--host local` calls it (`remote/entry.py <call.json>`), on machines without specrig's laptop
dependencies (fabric, invoke), plus waiting and nvidia-smi captures."""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "remote"))
from base.contract import SENTINEL  # remote/ is stdlib only


def call(command, args, timeout=240, env=None):
    """One call through remote/entry.py: the result dict, or RuntimeError with the host's error."""
    handle, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(handle, "w") as out:
        json.dump({"command": command, "args": args, "env": env or {}, "timeout_s": timeout}, out)
    proc = subprocess.run([sys.executable, str(REPO / "remote" / "entry.py"), path], capture_output=True,
                          text=True, start_new_session=True, timeout=timeout + 10)
    if os.path.exists(path):
        os.unlink(path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(SENTINEL)]
    if not lines:
        raise RuntimeError("%s: no result (exit %s): %s" % (command, proc.returncode, proc.stderr[-2000:]))
    reply = json.loads(lines[-1][len(SENTINEL):])
    if not reply["ok"]:
        raise RuntimeError("%s failed: %s" % (command, reply["error"]))
    return reply["result"]


def wait_for(what, predicate, timeout=240):
    """The first truthy value of predicate(), polled each second; RuntimeError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise RuntimeError("timed out waiting for " + what)


def nvidia_smi(*query):
    try:
        return subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "nvidia-smi: %s\n" % exc
