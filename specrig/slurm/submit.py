"""`inv extract` on a Slurm cluster's login node: what is refused before anything is submitted.

The login node checks (remote/slurm/jobs.py: check) that a job of hosts.yaml's `slurm:` could ever run
there (remote/slurm/partition_fit.py: the partition, the gres and node count, the time limit) and that
the run's directory and output are on a filesystem the compute nodes see. A request that could never
run is bad input, as Slurm would queue it and leave it pending forever: one line, exit 2, nothing queued.
"""
from __future__ import annotations

from collections.abc import Sequence

from specrig.contract import SLURM
from specrig.errors import CouldNotCheck, UsageError
from specrig.inventory import Host
from specrig.transport import Remote

#: The login node's checks: sinfo, and a one-task job per local filesystem (remote/slurm/cluster.py, 40 s each).
CHECK_TIMEOUT_S = 150


def slurm_settings(host: Host) -> dict | None:
    """The host's `slurm:` settings when it is a Slurm login node (its runs are jobs), else None."""
    return host.slurm if host.scheduler == SLURM else None


def refuse_nodes(host: Host) -> None:
    """A run on one node: `slurm.nodes` above 1 would hold nodes the supervisor never uses."""
    nodes = host.slurm.get("nodes") or 1
    if nodes > 1:
        raise UsageError(f"hosts.{host.name}.slurm.nodes is {nodes!r}, and `inv extract` without --nodes runs on "
                         f"one node", hint="set slurm.nodes to 1 (`inv extract --nodes dp|tp-pp` is the job that uses "
                                           "several nodes: docs/slurm.md)")


def refuse_slurm_hosts(hosts: Sequence[Host], what: str) -> None:
    """Sharded runs and multi-node jobs over SSH start supervisors on the hosts themselves: never on a
    cluster's login node (one login node's multi-node job is one Slurm job: specrig/run/slurm_node_job.py)."""
    for host in hosts:
        if slurm_settings(host) is not None:
            raise UsageError(f"{what} on {host.name!r}, a Slurm login node, is not built yet",
                             hint=f"`inv extract --host {host.name}` submits one job (docs/slurm.md)")


def refuse_impossible(remote: Remote, host: Host, *, paths: Sequence[str]) -> dict:
    """The login node's checks of the job before it is submitted (see the module): UsageError naming
    the first reason it could never run; what they found when it could."""
    found = remote.call("slurm.check", {"settings": host.slurm, "paths": list(paths)}, timeout=CHECK_TIMEOUT_S)
    if found["partitions_error"]:
        raise CouldNotCheck(f"{host.name}: Slurm's partitions could not be read: {found['partitions_error']}",
                            hint=f"`inv doctor --host {host.name}` shows the cluster")
    problems = found["problems"]
    if problems:
        raise UsageError(f"{host.name}: this Slurm job could never run: "
                         + "; ".join(problem["message"] for problem in problems) + "; nothing was queued",
                         hint="; ".join(dict.fromkeys(problem["fix"] for problem in problems)))
    for path in found["shared"]:
        if path["shared"] is False:
            raise UsageError(f"{host.name}: {path['path']!r} is not on a filesystem the compute nodes see "
                             f"({path['detail']}); nothing was queued",
                             hint="put hosts.yaml's workdir and --out on the cluster's shared filesystem")
    return found
