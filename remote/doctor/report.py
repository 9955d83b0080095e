"""What the host is: shell, Python, installed packages, GPUs, free disk.

A host may hold two environments: speculators' (the host's `python`, which runs this call) and the
vLLM server's (`server_python` in hosts.yaml), read from metadata by that interpreter in a process of
its own (pkgmeta.other_environment: nothing imported).
"""
import os
import platform
import pwd
import shutil

from base import pkgmeta, telemetry
from gpus import survey
from run import model_support
from run.storage import existing_parent

#: Read in speculators' environment (the host's `python`).
PACKAGES = ("speculators", "vllm", "torch", "transformers", "hs-connectors")
#: Read in the vLLM server's environment (`server_python`), when it is another one.
SERVER_PACKAGES = ("vllm", "torch", "transformers", "hs-connectors")
#: Starting an interpreter from a cold network disk can take a while; the laptop gives doctor 60 s.
SERVER_TIMEOUT_S = 30


def server_environment(python, timeout=SERVER_TIMEOUT_S):
    """The server's environment (`python`), or None when it is this one:
    {"python": as given, executable, version, prefix, packages: {name: version or None},
     "error": None or why it could not be read}."""
    try:
        found = pkgmeta.other_environment(python, SERVER_PACKAGES, timeout)
    except pkgmeta.EnvironmentUnreadable as exc:
        return {"python": python, "executable": pkgmeta.interpreter(python), "version": None, "prefix": None,
                "packages": dict.fromkeys(SERVER_PACKAGES), "error": str(exc)}
    if found is None:
        return None
    installed = found.pop("installed")
    found.pop("path", None)
    return dict(found, python=python, error=None,
                packages={name: entry["version"] if entry else None for name, entry in installed.items()})


def run(args):
    """{"workdir", "server_python" (optional: read that environment too), "versions_only" (optional:
    the Pythons and packages alone, for a task's cheap check before it starts anything), "slurm"
    (optional, a login node's hosts.yaml `slurm:` settings: the cluster's facts too, slurm/cluster.py), "model"
    (optional, hosts.yaml's extract.model: model_support.py's checks of it)}."""
    facts = {"python": {key: value for key, value in pkgmeta.environment(()).items() if key != "installed"},
             "packages": pkgmeta.versions(PACKAGES)}
    facts["server_env"] = server_environment(args["server_python"]) if args.get("server_python") else None
    if args.get("versions_only"):
        return facts
    workdir = os.path.expanduser(args.get("workdir") or "~")
    usage = shutil.disk_usage(existing_parent(workdir))
    facts.update({
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "hostname": platform.node(),
        "login_shell": pwd.getpwuid(os.getuid()).pw_shell,
        "gpu": telemetry.gpus(),
        "disk": {"path": workdir, "exists": os.path.isdir(workdir), "free_bytes": usage.free,
                 "total_bytes": usage.total},
    })
    facts["gpu_topology"] = survey.facts(args.get("server_python"))  # topology, versions, PCIe, NCCL_*/VLLM_*
    if args.get("model"):  # hosts.yaml's extract.model: can this host's vLLM serve it at all?
        facts["model_support"] = model_support.host_checks(args["model"], server_python=args.get("server_python"))
    if args.get("slurm") is not None:
        from slurm import cluster  # a login node's alone: other hosts do not pay for its imports

        facts["slurm"] = cluster.facts(args["slurm"], facts["user"])
    return facts
