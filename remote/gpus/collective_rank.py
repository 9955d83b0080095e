"""One rank of the collective probe: a program, `<python> collective_rank.py '<json>'`, started once per rank by
remote/gpus/collective.py in the run's environment (it imports torch). It says each stage it reaches as one JSON
line on stdout, so that the parent, which alone keeps time, can say where a rank stopped:

    starting -> imported (torch, the device set) -> joined (the process group) -> reduced (the all-reduce, its sum
    checked) -> p2p (with "p2p": a tensor copied to the next rank's GPU: the path vLLM's custom all-reduce takes)
    -> done

The JSON: {rank, world, backend ("nccl" on GPUs, "gloo" on the CPU), port (rank 0's TCP store on 127.0.0.1),
elements (float32 values reduced), p2p (bool), timeout_s (torch's own, longer than the parent's),
stop_before ("all-reduce": a test's stopped rank, which SIGSTOPs itself there; rank `stop_rank`)}.
"""
import datetime
import json
import os
import signal
import sys

# Its folder holds modules named like nothing of torch's, but a program imports from site-packages alone.
sys.path = [entry for entry in sys.path if os.path.abspath(entry or ".") != os.path.dirname(os.path.abspath(__file__))]


def main(args):
    rank, world, backend = args["rank"], args["world"], args["backend"]

    def say(stage, **extra):
        print(json.dumps(dict(extra, stage=stage, rank=rank)), flush=True)

    say("starting")
    import torch
    import torch.distributed as dist

    device = None
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    say("imported", torch=torch.__version__,
        nccl=".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None)
    dist.init_process_group(backend, init_method="tcp://127.0.0.1:%d" % args["port"], rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.get("timeout_s") or 600))
    say("joined")
    if args.get("stop_before") == "all-reduce" and args.get("stop_rank") == rank:
        os.kill(os.getpid(), signal.SIGSTOP)  # a test's hung rank: the others wait in the all-reduce
    values = torch.full((args.get("elements") or 1 << 20,), float(rank + 1), device=device)
    dist.all_reduce(values)
    if device is not None:
        torch.cuda.synchronize(device)
    expected = world * (world + 1) / 2.0
    say("reduced", ok=bool((values == expected).all().item()), value=float(values[0].item()), expected=expected)
    if args.get("p2p") and device is not None and world > 1:
        peer = (rank + 1) % world
        copied = torch.full((args.get("elements") or 1 << 20,), float(rank + 1), device=device).to(
            torch.device("cuda", peer))
        torch.cuda.synchronize(peer)
        say("p2p", peer=peer, access=bool(torch.cuda.can_device_access_peer(rank, peer)),
            ok=bool((copied == float(rank + 1)).all().item()))
    dist.destroy_process_group()
    say("done")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
