"""The preflight's GPU collective checks (issue 38), before any model load: the topology's known-bad
combinations (gpus/hazards.py), the installed vLLM on the GPUs' capability (drift/gpu_support.py) and the
collective probe (remote/gpus/collective.py) with the run's own environment and torch.

    checks(driver, server_python, config) -> [{name, ok, detail, advice, kind?}]

`collective` fails with kind contract.COLLECTIVE_HANG when the all-reduce hangs; where it hangs with P2P and
passes with NCCL_P2P_DISABLE=1 (or NCCL passes and only the P2P copy, vLLM's custom all-reduce's path, fails) the
check says so, and its advice is `--collective-safe`, which the run then takes (not a guess).
"""
import os
import sys

from base import pkgmeta, server_command, telemetry
from base.contract import COLLECTIVE_HANG
from drift import gpu_support
from gpus import collective, hazards, survey


def check(name, ok, detail, advice=None, kind=None):
    found = {"name": name, "ok": bool(ok), "detail": detail, "advice": None if ok else advice}
    if kind and not ok:
        found["kind"] = kind
    return found


def checks(driver, server_python=None, config=None):
    """`driver`: the run's arguments (tensor_parallel_size, collective_safe); `server_python`: the server's
    environment, whose torch and vLLM the run uses (None: this one's); `config`: the model's config.json."""
    python = pkgmeta.interpreter(server_python) if server_python else sys.executable
    tp = driver.get("tensor_parallel_size")
    safe = bool(driver.get("collective_safe"))
    extra = {"NCCL_P2P_DISABLE": "1"} if safe else {}
    caps = telemetry.compute_caps(timeout=15)
    if not caps["available"]:
        return [collective_check(tp or 1, False, python, safe)]
    found = survey.facts(tp=tp, extra_env=extra, nccl=False, caps=caps)  # nvidia-smi asked once
    world = len(found["used"]) or 1
    bad = [h for h in found["hazards"] if not h["ok"]]
    found_checks = [check("gpu-topology", not bad, "%s%s" % (found["topology_text"] or "topology unknown (%s)" % (
        found["reason"] or "nvidia-smi topo -m"), "".join("; %s: %s" % (h["name"], h["detail"]) for h in bad)),
        "; ".join(h["advice"] for h in bad))]
    cap = _capability(next(iter(found["caps"].values()), None))
    vllm_dir = _vllm_dir(server_python) if cap else None
    if vllm_dir:
        text = (config or {}).get("text_config") or config or {}
        if text.get("kv_lora_rank"):
            found_checks.append(gpu_support.mla_check(vllm_dir, cap, sparse=bool(text.get("index_topk"))))
        pcie_only = bool(found["topology"] and found["topology"]["pcie_only"])
        found_checks += gpu_support.all_reduce_checks(vllm_dir, cap, world, pcie_only)
        if _int4(config):
            found_checks.append(gpu_support.int4_moe_check(vllm_dir, cap))
    found_checks.append(collective_check(world, True, python, safe))
    return found_checks


def _vllm_dir(server_python):
    try:
        return server_command.server_environment(server_python)[1]
    except server_command.PlanError:
        return None


def _capability(text):
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def _int4(config):
    quant = (config or {}).get("quantization_config") or ((config or {}).get("text_config") or {}).get(
        "quantization_config") or {}
    groups = quant.get("config_groups") or {}
    return quant.get("quant_method") == "compressed-tensors" and any(
        (g.get("weights") or {}).get("num_bits") == 4 for g in groups.values() if isinstance(g, dict))


def collective_check(world, gpus, python, safe):
    """The probe with the run's environment; where it fails with P2P on, again with NCCL_P2P_DISABLE=1."""
    if not gpus and world <= 1:
        return check("collective", True, "one process on the CPU: no collective to probe")
    backend = "nccl" if gpus else "gloo"
    env = dict(os.environ)
    if safe:
        env["NCCL_P2P_DISABLE"] = "1"
    p2p_on = gpus and not hazards.p2p_disabled(env)
    first = collective.probe(python, world, backend, env=env, p2p=p2p_on and world > 1)
    how = "%s over %d %s%s" % (backend, world, "GPU(s)" if gpus else "CPU process(es)",
                               ", NCCL_P2P_DISABLE=1 (--collective-safe)" if safe else "")
    versions = ", torch %s%s" % (first["torch"], ", NCCL %s" % first["nccl"] if first.get("nccl") else "") \
        if first.get("torch") else ""
    if first["outcome"] == "ok":
        return check("collective", True, "%s: %s%s" % (how, first["detail"], versions))
    if first["outcome"] == collective.NOT_STARTED:
        return check("collective", False, "%s: the probe could not start: %s" % (how, first["detail"]),
                     "check that torch imports in the run's environment (`inv doctor` shows it)", first["outcome"])
    nccl_passed = all("reduced" in rank["stages"] for rank in first["ranks"])
    if p2p_on and world > 1:
        second = collective.probe(python, world, backend, env=dict(env, NCCL_P2P_DISABLE="1"))
        if second["outcome"] == "ok":
            where = "its P2P copy between GPUs (vLLM's custom all-reduce's path)" if nccl_passed else "its all-reduce"
            return check("collective", False, "%s: %s %s: %s; with NCCL_P2P_DISABLE=1 it passes (%s)" % (
                how, first["outcome"], where, first["detail"], second["detail"]),
                "%s: the run then takes it; or fix the PCIe path (`inv doctor`: ACS, IOMMU)" % hazards.SAFE,
                first["outcome"])
        return check("collective", False, "%s: %s: %s; with NCCL_P2P_DISABLE=1 too: %s" % (
            how, first["outcome"], first["detail"], second["detail"]),
            "not P2P: check NCCL_* in the host's env: (NCCL_DEBUG=INFO shows NCCL's choices), that no other job "
            "holds the GPUs, and the driver (`inv doctor`)", first["outcome"])
    return check("collective", False, "%s: %s: %s" % (how, first["outcome"], first["detail"]),
                 "a hang with P2P already off: check NCCL_* in the host's env: (NCCL_DEBUG=INFO), the network "
                 "interface NCCL picks (NCCL_SOCKET_IFNAME=lo on one host) and the driver" if first["outcome"] ==
                 COLLECTIVE_HANG else "see the rank's last line; `inv doctor` shows torch, NCCL and the driver",
                 first["outcome"])
