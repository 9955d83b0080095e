"""What the host is: shell, Python, installed packages, GPUs, free disk."""
import os
import platform
import pwd
import shutil
import sys

import pkgmeta
import telemetry

PACKAGES = ("speculators", "vllm", "torch", "transformers")


def _existing_parent(path):
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def run(args):
    workdir = os.path.expanduser(args.get("workdir") or "~")
    usage = shutil.disk_usage(_existing_parent(workdir))
    return {
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "hostname": platform.node(),
        "login_shell": pwd.getpwuid(os.getuid()).pw_shell,
        "python": {"executable": sys.executable, "version": platform.python_version(), "prefix": sys.prefix},
        "packages": pkgmeta.versions(PACKAGES),
        "gpu": telemetry.gpus(),
        "disk": {"path": workdir, "exists": os.path.isdir(workdir), "free_bytes": usage.free,
                 "total_bytes": usage.total},
    }
