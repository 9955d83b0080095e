"""What accelerator the trainer's torch sees: `<python> accelerator.py`, one JSON line on stdout.

Run by the training's launch (run/training/launch.py) with the python that trains, before anything is
written: speculators 0.9's trainer needs an accelerator, and without one it stops only after it has built
the draft and its data loaders ("Cannot access accelerator device when none is available"). A program whose
job is to ask torch, so it imports torch; nothing else on the host side does.
"""
import json
import sys


def main():
    try:
        import torch
    except ImportError as exc:
        print(json.dumps({"torch": None, "error": "%s: %s" % (type(exc).__name__, exc)}))
        return 0
    found = {"torch": torch.__version__, "accelerator": None, "count": 0, "devices": []}
    accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    if accelerator is None and torch.cuda.is_available():
        accelerator = torch.device("cuda")
    if accelerator is not None:
        module = torch.get_device_module(accelerator.type)
        found.update(accelerator=accelerator.type, count=module.device_count())
        for index in range(found["count"]):
            properties = module.get_device_properties(index)
            found["devices"].append({"name": getattr(properties, "name", accelerator.type),
                                     "total_mib": getattr(properties, "total_memory", 0) // 2 ** 20})
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
