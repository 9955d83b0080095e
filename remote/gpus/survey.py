"""The GPUs' collective setting for `inv doctor` (issue 38): topology, versions, PCIe path, the NCCL_* and
VLLM_* environment, and the known-bad combinations among them; stdlib only, nothing imported from torch.

The environment is the one this call has: the host's own plus hosts.yaml's `env:` (rpc.py applies it), which
is what a run started by specrig gets too.
"""
import os
import re

from base import pkgmeta, telemetry
from gpus import hazards, pcie, topology

ENV_PREFIXES = ("NCCL_", "VLLM_")
#: The NCCL wheels torch's CUDA builds depend on (their metadata gives NCCL's version), newest first.
NCCL_DISTRIBUTIONS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl")
LIBNCCL = re.compile(r"^libnccl\.so\.(\d+\.\d+\.\d+)$")
ENVIRONMENT_TIMEOUT_S = 30


def run_env(environ=None):
    """The NCCL_* and VLLM_* variables a run gets, sorted."""
    environ = os.environ if environ is None else environ
    return {key: environ[key] for key in sorted(environ) if key.startswith(ENV_PREFIXES)}


def nccl_version(python=None):
    """{"version", "from"}: NCCL as torch's environment (`python`, default this one) installs it, read from the
    nccl wheel's metadata, else a libnccl.so.X.Y.Z file beside torch; version None when neither says."""
    try:
        other = pkgmeta.other_environment(python, NCCL_DISTRIBUTIONS + ("torch",), ENVIRONMENT_TIMEOUT_S) \
            if python else None
    except pkgmeta.EnvironmentUnreadable as exc:
        return {"version": None, "from": "unknown: %s" % exc}
    installed = other["installed"] if other else {name: pkgmeta.installed(name) for name in
                                                  NCCL_DISTRIBUTIONS + ("torch",)}
    for name in NCCL_DISTRIBUTIONS:
        if installed.get(name):
            return {"version": installed[name]["version"], "from": "%s (torch's NCCL wheel)" % name}
    torch = installed.get("torch")
    for path in (torch or {}).get("files") or []:
        match = LIBNCCL.match(os.path.basename(path))
        if match:
            return {"version": match.group(1), "from": path}
    return {"version": None, "from": "unknown: no nvidia-nccl wheel%s" % (
        " (torch %s may link NCCL statically)" % torch["version"] if torch else ", no torch")}


def visible_indices(rows, visible):
    """nvidia-smi indices of the GPUs CUDA_VISIBLE_DEVICES shows (telemetry's one reading of it)."""
    return [gpu["index"] for gpu in telemetry.visible_gpus(rows, visible)]


def facts(server_python=None, tp=None, extra_env=None, nccl=True, caps=None):
    """{available, reason, topology, topology_text, used, p2p, driver, cuda, nccl, caps, pcie, pcie_text, env,
    hazards}: the GPUs a run would use (CUDA_VISIBLE_DEVICES' first `tp`, default all); `extra_env`: what the run
    adds (--collective-safe's NCCL_P2P_DISABLE=1); `nccl`: False leaves NCCL's version unread (the probe says it); `caps`: telemetry.compute_caps' answer where
    the caller has it already."""
    seen = topology.read()
    caps = caps or telemetry.compute_caps(timeout=15)
    env = dict(run_env(), **(extra_env or {}))
    found = {"available": seen["topology"] is not None or caps["available"], "reason": seen["error"],
             "driver": seen["driver"], "cuda": seen["cuda"], "env": env, "p2p": seen["p2p"],
             "nccl": nccl_version(server_python) if nccl else None, "topology": None, "topology_text": None, "used": [],
             "caps": {}, "hazards": []}
    path = pcie.read()
    found["pcie"], found["pcie_text"] = path, pcie.describe(path)
    if not caps["available"] and seen["topology"] is None:
        found["reason"] = seen["error"] or caps["reason"]
        return found
    rows = caps["gpus"] if caps["available"] else [{"index": g, "uuid": None} for g in seen["topology"]["gpus"]]
    used = visible_indices(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))[:tp or None]
    found["used"] = used
    found["caps"] = {str(gpu["index"]): gpu.get("compute_cap") for gpu in rows if gpu["index"] in used}
    if seen["topology"] is not None:
        topo = topology.among(seen["topology"], used)
        found["topology"], found["topology_text"] = topo, topology.describe(topo)
        found["hazards"] = hazards.assess(topo, path, env, list(found["caps"].values()), seen["p2p"])
    return found
