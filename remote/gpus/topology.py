"""`nvidia-smi topo -m`, `topo -p2p r` and nvidia-smi's header (driver, CUDA), parsed; stdlib only.

The matrix's cells between GPUs are one of X (self), NV# (a bonded set of # NVLinks), PIX, PXB, PHB, NODE, SYS
(nvidia-smi's legend, kept in tests/fixtures/nvidia-smi/*/topo_m.txt). Both layouts seen in the wild parse:
tab-separated (older drivers, copied as stored) and space-aligned.
"""
import re
import subprocess

#: PCIe links between two GPUs, nearest first (nvidia-smi's legend).
PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
LINK_WORDS = {
    "PIX": "at most one PCIe bridge",
    "PXB": "several PCIe bridges, no host bridge",
    "PHB": "PCIe through the CPU's host bridge",
    "NODE": "PCIe between host bridges of one NUMA node",
    "SYS": "PCIe and the interconnect between NUMA nodes",
}
GPU_NAME = re.compile(r"^GPU(\d+)$")
NVLINK = re.compile(r"^NV(\d+)$")
#: nvidia-smi underlines the matrix's header with terminal escapes even into a pipe (driver 580 on an H100).
TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: `nvidia-smi topo -p2p r`'s cells: OK, or why peer access is refused.
P2P_WORDS = {"OK": "supported", "CNS": "chipset not supported", "GNS": "GPU not supported",
             "TNS": "topology not supported", "NS": "not supported", "DR": "disabled by regkey", "U": "unknown"}
HEADER = re.compile(r"Driver Version:\s*(?P<driver>[\w.-]+)(?:\s+CUDA Version:\s*(?P<cuda>[\w.]+))?")


class TopologyUnreadable(ValueError):
    """The text is not a GPU matrix nvidia-smi prints."""


def _matrix(text):
    """(GPU indices of the header, {gpu: [cells after the name]}) of a matrix with GPU rows and columns."""
    header, rows = None, {}
    for line in TERMINAL_ESCAPE.sub("", text).splitlines():
        words = line.split()
        if not words:
            continue
        if header is None and any(GPU_NAME.match(w) for w in words):  # the header comes first
            header = [int(GPU_NAME.match(w).group(1)) for w in words if GPU_NAME.match(w)]
            continue
        match = GPU_NAME.match(words[0])
        if header is not None and match:
            rows[int(match.group(1))] = words[1:]
        elif header is not None and rows and line.strip().startswith("Legend"):
            break
    if not header or not rows:
        raise TopologyUnreadable("no GPU matrix (a header naming GPU0 and rows starting with GPUn)")
    return header, rows


def parse_topo(text):
    """`nvidia-smi topo -m` -> {gpus, links: {"0-1": "PHB"}, kinds, nvlink, pcie_only, numa: {gpu: node}}.

    A pair's cell is the one of the lower GPU's row; links name every pair of GPUs once."""
    header, rows = _matrix(text)
    links, numa = {}, {}
    for gpu, cells in rows.items():
        if len(cells) < len(header):
            raise TopologyUnreadable("GPU%d's row has %d cells for %d GPUs" % (gpu, len(cells), len(header)))
        for column, cell in zip(header, cells):
            if column > gpu:
                links["%d-%d" % (gpu, column)] = cell
        rest = cells[len(header):]
        # After the GPU columns come NIC columns (links again), then CPU affinity, NUMA affinity.
        rest = [cell for cell in rest if cell not in PCIE_LINKS and cell != "X" and not NVLINK.match(cell)]
        if len(rest) >= 2 and rest[1].isdigit():
            numa[gpu] = int(rest[1])
    for gpu in rows:
        if rows[gpu][header.index(gpu)] != "X":
            raise TopologyUnreadable("GPU%d's own cell is %r, not X" % (gpu, rows[gpu][header.index(gpu)]))
    kinds = sorted(set(links.values()), key=_rank)
    nvlink = any(NVLINK.match(kind) for kind in kinds)
    return {"gpus": sorted(rows), "links": links, "kinds": kinds, "nvlink": nvlink,
            "pcie_only": bool(links) and not nvlink, "numa": numa}


def _rank(kind):
    """Nearest first: NVLink (more links nearer), then PIX ... SYS, then anything unknown."""
    match = NVLINK.match(kind)
    if match:
        return (0, -int(match.group(1)))
    return (1, PCIE_LINKS.index(kind)) if kind in PCIE_LINKS else (2, 0)


def among(topology, gpus):
    """The topology restricted to `gpus` (indices): the links the run's GPUs talk over."""
    wanted = set(gpus)
    links = {pair: kind for pair, kind in topology["links"].items()
             if set(int(g) for g in pair.split("-")) <= wanted}
    nvlink = any(NVLINK.match(kind) for kind in links.values())
    return dict(topology, gpus=sorted(wanted & set(topology["gpus"])), links=links,
                kinds=sorted(set(links.values()), key=_rank), nvlink=nvlink,
                pcie_only=bool(links) and not nvlink)


def describe(topology):
    """'2 GPUs, PCIe only: 0-1 PHB (PCIe through the CPU's host bridge)'; 'GPUs 0-1 NV12, 0-2 SYS, 1-2 SYS'."""
    count = len(topology["gpus"])
    if not topology["links"]:
        return "%d GPU: no links between GPUs" % count
    kind = "PCIe only" if topology["pcie_only"] else "NVLink on %d of %d pairs" % (
        sum(1 for k in topology["links"].values() if NVLINK.match(k)), len(topology["links"]))
    groups = {}
    for pair, link in sorted(topology["links"].items(), key=lambda item: [int(g) for g in item[0].split("-")]):
        groups.setdefault(link, []).append(pair)
    parts = []
    for link in sorted(groups, key=_rank):
        pairs = groups[link]
        shown = ", ".join(pairs[:4]) + (" and %d more pair(s)" % (len(pairs) - 4) if len(pairs) > 4 else "")
        parts.append("%s %s%s" % (link, shown, " (%s)" % LINK_WORDS[link] if link in LINK_WORDS else ""))
    return "%d GPUs, %s: %s" % (count, kind, "; ".join(parts))


def parse_p2p(text):
    """`nvidia-smi topo -p2p r` (or w, rw) -> {"0-1": "OK"|"GNS"|...}: whether the driver offers peer access."""
    header, rows = _matrix(text)
    return {"%d-%d" % (gpu, column): cell for gpu, cells in rows.items()
            for column, cell in zip(header, cells) if column > gpu}


def parse_header(text):
    """nvidia-smi's banner -> {"driver", "cuda"} (None where it names none)."""
    match = HEADER.search(text or "")
    return {"driver": match.group("driver") if match else None,
            "cuda": match.group("cuda") if match and match.group("cuda") else None}


def _run(args, timeout):
    """(stdout, None) or (None, why it could not be read)."""
    try:
        proc = subprocess.run(["nvidia-smi"] + args, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return None, "nvidia-smi not found on PATH"
    except subprocess.TimeoutExpired:
        return None, "nvidia-smi %s did not answer within %d s" % (" ".join(args), timeout)
    except OSError as exc:
        return None, "cannot run nvidia-smi: %s" % (exc.strerror or exc)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        return None, "nvidia-smi %s exited with %d: %s" % (" ".join(args), proc.returncode,
                                                          said[-1] if said else "no output")
    return proc.stdout, None


def read(timeout=15):
    """The host's: {topology or None, p2p or None, driver, cuda, error: None or why the matrix is unknown}."""
    found = {"topology": None, "p2p": None, "driver": None, "cuda": None, "error": None}
    banner, why = _run([], timeout)
    if banner is None:
        found["error"] = why
        return found
    found.update(parse_header(banner))
    text, why = _run(["topo", "-m"], timeout)
    try:
        found["topology"] = parse_topo(text) if text is not None else None
    except TopologyUnreadable as exc:
        why = "nvidia-smi topo -m: %s" % exc
    found["error"] = why if found["topology"] is None else None
    p2p, _ = _run(["topo", "-p2p", "r"], timeout)
    try:
        found["p2p"] = parse_p2p(p2p) if p2p else None
    except TopologyUnreadable:
        pass
    return found
