"""`inv doctor`: what a host is and whether it can run specrig's work.

Also the extraction mode a host's speculators version takes (contract.extraction_mode), and the
refusal of the tasks that cannot serve it (check_extraction_mode), on the task's own connection.
"""
from __future__ import annotations

import time

from rich.table import Table

from specrig import contract
from specrig.errors import UsageError
from specrig.transport.bundle import Bundle
from specrig.inventory import Host
from specrig.transport import Remote, connect
from specrig.ui import console, gpu_table, human_bytes, print_json
from specrig.ui.terminal import markup

DOCTOR_TIMEOUT_S = 60
#: Packages of speculators' environment shown only when installed (or on the server path).
SERVER_MODE_ONLY = ("hs-connectors",)


def doctor_args(host: Host, **extra) -> dict:
    """The doctor call's arguments: the server's environment too when hosts.yaml names another one."""
    args = {"workdir": host.workdir, **extra}
    if host.two_environments:
        args["server_python"] = host.server_interpreter
    return args


def doctor(host: Host, *, bundle: Bundle | None = None) -> dict:
    """One connection, one call: the host's facts plus how we reached it."""
    started = time.monotonic()
    with connect(host, bundle=bundle) as remote:
        facts = remote.call("doctor", doctor_args(host), timeout=DOCTOR_TIMEOUT_S)
        facts["connection"] = {"target": host.describe(), "ssh": not host.is_local,
                               "exec_channels": remote.exec_count,
                               "bundle_uploaded": getattr(remote, "uploaded", False)}
    facts["connection"]["seconds"] = round(time.monotonic() - started, 3)
    facts["extraction"] = extraction(facts, host)
    return facts


def extraction(facts: dict, host: Host) -> dict:
    """The extraction mode of the host's speculators version, and the vLLM the server would run:
    {mode, speculators, vllm, server_python} (mode None: speculators is not installed)."""
    speculators = facts["packages"].get("speculators")
    server = facts.get("server_env") or {"packages": facts["packages"]}
    return {"mode": contract.extraction_mode(speculators), "speculators": speculators,
            "vllm": (server.get("packages") or {}).get("vllm"),
            "server_python": host.server_interpreter if host.two_environments else None}


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


def repository_scripts(speculators: str) -> str:
    return (f"speculators {speculators} shipped its data generation only as repository scripts, outside the "
            f"wheel: install speculators ≤ 0.4 or ≥ 0.8")


def installed_versions(remote: Remote) -> dict:
    """The host's Python and the package versions of `python`'s environment, from metadata: one cheap
    call on an open connection ({python, packages, server_env: None})."""
    return remote.call("doctor", {"versions_only": True}, timeout=DOCTOR_TIMEOUT_S)


def check_extraction_mode(remote: Remote, host: Host, task: str) -> dict:
    """Refuse, before anything is launched or changed, a task the host's speculators cannot serve.

    One cheap call on the task's own connection (the Pythons and package versions, from metadata).
    speculators 0.5-0.7 is refused for every task (`extract`, `smoke`, `apply-patches`): UsageError
    (exit 2). Otherwise the versions found in `python`'s environment and the mode they take:
    {python, packages, mode}.
    """
    facts = installed_versions(remote)
    speculators = facts["packages"].get("speculators")
    mode = contract.extraction_mode(speculators)
    untouched = "nothing was changed" if task == "apply-patches" else "nothing was launched"
    if mode == contract.REPOSITORY_SCRIPTS:
        raise UsageError(f"{host.name}: {repository_scripts(speculators)}", hint=untouched)
    return dict(facts, mode=mode)


def show(facts: dict, *, as_json: bool, host: Host) -> None:
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
    disk = facts["disk"]
    summary.add_row("workdir", f"{markup(disk['path'])}: {human_bytes(disk['free_bytes'])} free"
                               + ("" if disk["exists"] else " (does not exist yet)"))
    console.print(summary)
    gpu = facts["gpu"]
    if not gpu["available"]:
        console.print(f"GPUs: none visible ({markup(gpu['reason'])})")
        return
    table = gpu_table(gpu["gpus"], title="GPUs")
    console.print(table)


def _server_rows(summary: Table, server: dict) -> None:
    """The vLLM server's environment (server_python), when hosts.yaml names another one."""
    if server.get("error"):
        summary.add_row("server python", f"[red]{markup(server['error'])}[/]")
        return
    summary.add_row("server python", f"{markup(server['version'])}  {markup(server['executable'])}")
    for name, version in server["packages"].items():
        summary.add_row(f"  {markup(name)}", markup(version) if version else "[yellow]not installed[/]")
