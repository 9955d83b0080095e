"""IOMMU and ACS on the NVIDIA GPUs' PCIe path, where this user may read them; stdlib only.

P2P between GPUs over PCIe hangs or corrupts when the bridges between them redirect peer requests up to the
root complex (ACS P2P Request/Completion Redirect) or the IOMMU translates the GPUs' DMA (NCCL's
troubleshooting guide, "GPU Direct"; NVIDIA/nccl#667, vLLM #33041). What is read:

- the IOMMU: /sys/class/iommu (dmar*, ivhd*: one is on), the kernel command line (intel_iommu=, amd_iommu=,
  iommu=pt/off), each GPU's /sys/kernel/iommu_groups/<n>/type (DMA, DMA-FQ: translated; identity:
  passthrough);
- ACS: the ACS control register of every bridge above a GPU, from its config space (readable past the first
  64 bytes by root only), else `lspci -vvv`'s ACSCtl line (also root's); where neither reads, it says so.
"""
import os
import re
import subprocess

SYS_PCI = "/sys/bus/pci/devices"
NVIDIA = "0x10de"
#: PCI classes of a GPU: VGA controller, 3D controller.
GPU_CLASSES = ("0x0300", "0x0302")
ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
#: The ACS extended capability's id, and the control register's bits (PCIe base spec, 7.7.8).
ACS_CAP_ID = 0x000D
ACS_BITS = (("SrcValid", 0), ("TransBlk", 1), ("ReqRedir", 2), ("CmpltRedir", 3), ("UpstreamFwd", 4),
            ("EgressCtrl", 5), ("DirectTrans", 6))
REDIRECTS = ("ReqRedir", "CmpltRedir")
ACSCTL = re.compile(r"ACSCtl:\s*(.*)")


def _read(path, binary=False):
    try:
        with open(path, "rb" if binary else "r") as handle:
            return handle.read() if binary else handle.read().strip()
    except OSError:
        return None


def gpu_addresses(root=SYS_PCI):
    """The PCI addresses of NVIDIA GPUs, as sysfs lists them."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [name for name in names if _read(os.path.join(root, name, "vendor")) == NVIDIA
            and (_read(os.path.join(root, name, "class")) or "")[:6] in GPU_CLASSES]


def upstream(address, root=SYS_PCI):
    """The bridges between a device and its root complex, the nearest first (from its sysfs path)."""
    path = os.path.realpath(os.path.join(root, address))
    parts = [part for part in path.split(os.sep) if ADDRESS.match(part)]
    return list(reversed(parts[:-1]))


def acs_from_config(config):
    """ACS control flags {name: bool} from a config space's bytes; None when the bytes stop before the
    extended capabilities (a user's read: 64 or 256 bytes), {} when the device has no ACS capability."""
    if config is None or len(config) <= 0x100:
        return None
    offset, seen = 0x100, set()
    while offset and offset not in seen and offset + 8 <= len(config):
        seen.add(offset)
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return {}
        if header & 0xFFFF == ACS_CAP_ID:
            control = int.from_bytes(config[offset + 6:offset + 8], "little")
            return {name: bool(control >> bit & 1) for name, bit in ACS_BITS}
        offset = header >> 20 & 0xFFC
    return {}


def acs_from_lspci(text):
    """ACS control flags from `lspci -vvv -s DEV`'s ACSCtl line ('ReqRedir+ CmpltRedir-' ...); None without one."""
    match = ACSCTL.search(text or "")
    if not match:
        return None
    return {word[:-1]: word.endswith("+") for word in match.group(1).split() if word[-1:] in "+-"}


def _lspci(address, timeout=10):
    try:
        proc = subprocess.run(["lspci", "-vvv", "-s", address], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def bridge_acs(address, root=SYS_PCI):
    """{"bridge", "acs": flags or None, "redirect": bool or None, "read_from"}."""
    flags = acs_from_config(_read(os.path.join(root, address, "config"), binary=True))
    read_from = "config space"
    if flags is None:
        flags, read_from = acs_from_lspci(_lspci(address)), "lspci"
    if flags is None:
        return {"bridge": address, "acs": None, "redirect": None, "read_from": None}
    return {"bridge": address, "acs": flags, "redirect": any(flags.get(name) for name in REDIRECTS),
            "read_from": read_from}


def iommu(root=SYS_PCI, cmdline_path="/proc/cmdline", class_dir="/sys/class/iommu"):
    """{"units": [dmar0 ...], "cmdline": [the iommu words], "groups": {gpu: type}, "translated": bool or None}."""
    try:
        units = sorted(os.listdir(class_dir))
    except OSError:
        units = []
    words = [word for word in (_read(cmdline_path) or "").split() if "iommu" in word]
    groups = {}
    for gpu in gpu_addresses(root):
        group = os.path.join(root, gpu, "iommu_group")
        groups[gpu] = _read(os.path.join(group, "type")) if os.path.exists(group) else None
    if any(kind and kind.startswith("DMA") for kind in groups.values()):
        translated = True
    elif groups and all(kind == "identity" for kind in groups.values()):
        translated = False
    elif not units or any(word in ("iommu=off", "intel_iommu=off", "amd_iommu=off") for word in words):
        translated = False
    elif "iommu=pt" in words:
        translated = False
    else:
        translated = None
    return {"units": units, "cmdline": words, "groups": groups, "translated": translated}


def read(root=SYS_PCI):
    """The GPUs' PCIe path: {"gpus": [addresses], "iommu": iommu(), "bridges": [bridge_acs()], "acs_redirect":
    True (a bridge redirects), False (every bridge read, none does), None (some could not be read)}."""
    gpus = gpu_addresses(root)
    bridges = []
    for bridge in sorted({b for gpu in gpus for b in upstream(gpu, root)}):
        bridges.append(bridge_acs(bridge, root))
    if any(b["redirect"] for b in bridges):
        redirect = True
    elif bridges and all(b["acs"] is not None for b in bridges):
        redirect = False
    else:
        redirect = None
    return {"gpus": gpus, "iommu": iommu(root), "bridges": bridges, "acs_redirect": redirect}


def describe(found):
    """Two lines for people: the IOMMU, then ACS (or why it is not known)."""
    io = found["iommu"]
    if io["translated"] is True:
        line = "on, translating the GPUs' DMA (%s)" % ", ".join(
            "%s: %s" % item for item in io["groups"].items() if item[1]) or "on"
    elif io["translated"] is False:
        line = "off or passthrough (%s)" % (", ".join(io["cmdline"]) or
                                            ("units %s" % ", ".join(io["units"]) if io["units"] else "no IOMMU unit"))
    else:
        line = "unknown: units %s, command line %s, the GPUs' groups not readable" % (
            ", ".join(io["units"]) or "none", " ".join(io["cmdline"]) or "silent")
    bridges = found["bridges"]
    if not found["gpus"]:
        acs = "no NVIDIA GPU on the PCI bus"
    elif not bridges:
        acs = "no bridge above the GPUs in sysfs (a VM's flat bus?)"
    elif found["acs_redirect"] is None:
        unread = [b["bridge"] for b in bridges if b["acs"] is None]
        acs = ("not readable for %d of %d bridge(s) above the GPUs (%s): their config space past 64 bytes is "
               "root's; `sudo lspci -vvv | grep ACSCtl` shows it" % (len(unread), len(bridges), ", ".join(unread[:3])))
    else:
        on = [b["bridge"] for b in bridges if b["redirect"]]
        acs = ("P2P redirect on at %s" % ", ".join(on)) if on else "no P2P redirect on the %d bridge(s) above the " \
                                                                   "GPUs" % len(bridges)
    return {"iommu": line, "acs": acs}
