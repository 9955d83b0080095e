"""A small real job for process-mechanics tests: a parent that beats and children that hold on.

    python job_tree.py <args.json>        the parent (the driver's argv and heartbeat contract)
    python job_tree.py --child I GIB IGNORE_TERM OWN_SESSION

args.json: {"heartbeat": path, "children": int, "gpu_gib": float (0: no GPU), "ignore_term": bool,
            "own_session": bool, "samples": int, "stall_after": int|null, "say_on_stall": str|null,
            "output_dir": path, "write_samples": bool, "sample_bytes": int, "fail_after": int|null,
            "fail_with": str}.
Each child allocates `gpu_gib` GiB on GPU I (torch) when asked, like
vLLM's tensor-parallel workers, which hold GPU memory while the parent does not; one child ignores
SIGTERM when `ignore_term` is set, so that a stop needs SIGKILL; child 1 calls setsid() when
`own_session` is set. The parent counts one "sample" a
second into the heartbeat and, once every child is set up, writes their pids to <heartbeat>.children.
With `write_samples` each sample is also a file, output_dir/data_{i}.pt of `sample_bytes` (default: a
few), numbered on from those already there (as the driver resumes). With `fail_after` the parent raises RuntimeError(fail_with,
its pid) after that many samples of the attempt: the same failure in every attempt.
"""
import json
import os
import signal
import subprocess
import sys
import time


def child(index, gib, ignore_term, own_session):
    if own_session:
        os.setsid()  # leaves the job's session and process group, as a daemonizing worker would
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if gib:
        import torch

        held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda:%d" % index)
        held.fill_(1)
        torch.cuda.synchronize(index)
    # The parent lists the children only once each is set up (handler installed, memory held).
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        time.sleep(1)


def parent(path):
    with open(path) as handle:
        args = json.load(handle)
    kids = [subprocess.Popen([sys.executable, __file__, "--child", str(i), str(args.get("gpu_gib", 0)),
                              "1" if args.get("ignore_term") and i == 0 else "0",
                              "1" if args.get("own_session") and i == 1 else "0"], stdout=subprocess.PIPE)
            for i in range(args.get("children", 2))]
    for kid in kids:
        kid.stdout.readline()
    with open(args["heartbeat"] + ".children", "w") as handle:
        json.dump([kid.pid for kid in kids], handle)
    total, done = args.get("samples", 10**6), 0
    while done < total:
        if done == args.get("fail_after"):
            for kid in kids:
                kid.kill()
            raise RuntimeError("%s (pid %d)" % (args.get("fail_with") or "failed", os.getpid()))
        if done == args.get("stall_after"):
            # Stuck: alive, heartbeat rewritten, no progress (a hung collective, a prompt waiting on stdin).
            sys.stdout.write(args.get("say_on_stall") or "")
            sys.stdout.flush()
            while True:
                write_beat(args["heartbeat"], done, total)
                time.sleep(1)
        write_beat(args["heartbeat"], done, total)
        time.sleep(1)
        if args.get("write_samples"):
            write_sample(args["output_dir"], args.get("sample_bytes", 0))
        done += 1
    for kid in kids:
        kid.kill()
    return 0


def write_sample(output_dir, size):
    """The next data_{i}.pt, written to a temporary name and renamed into place as the driver does."""
    os.makedirs(output_dir, exist_ok=True)
    index = sum(1 for name in os.listdir(output_dir) if name.startswith("data_") and name.endswith(".pt"))
    path = os.path.join(output_dir, "data_%d.pt" % index)
    with open(path + ".tmp", "wb") as handle:
        handle.write((b"sample %d" % index).ljust(size, b"."))
    os.replace(path + ".tmp", path)


def write_beat(path, done, total):
    beat = {"phase": "extracting", "samples_done": done, "samples_total": total, "tokens_per_s": None,
            "eta_s": total - done, "last_error": None, "updated_at": time.time(), "pid": os.getpid()}
    with open(path + ".tmp", "w") as handle:
        json.dump(beat, handle)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1", sys.argv[5] == "1")
    sys.exit(parent(sys.argv[1]))
