"""Whether a job of hosts.yaml's `slurm:` settings could ever run on the cluster, checked before anything
is submitted: the partition exists, enough of its nodes hold the gres asked for, the time fits its limit.

Data in (the settings, cluster.partitions()), problems out: nothing is asked of Slurm here. "Ever": a
busy cluster is no problem (the job waits); a request no node of the partition can hold is one, since
Slurm would queue it anyway, pending forever (the lab's Slurm does, with reason PartitionTimeLimit).
"""
from slurm import formats

#: The checks, as each problem names them.
PARTITION, GRES, NODES, TIME = "partition", "gres", "nodes", "time"


def problems(settings, partitions):
    """[{check, partition, message, fix}]: empty when one of the partitions the settings name (Slurm
    takes the first that can run the job), or else the cluster's default one, could run it; otherwise
    every problem of each of them."""
    by_name = {partition["name"]: partition for partition in partitions}
    known = ", ".join(sorted(by_name)) or "none"
    wanted = settings["partition"].split(",") if settings.get("partition") else [
        partition["name"] for partition in partitions if partition["default"]]
    if not wanted:
        return [_problem(PARTITION, None, "hosts.yaml names no partition and the cluster has no default one",
                         "set slurm.partition to one of: %s" % known)]
    found = []
    for name in wanted:
        partition = by_name.get(name)
        if partition is None:
            found.append(_problem(PARTITION, name, "the cluster has no partition %r" % name,
                                  "set slurm.partition to one of: %s" % known))
            continue
        own = fit(settings, partition)
        if not own:
            return []
        found.extend(own)
    return found


def fit(settings, partition):
    """The problems of running the settings' job on `partition`: [] when it fits."""
    found = []
    name = partition["name"]
    needed = settings.get("nodes") or 1
    holding = nodes_holding(partition, settings.get("gres"))
    if settings.get("gres") and holding == 0:
        has = ", ".join(kind["gres"] for kind in partition["node_kinds"])
        found.append(_problem(GRES, name, "no node of partition %r has gres %r (its nodes have: %s)"
                              % (name, settings["gres"], has), "ask for what a node has in slurm.gres"))
    elif holding < needed:
        which = " with gres %s" % settings["gres"] if settings.get("gres") else ""
        found.append(_problem(NODES, name, "slurm.nodes is %d, and partition %r has %d node(s)%s"
                              % (needed, name, holding, which), "set slurm.nodes to at most %d" % holding))
    asked = formats.seconds(settings["time"]) if settings.get("time") is not None else None
    limit = partition.get("time_limit_s")
    if asked is not None and limit is not None and asked > limit:
        found.append(_problem(TIME, name, "slurm.time %s is over the limit of partition %r, %s"
                              % (settings["time"], name, partition["time_limit"]),
                              "set slurm.time to at most %s, or a partition with a longer limit" % partition["time_limit"]))
    return found


def nodes_holding(partition, gres):
    """How many of the partition's nodes hold `gres` (a request's text; None: every node)."""
    requested = formats.gres(gres) if gres else []
    return sum(kind["nodes"] for kind in partition["node_kinds"] if holds(_node_gres(kind["gres"]), requested))


def holds(has, requested):
    """Whether a node with gres `has` ([(name, type, count)]) can hold `requested`: of each name (and
    type, when the request names one) at least as many."""
    for name, kind, count in requested:
        available = sum(number for own, own_kind, number in has if own == name and kind in (None, own_kind))
        if available < count:
            return False
    return True


def _node_gres(text):
    try:
        return formats.gres(text)
    except ValueError:
        return []  # a gres sinfo writes in a way we do not read: the node counts as holding none


def _problem(check, partition, message, fix):
    return {"check": check, "partition": partition, "message": message, "fix": fix}
