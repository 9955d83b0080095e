"""A multi-node job's nodes, once Slurm has allocated them (stdlib only): `python slurm_allocation.py RUN... NODE...`,
run by the job's script (slurm/jobs.py node_steps) before any supervisor starts.

The first half of the arguments are the job's runs by node rank, the second the allocation's nodes in
`scontrol show hostnames` order (the head, where the script runs, first). Each run's part of the job
(run.json `nodes`: hosts, addresses, master_addr) is made from them and its server's command made again
with it (place()), as a resume makes it; each node's address is printed, one a line, by rank,
for the script's VLLM_HOST_IP. At submission the nodes are not known yet: the runs hold placeholders.
"""
import ipaddress
import os
import socket
import sys

# Started by path, so sys.path[0] is remote/slurm/: make it remote/, as supervisor.py does.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from base import atomic, rundir
from base.slurm_queries import SlurmError, slurm_output
from run.server import plan


def place(run, *, hosts, addresses):
    """Node `run` of a multi-node job in a Slurm allocation, at its job's start: its part of the job made
    from the allocation's nodes (`hosts`, `addresses`, the head first), and its server's command made
    again with them, as run/launching.py resume() makes it."""
    record = run.record
    record["nodes"].update(hosts=list(hosts), addresses=list(addresses), master_addr=addresses[0])
    record["server"] = plan.of_run(run.path, run.run_id, record["driver_args"], client_python=sys.executable,
                                   server_python=record.get("server_python"), nodes=record["nodes"])
    atomic.write_json(run.file("run.json"), record)


def addresses(nodes):
    """Each node's address as Slurm reaches it (NodeAddr, resolved where it is a name), by `nodes`' order."""
    text = slurm_output(["scontrol", "show", "node", "-o", ",".join(nodes)])
    found = {}
    for line in text.splitlines():
        words = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if "NodeName" in words:
            found[words["NodeName"]] = words.get("NodeAddr") or words["NodeName"]
    missing = [node for node in nodes if node not in found]
    if missing:
        raise SlurmError("scontrol show node says nothing of %s" % ", ".join(missing))
    return [address_of(found[node]) for node in nodes]


def address_of(name):
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return socket.gethostbyname(name)


def main(argv):
    half = len(argv) // 2
    if half < 2 or len(argv) != 2 * half:
        sys.stderr.write("usage: slurm_allocation.py RUN... NODE... (as many nodes as runs, two or more)\n")
        return 2
    runs, nodes = argv[:half], argv[half:]
    try:
        found = addresses(nodes)
    except (SlurmError, OSError) as failure:
        sys.stderr.write("the allocation's addresses: %s\n" % failure)
        return 1
    for path in runs:
        place(rundir.RunDir(os.path.abspath(path)), hosts=nodes, addresses=found)
    sys.stdout.write("".join(address + "\n" for address in found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
