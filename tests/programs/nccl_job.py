"""A stand-in for a vLLM tensor-parallel job, shaped like vLLM's multiprocessing executor.

    python nccl_job.py <args.json>        the parent: the driver's argv and heartbeat contract
    python nccl_job.py --hold GPU GIB     another user's process: holds GIB GiB on cuda:GPU until killed
    python nccl_job.py --uuids            prints the UUIDs of the GPUs torch sees, cuda:0 first (JSON)

args.json: {"heartbeat": path, "output_dir": path, "workers": int|null (null: one per visible GPU; 2 on a
            host without one), "gpu_gib": float (each worker's allocation), "tensor_mib": float (the
            all-reduce's size), "samples": int (all-reduce rounds to do; default: no end)}.

The parent makes no CUDA context and holds no GPU memory. It spawns one worker per GPU
(multiprocessing, "spawn", daemon workers, as vLLM's MultiprocExecutor does); each worker joins a
torch.distributed group (NCCL; gloo where there is no GPU, for a dry run of the mechanics on CPU),
allocates `gpu_gib` GiB on its GPU and loops an all-reduce, checking the sum now and then. The
workers do not watch their parent: after a `kill -9` of the parent they go on, holding their
memory, as vLLM's workers stuck in a collective do. The parent writes the heartbeat the driver
writes: phase "loading" until every worker is in its loop, then "extracting" with `samples_done`
the all-reduce rounds every worker has done, and once, <heartbeat>.children with the workers' pids.
A worker that dies ends the parent with an error, as the executor does.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and its kin are forced here, whatever the caller set).
"""
import json
import os
import socket
import sys
import time

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)


def worker(rank, world, port, gib, tensor_mib, heartbeat):
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    held = None
    if gib and cuda:
        held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
        held.fill_(1)
    data = torch.empty(max(1, int(tensor_mib * 2**20) // 4), dtype=torch.float32, device=device)
    expected = world * (world + 1) / 2.0
    uuid = _uuid(torch, rank) if cuda else None
    rounds, wrong, last = 0, 0, 0.0
    while True:
        data.fill_(rank + 1)
        dist.all_reduce(data)
        if cuda:
            torch.cuda.synchronize(device)
        rounds += 1
        if time.monotonic() - last >= 0.5:
            last = time.monotonic()
            if data[0].item() != expected or data[-1].item() != expected:
                wrong += 1
            if rounds == 1 or wrong:
                sys.stdout.write("worker %d: pid %d, %s, %.1f GiB held, all-reduce of %.0f MiB: %s\n" % (
                    rank, os.getpid(), "GPU %s" % uuid if cuda else "CPU (gloo)",
                    held.numel() / 2**30 if held is not None else 0, tensor_mib,
                    "wrong sums %d" % wrong if wrong else "loop running"))
                sys.stdout.flush()
            _write(heartbeat + ".rank%d" % rank, {"rank": rank, "pid": os.getpid(), "uuid": uuid,
                                                    "held_gib": held.numel() / 2**30 if held is not None else 0,
                                                    "rounds": rounds, "wrong_sums": wrong,
                                                    "updated_at": time.time()})
        if not cuda:
            time.sleep(0.05)


def _uuid(torch, index):
    """cuda:index's UUID as nvidia-smi writes it (GPU-...)."""
    text = str(torch.cuda.get_device_properties(index).uuid)
    return text if text.startswith("GPU-") else "GPU-" + text


def _write(path, data):
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle)
    os.replace(path + ".tmp", path)


def _read(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def beat(path, phase, done, total, error=None):
    _write(path, {"phase": phase, "samples_done": done, "samples_total": total, "tokens_per_s": None,
                  "eta_s": None, "last_error": error, "updated_at": time.time(), "pid": os.getpid()})


def parent(path):
    import multiprocessing

    with open(path) as handle:
        args = json.load(handle)
    heartbeat = args["heartbeat"]
    total = args.get("samples") or 10**9
    beat(heartbeat, "loading", 0, total)
    world = args.get("workers")
    if not world:
        import torch  # device_count() asks NVML or the driver: no context is made

        world = torch.cuda.device_count() or 2
    for stale in range(world):
        try:
            os.unlink(heartbeat + ".rank%d" % stale)
        except FileNotFoundError:
            pass
    port = _free_port()
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=worker, name="worker-%d" % rank, daemon=True,
                               args=(rank, world, port, args.get("gpu_gib", 8), args.get("tensor_mib", 64),
                                     heartbeat))
               for rank in range(world)]
    for proc in workers:
        proc.start()
    sys.stdout.write("nccl_job parent %d: %d workers %s\n" % (os.getpid(), world, [p.pid for p in workers]))
    sys.stdout.flush()
    listed = False
    while True:
        dead = [proc for proc in workers if not proc.is_alive()]
        if dead:
            message = "worker %s (pid %d) died with exit code %s" % (dead[0].name, dead[0].pid, dead[0].exitcode)
            beat(heartbeat, "failed", 0, total, message)
            for proc in workers:
                if proc.is_alive():
                    proc.kill()
            raise RuntimeError(message)
        ranks = [_read(heartbeat + ".rank%d" % rank) for rank in range(world)]
        ready = all(r and r["pid"] == proc.pid and r["rounds"] > 0 for r, proc in zip(ranks, workers, strict=True))
        if ready and not listed:
            _write(heartbeat + ".children", [proc.pid for proc in workers])
            listed = True
        done = min(r["rounds"] for r in ranks) if ready else 0
        beat(heartbeat, "extracting" if ready else "loading", min(done, total), total)
        if done >= total:
            return 0
        time.sleep(1)


def hold(index, gib):
    import torch

    held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda:%d" % index)
    held.fill_(1)
    torch.cuda.synchronize(index)
    sys.stdout.write("held %s GiB on cuda:%d (%s), pid %d\n" % (gib, index, _uuid(torch, index), os.getpid()))
    sys.stdout.flush()
    while True:
        time.sleep(1)


def uuids():
    import torch

    sys.stdout.write(json.dumps([_uuid(torch, i) for i in range(torch.cuda.device_count())]) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--hold":
        hold(int(sys.argv[2]), float(sys.argv[3]))
    elif sys.argv[1] == "--uuids":
        sys.exit(uuids())
    sys.exit(parent(sys.argv[1]))
