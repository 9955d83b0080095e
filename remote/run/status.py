"""The `runs.status` and `runs.logs` remote commands: the runs under a workdir and how each is doing,
read from their files alone (stdlib only).

    runs.status   {"workdir", "run": id|null, "lines": int}
                                                  null: every run; a run: its summary and the
                                                  tail of its driver.log
    runs.logs     {"workdir", "run": id|null, "offset": int|null, "lines": int,
                   "log": "driver"|"server"}      driver.log: the driver, or speculators' CLI steps;
                                                  server.log: the vLLM server

`run` is a run id, a sharded-run id or a multi-node job's id (rundir.find_run).
"""
import os

from base import rundir
from base.failure import RemoteFailure

LOG_LINES = 50
#: The logs a run keeps, by the name `logs` takes.
LOGS = {"driver": "driver.log", "server": "server.log"}


def status(args):
    workdir = rundir.workdir_of(args)
    if args.get("run"):
        run = rundir.find_run(workdir, args["run"])
        return {"runs": [_summary(run)], "log_tail": _tail(run.file("driver.log"), args.get("lines") or 10)}
    return {"runs": [_summary(run) for run in rundir.all_runs(workdir)]}


def _summary(run):
    return dict(run.summary(), shard=run.record.get("shard"), nodes=run.record.get("nodes"))


def logs(args):
    """The last `lines` lines, or (with `offset`) everything written since that byte offset."""
    workdir = rundir.workdir_of(args)
    run = rundir.find_run(workdir, args.get("run"))
    path = _log_path(run, args.get("log"))
    size = os.path.getsize(path) if os.path.exists(path) else 0
    offset = args.get("offset")
    if offset is None:
        text = _tail(path, args.get("lines") or LOG_LINES, exact=True)
    else:
        with open(path, "rb") as handle:
            handle.seek(min(offset, size))
            text = handle.read(4 * 1024 * 1024).decode(errors="replace")
            size = handle.tell()
    return {"run_id": run.run_id, "text": text, "offset": size, "state": run.state()}


def _log_path(run, name):
    if (name or "driver") not in LOGS:
        raise RemoteFailure("bad-argument", "unknown log %r; known: %s" % (name, ", ".join(LOGS)))
    return run.file(LOGS[name or "driver"])


def _tail(path, lines, exact=False):
    """The last `lines` lines, without the last line end. `exact` (`logs`, whose text `inv logs --raw`
    shows as it is): lines end at line feeds alone, and the text is the file's; else every line
    boundary of str.splitlines (a progress bar's carriage returns) ends one (status's log tail)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - 256 * 1024))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    if not exact:
        return "\n".join(text.splitlines()[-lines:])
    found = text.split("\n")
    if found[-1] == "":
        found.pop()
    return "\n".join(found[-lines:])
