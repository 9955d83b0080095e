"""How people see a Slurm login node's cluster in `inv doctor` (the facts remote/slurm/cluster.py
gathers): its version, whether the home is shared with the compute nodes, its partitions, the user's
jobs, and whether hosts.yaml's `slurm:` request could run there.
"""
from __future__ import annotations

from rich.table import Table

from specrig.ui import console
from specrig.ui.terminal import markup

#: How the home test's answer reads (remote/slurm/cluster.py: shared_home).
HOME_SHARED = {True: "[green]shared[/] with the compute nodes", False: "[red]not shared[/] with the compute nodes",
               None: "[yellow]unknown[/]"}


def show_cluster(slurm: dict) -> None:
    """A login node's cluster: its version, partitions, the user's jobs, whether its home is shared.
    Each part whose Slurm command failed is the command's own words instead."""
    errors = slurm.get("errors") or {}
    version = markup(slurm["version"]) if slurm.get("version") else f"[red]{markup(errors.get('version', '?'))}[/]"
    console.print(f"Slurm: {version}")
    home = slurm.get("shared_home")
    if home:
        console.print(f"home: {HOME_SHARED[home['shared']]} ({markup(home['detail'])})")
    for part, render in (("partitions", _partitions_table), ("jobs", _jobs_table)):
        if slurm.get(part) is not None:
            console.print(render(slurm[part]))
        elif part in errors:
            console.print(f"{part}: [red]{markup(errors[part])}[/]")
    problems = slurm.get("request_problems")
    if problems is not None:
        console.print("hosts.yaml's slurm: request: " + ("[green]could run here[/]" if not problems else
                                                          "[red]could never run here[/]"))
    for problem in problems or ():
        console.print(f"  {markup(problem['message'])}; {markup(problem['fix'])}")


def _partitions_table(partitions: list[dict]) -> Table:
    """A partition a row, in 80 columns: its GPUs per node (the gres texts when there are several kinds),
    nodes idle, allocated and in total, time limit; * marks the default."""
    table = Table(title="partitions", caption="* default partition", caption_justify="left")
    for column, justify in (("partition", "left"), ("state", "left"), ("GPU gres", "left"), ("idle", "right"),
                            ("alloc", "right"), ("total", "right"), ("time limit", "right")):
        table.add_column(column, justify=justify)
    for partition in partitions:
        nodes = partition["nodes"]
        table.add_row(markup(partition["name"]) + ("*" if partition["default"] else ""),
                      markup(partition["available"]), markup(_gres(partition["node_kinds"])),
                      str(nodes["idle"]), str(nodes["allocated"]), str(nodes["total"]),
                      markup(partition["time_limit"]))
    return table


def _gres(kinds: list[dict]) -> str:
    """A partition's gres: "gpu:8", or by node count where its nodes differ ("2×gpu:8, 1×none")."""
    names = [kind["gres"] if kind["gres"] not in ("(null)", "") else "none" for kind in kinds]
    if len(set(names)) <= 1:
        return names[0] if names else "none"
    return ", ".join(f"{kind['nodes']}×{name}" for kind, name in zip(kinds, names, strict=True))


def _jobs_table(jobs: list[dict]) -> Table | str:
    if not jobs:
        return "your jobs: none in the queue"
    table = Table(title="your jobs", caption="where: a running job's nodes, a pending one's (reason)",
                  caption_justify="left")
    for column in ("job", "name", "state", "partition", "nodes", "time", "limit"):
        table.add_column(column, no_wrap=column != "name", overflow="fold")
    table.add_column("where", overflow="fold", min_width=12)
    for job in jobs:
        table.add_row(*(markup(job[key]) for key in ("id", "name", "state", "partition", "nodes", "elapsed",
                                                      "time_limit", "where")))
    return table
