"""The collective probe (issue 38, point 3): an all-reduce across the GPUs a run will use, with the run's own
environment and the server's torch, under a timeout of seconds, before any model loads. Stdlib only: it starts
remote/gpus/collective_rank.py once per rank (each in a session of its own), reads the stage each rank says it
reached, keeps the time, and kills every rank at the end, whatever happened.

    probe(python, world, backend) -> {outcome, detail, ranks, seconds, env}

`outcome` is "ok", contract.COLLECTIVE_HANG (the ranks started but the collective did not complete within
`timeout_s`: each rank's last stage is named, and a stopped one as stopped), COLLECTIVE_ERROR (a rank exited, or
the sum came back wrong: its last line said) or NOT_STARTED (torch did not import within `start_timeout_s`).

Also a program, for one GPU host with nothing of specrig's but this folder and torch:

    python3 remote/gpus/collective.py --python "$(command -v python)" --world 1 --backend nccl
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

if __name__ == "__main__":  # a program: remote/ on the path, as a call has it
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from base.contract import COLLECTIVE_HANG

COLLECTIVE_ERROR = "collective-error"
NOT_STARTED = "collective-not-started"
RANK_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "collective_rank.py")
#: Seconds for the collective itself once every rank has torch: NCCL's set-up and one all-reduce take a few.
TIMEOUT_S = 30
#: Seconds for every rank to import torch and take its device (a cold network disk is slow).
START_TIMEOUT_S = 90
ELEMENTS = 1 << 20  # 4 MiB of float32: past NCCL's smallest protocol, over P2P where it is on
POLL_S = 0.05


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Rank:
    """One rank's process and the stages it said."""

    def __init__(self, rank, argv, env):
        self.rank, self.stages, self.said = rank, [], {}
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.stderr, stdin=subprocess.DEVNULL,
                                     env=env, text=True, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                said = json.loads(line)
            except ValueError:
                continue
            if isinstance(said, dict) and "stage" in said:
                self.said[said["stage"]] = said
                self.stages.append(said["stage"])

    @property
    def stage(self):
        return self.stages[-1] if self.stages else "not started"

    def last_error(self):
        self.stderr.seek(0)
        lines = [line.strip() for line in self.stderr.read().splitlines() if line.strip()]
        return lines[-1][:300] if lines else "no output"

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # SIGKILL ends a stopped process too
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.reader.join(timeout=2)
        self.stderr.close()


def _state(pid):
    """The state letter of `pid` in /proc (T: stopped), or None."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _where(rank):
    """'rank 1: joined, then stopped (SIGSTOP)'."""
    state = _state(rank.proc.pid) if rank.proc.poll() is None else None
    after = {"joined": "in the all-reduce", "reduced": "in the P2P copy", "imported": "joining the group"}
    words = "rank %d: %s" % (rank.rank, rank.stage)
    if state == "T":
        return words + ", then stopped (state T: SIGSTOP or a debugger)"
    if rank.proc.poll() is not None:
        return words + ", then exited with %s" % rank.proc.returncode
    return words + (", waiting %s" % after[rank.stage] if rank.stage in after else "")


def probe(python, world, backend, env=None, timeout_s=TIMEOUT_S, start_timeout_s=START_TIMEOUT_S, p2p=False,
          elements=ELEMENTS, stop_rank=None):
    """One all-reduce over `world` ranks of `backend` ("nccl": rank r on GPU r of those visible; "gloo": the CPU)
    with `python` (the run's torch) and `env` (default: this process's). `stop_rank`: that rank stops itself
    (SIGSTOP) before the all-reduce: a test's hang."""
    port, started = free_port(), time.monotonic()
    env = dict(os.environ if env is None else env)
    ranks = []
    for rank in range(world):
        args = {"rank": rank, "world": world, "backend": backend, "port": port, "elements": elements, "p2p": p2p,
                "timeout_s": max(600, 10 * timeout_s)}
        if stop_rank is not None:
            args.update(stop_before="all-reduce", stop_rank=stop_rank)
        ranks.append(_Rank(rank, [python, RANK_PROGRAM, json.dumps(args)], env))
    try:
        return _watch(ranks, started, timeout_s, start_timeout_s, p2p)
    finally:
        for rank in ranks:
            rank.kill()


def _result(outcome, detail, ranks, started):
    return {"outcome": outcome, "detail": detail, "seconds": round(time.monotonic() - started, 1),
            "ranks": [{"rank": r.rank, "stages": list(r.stages)} for r in ranks],
            "torch": next((r.said["imported"].get("torch") for r in ranks if "imported" in r.said), None),
            "nccl": next((r.said["imported"].get("nccl") for r in ranks if "imported" in r.said), None)}


def _watch(ranks, started, timeout_s, start_timeout_s, p2p):
    ready_at = None
    while True:
        now = time.monotonic()
        if all("done" in r.said for r in ranks):
            break
        failed = [r for r in ranks if r.proc.poll() is not None and "done" not in r.said]
        if failed:
            first = failed[0]
            kind = NOT_STARTED if "imported" not in first.said else COLLECTIVE_ERROR
            return _result(kind, "%s: %s" % (_where(first), first.last_error()), ranks, started)
        wrong = [r for r in ranks for stage in ("reduced", "p2p") if r.said.get(stage, {}).get("ok") is False]
        if wrong:
            said = wrong[0].said
            stage = "p2p" if said.get("p2p", {}).get("ok") is False else "reduced"
            return _result(COLLECTIVE_ERROR, "rank %d: wrong values after the %s (%s)" % (
                wrong[0].rank, "P2P copy" if stage == "p2p" else "all-reduce", json.dumps(said[stage])), ranks, started)
        if ready_at is None and all("imported" in r.said for r in ranks):
            ready_at = now
        if ready_at is None and now - started > start_timeout_s:
            slow = [r for r in ranks if "imported" not in r.said]
            return _result(NOT_STARTED, "torch not imported within %d s: %s" % (
                start_timeout_s, "; ".join(_where(r) for r in slow)), ranks, started)
        if ready_at is not None and now - ready_at > timeout_s:
            stuck = "; ".join(_where(r) for r in ranks)
            return _result(COLLECTIVE_HANG, "no all-reduce%s within %d s of the ranks' start: %s" % (
                " and P2P copy" if p2p else "", timeout_s, stuck), ranks, started)
        time.sleep(POLL_S)
    said = ranks[0].said
    detail = "all-reduce of %d ranks in %.1f s" % (len(ranks), time.monotonic() - (ready_at or started))
    if p2p and "p2p" in said:
        detail += "; P2P copies to the next GPU right (peer access %s)" % (
            "on" if all(r.said["p2p"].get("access") for r in ranks) else "off for some: through host memory")
    return _result("ok", detail, ranks, started)


def main(argv):
    import argparse

    parser = argparse.ArgumentParser(description="the collective probe: one all-reduce, watched")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torch runs the ranks")
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S)
    parser.add_argument("--p2p", action="store_true", help="also copy a tensor to the next rank's GPU")
    given = parser.parse_args(argv)
    found = probe(given.python, given.world, given.backend, timeout_s=given.timeout, p2p=given.p2p)
    print(json.dumps(found))
    return 0 if found["outcome"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
