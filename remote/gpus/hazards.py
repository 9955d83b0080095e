"""Known-bad combinations of topology, PCIe path and environment, each named with its fix (issue 38); pure.

Each is a check {name, ok, detail, advice, source}: ok False is a combination known to hang or to take P2P away;
ok True with a detail is a fact worth knowing before an 18-minute load. `source` names the public report.
"""
import re

NVLINK = re.compile(r"^NV\d+$")
#: What `--collective-safe` (hosts.yaml extract.collective_safe) does: the workaround of vLLM #33041.
SAFE = ("`inv extract --collective-safe` (or `collective_safe: true` under the host's extract: in hosts.yaml): "
        "NCCL_P2P_DISABLE=1 and vLLM's --disable-custom-all-reduce")
ACS_REPORTS = "vLLM #33041, NVIDIA/nccl#667, NVIDIA/nccl#1999"


def check(name, ok, detail, advice=None, source=None):
    return {"name": name, "ok": bool(ok), "detail": detail, "advice": None if ok else advice, "source": source}


def p2p_disabled(env):
    return str(env.get("NCCL_P2P_DISABLE", "")).strip() in ("1", "true", "True", "yes")


def assess(topo, path, env, caps=(), p2p=None):
    """The checks for the GPUs a run uses: `topo` (topology.among() of them, or None), `path` (pcie.read()),
    `env` (the NCCL_*/VLLM_* the run gets), `caps` (their compute capabilities, '12.0'), `p2p` (topo -p2p r)."""
    if not topo or len(topo["gpus"]) < 2:
        return []
    found = []
    pcie_pairs = [pair for pair, kind in topo["links"].items() if not NVLINK.match(kind)]
    level = str(env.get("NCCL_P2P_LEVEL", "")).strip().upper()
    if level in ("NVL", "LOC") and pcie_pairs:
        found.append(check(
            "nccl-p2p-level", False,
            "NCCL_P2P_LEVEL=%s, and GPUs %s talk over PCIe (%s): NCCL uses no P2P there, every transfer goes "
            "through host memory" % (level, ", ".join(pcie_pairs[:4]), ", ".join(sorted(set(
                topo["links"][p] for p in pcie_pairs)))),
            "drop NCCL_P2P_LEVEL from the host's env: in hosts.yaml (NVL assumes NVLink); if P2P must be off, say "
            "so with %s" % SAFE, "docs/gpu.md, issue 38"))
    if p2p_disabled(env) and topo["nvlink"]:
        found.append(check("nccl-p2p-disable", True, "NCCL_P2P_DISABLE=1 on GPUs with NVLink: NCCL leaves "
                           "NVLink unused (slower, not a hang); drop it unless the probe needs it"))
    refused = {pair: cell for pair, cell in (p2p or {}).items() if pair in topo["links"] and cell != "OK"}
    if refused:
        found.append(check("p2p-access", True, "the driver refuses peer access for %s: NCCL and vLLM copy through "
                           "host memory there (no P2P hang, slower)" % ", ".join(
                               "%s (%s)" % item for item in sorted(refused.items()))))
    if topo["pcie_only"]:
        found += _pcie_only(topo, path, env, caps)
    return found


def _pcie_only(topo, path, env, caps):
    found = []
    count = len(topo["gpus"])
    off = p2p_disabled(env)
    redirect, translated = path["acs_redirect"], path["iommu"]["translated"]
    if redirect and not off:
        on = [b["bridge"] for b in path["bridges"] if b["redirect"]]
        found.append(check("acs-redirect", False, "P2P over PCIe with ACS P2P redirect on at %s: the first "
                           "all-reduce hangs (RTX PRO 6000 at tp 2)" % ", ".join(on),
                           "%s; or turn ACS off (BIOS, or setpci on those bridges: NCCL's troubleshooting guide, "
                           "GPU Direct)" % SAFE, ACS_REPORTS))
    if translated and not off:
        found.append(check("iommu", False, "P2P over PCIe with the IOMMU translating the GPUs' DMA: P2P fails or "
                           "hangs", "iommu=pt (or intel_iommu=off / amd_iommu=off) on the kernel command line, "
                           "or %s" % SAFE, ACS_REPORTS))
    if not off and (redirect is None or translated is None) and not (redirect or translated):
        found.append(check("p2p-path", True, "P2P over PCIe, and ACS / IOMMU on the path could not be read "
                           "(below): whether collectives hang there is the preflight's collective probe's to "
                           "find out, in seconds"))
    twelve = [cap for cap in caps if str(cap).startswith("12.")]
    if count > 2:
        found.append(check("custom-all-reduce", True, "%d PCIe-only GPUs: vLLM turns its custom all-reduce off "
                           "itself (\"not supported on more than two PCIe-only GPUs\")%s; every all-reduce is "
                           "NCCL's, so a hang while loading (vLLM #42063) is NCCL's P2P, which the probe tests"
                           % (count, " and its symmetric-memory all-reduce has no sizes for 12.0" if twelve else "")))
    elif not off and (redirect or translated or redirect is None):
        found.append(check("custom-all-reduce", True, "2 PCIe-only GPUs: vLLM's custom all-reduce is on by "
                           "default and trusts the driver's P2P report (VLLM_SKIP_P2P_CHECK=1), which says OK under "
                           "ACS redirect too (rtx6kpro#15); %s turns it off with P2P" % SAFE))
    return found
