"""How people see `inv doctor`: the host's facts, its extraction mode, its GPUs; on a Slurm login node its
cluster too (specrig/ui/slurm_cluster.py)."""
from __future__ import annotations

from pathlib import PurePosixPath

from rich.table import Table

from specrig import contract
from specrig.doctor import extraction, repository_scripts
from specrig.inventory import Host
from specrig.ui import console, gpu_table, human_bytes, print_json
from specrig.ui.slurm_cluster import show_cluster
from specrig.ui.task import TaskView
from specrig.ui.terminal import markup

#: Packages of speculators' environment shown only when installed (or in server mode).
SERVER_MODE_ONLY = ("hs-connectors",)


def describe_extraction(found: dict) -> str:
    """One line for people: "in-process (speculators 0.3.0)", "server (speculators 0.9.0, vLLM
    0.32.0 in server_python)"."""
    mode, speculators = found["mode"], found["speculators"]
    if mode is None:
        return "none: speculators is not installed"
    if mode == contract.REPOSITORY_SCRIPTS:
        return f"none: {repository_scripts(speculators)}"
    if mode == contract.SERVER:
        where = "server_python" if found.get("server_python") else "python"
        vllm = f"vLLM {found['vllm']} in {where}" if found.get("vllm") else f"no vLLM in {where}"
        return f"server (speculators {speculators}, {vllm})"
    return f"{mode} (speculators {speculators})"


def show_doctor(facts: dict, *, host: Host, as_json: bool) -> None:
    if as_json:
        print_json(facts)
        return
    conn, python = facts["connection"], facts["python"]
    found = facts.get("extraction") or extraction(facts, host)
    summary = Table.grid(padding=(0, 2))
    summary.add_row("host", f"{host.name} → {markup(conn['target'])} (reached in {conn['seconds']:.2f} s)")
    summary.add_row("user / shell", f"{markup(facts['user'])} / {markup(facts['login_shell'])}")
    summary.add_row("python", f"{markup(python['version'])}  {markup(python['executable'])}")
    server = facts.get("server_env")
    indent = "  " if server else ""  # two environments: each one's packages under its python
    for name, version in facts["packages"].items():
        if version is None and name in SERVER_MODE_ONLY and found["mode"] != contract.SERVER:
            continue
        summary.add_row(indent + markup(name), markup(version) if version else "[yellow]not installed[/]")
    if server:
        _server_rows(summary, server)
    summary.add_row("extraction", markup(describe_extraction(found)))
    for check in facts.get("model_support") or []:  # extract.model: custom code, quantization on these GPUs
        summary.add_row(check["name"], markup(check["detail"]) if check["ok"] else
                        f"[red]{markup(check['detail'])}[/]: {markup(check['advice'])}")
    disk = facts["disk"]
    summary.add_row("workdir", f"{markup(disk['path'])}: {human_bytes(disk['free_bytes'])} free"
                               + ("" if disk["exists"] else " (does not exist yet)"))
    console.print(summary)
    gpu = facts["gpu"]
    if gpu["available"]:
        console.print(gpu_table(gpu["gpus"], title="GPUs"))
    else:
        console.print(f"GPUs: none visible ({markup(gpu['reason'])})")
    if facts.get("gpu_topology"):
        show_collectives(facts["gpu_topology"])
    if facts.get("slurm"):
        show_cluster(facts["slurm"])


def show_collectives(found: dict) -> None:
    """What decides whether the GPUs' collectives hang (remote/gpus/survey.py): topology, versions, the PCIe
    path, the NCCL_*/VLLM_* environment, and each known-bad combination with its fix."""
    rows = Table.grid(padding=(0, 2))
    if found["available"]:
        rows.add_row("topology", markup(found.get("topology_text") or f"unknown ({found.get('reason')})"))
        caps = sorted(set((found.get("caps") or {}).values()) - {None})
        rows.add_row("versions", markup(f"compute capability {', '.join(caps) or '?'}; driver {found['driver'] or '?'}"
                                        f", CUDA {found['cuda'] or '?'}"))
    else:
        rows.add_row("topology", markup(f"no GPUs ({found.get('reason')}): no links, no P2P"))
    nccl = found["nccl"]
    rows.add_row("NCCL", markup(f"{nccl['version']} from {nccl['from']}" if nccl["version"] else nccl["from"]))
    rows.add_row("IOMMU", markup(found["pcie_text"]["iommu"]))
    rows.add_row("ACS", markup(found["pcie_text"]["acs"]))
    env = found.get("env") or {}
    rows.add_row("NCCL_*/VLLM_*", markup(" ".join(f"{k}={v}" for k, v in env.items()) or "none set"))
    for hazard in found.get("hazards") or []:
        if hazard["ok"]:
            rows.add_row(hazard["name"], markup(hazard["detail"]))
        else:
            source = f" ({hazard['source']})" if hazard.get("source") else ""
            rows.add_row(hazard["name"], f"[red]{markup(hazard['detail'])}[/]{markup(source)}: "
                                         f"{markup(hazard['advice'])}")
    console.print("[bold]GPU collectives[/]")
    console.print(rows)


def _server_rows(summary: Table, server: dict) -> None:
    """The vLLM server's environment (server_python), when hosts.yaml names another one."""
    if server.get("error"):
        summary.add_row("server python", f"[red]{markup(server['error'])}[/]")
        return
    summary.add_row("server python", f"{markup(server['version'])}  {markup(server['executable'])}")
    for name, version in server["packages"].items():
        summary.add_row(f"  {markup(name)}", markup(version) if version else "[yellow]not installed[/]")


def doctor_figures(facts: dict) -> str:
    packages = facts["packages"]
    gpu = facts["gpu"]
    gpus = f"{len(gpu['gpus'])} GPU(s)" if gpu["available"] else "no GPUs"
    slurm = facts.get("slurm")
    cluster = f", slurm {slurm.get('version') or '?'}" if slurm else ""
    return (f"{facts['user']}/{PurePosixPath(facts['login_shell']).name}, python {facts['python']['version']}, "
            f"speculators {packages.get('speculators') or '-'}, vllm {packages.get('vllm') or '-'}, {gpus}, "
            f"{human_bytes(facts['disk']['free_bytes'])} free{cluster}")


DOCTOR = TaskView("doctor", show=show_doctor, figures=doctor_figures)
