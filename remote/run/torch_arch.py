"""What the installed torch was built for, without touching a GPU: `<python> torch_arch.py`.

Prints one JSON line:

    {"installed": bool, "version": "2.11.0+cu130", "cuda": "13.0"|null, "hip": str|null,
     "arch_list": ["sm_75", ..., "compute_120"], "cuda_initialized": false, "error": str|null}

`arch_list` is the list of GPU architectures torch's kernels were compiled for (sm_XY: machine
code for capability X.Y; compute_XY: PTX the driver can compile for X.Y and newer). It is read
from the build (torch._C._cuda_getArchFlags), not from torch.cuda.get_arch_list(), which first
asks for the device count. Importing torch loads its libraries but makes no CUDA context and
allocates nothing on a GPU; `cuda_initialized` reports that it stayed so.

Run by preflight with the extraction environment's python (the host python itself): the only
file of remote/ besides the driver that imports torch, and only in its own process.
"""
import json
import sys


def read():
    try:
        import torch
    except ImportError as exc:
        return {"installed": False, "version": None, "cuda": None, "hip": None, "arch_list": [],
                "cuda_initialized": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    except Exception as exc:  # a broken install (missing libcudart, ABI mismatch) fails at import
        return {"installed": True, "version": None, "cuda": None, "hip": None, "arch_list": [],
                "cuda_initialized": False, "error": "import torch failed: %s: %s" % (type(exc).__name__, exc)}
    version = getattr(torch, "__version__", None)
    cuda = getattr(torch.version, "cuda", None)
    hip = getattr(torch.version, "hip", None)
    flags = None
    getter = getattr(torch._C, "_cuda_getArchFlags", None)  # absent from CPU-only builds
    if getter is not None:
        flags = getter()
    return {"installed": True, "version": str(version) if version else None, "cuda": cuda, "hip": hip,
            "arch_list": flags.split() if flags else [],
            "cuda_initialized": bool(torch.cuda.is_initialized()), "error": None}


if __name__ == "__main__":
    # Run by path: sys.path[0] is remote/run/, whose module names must not shadow torch's imports.
    sys.path.pop(0)
    sys.stdout.write(json.dumps(read()) + "\n")
