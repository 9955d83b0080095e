"""`inv doctor`: what a host is and whether it can run specrig's work (specrig/ui/doctor.py shows it).

Also the extraction mode a host's speculators version takes (contract.extraction_mode), and the
refusal of the tasks that cannot serve it (check_extraction_mode), on the task's own connection.
"""
from __future__ import annotations

import time

from specrig import contract
from specrig.errors import UsageError
from specrig.inventory import Host
from specrig.transport import Remote, connect
from specrig.transport.bundle import Bundle

DOCTOR_TIMEOUT_S = 60
#: A Slurm login node's doctor also asks sinfo and squeue and waits for its home test's job
#: (remote/slurm/cluster.py: at most 25 + 25 + 40 s).
SLURM_DOCTOR_TIMEOUT_S = DOCTOR_TIMEOUT_S + 90


def doctor_args(host: Host, **extra) -> dict:
    """The doctor call's arguments: the server's environment too when hosts.yaml names another one, the
    Slurm cluster's facts too on a login node (the `slurm:` settings name where its test job may run), the
    checks of hosts.yaml's extract.model too when it names one."""
    args = {"workdir": host.workdir, **extra}
    if host.two_environments:
        args["server_python"] = host.server_interpreter
    if host.scheduler == contract.SLURM:
        args["slurm"] = host.slurm
    if host.extract.get("model"):  # remote/run/model_support.py: custom code, quantization on these GPUs
        args["model"] = host.extract["model"]
    return args


def doctor(host: Host, *, bundle: Bundle | None = None) -> dict:
    """One connection, one call: the host's facts plus how we reached it."""
    started = time.monotonic()
    with connect(host, bundle=bundle) as remote:
        timeout = SLURM_DOCTOR_TIMEOUT_S if host.scheduler == contract.SLURM else DOCTOR_TIMEOUT_S
        facts = remote.call("doctor", doctor_args(host), timeout=timeout)
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
