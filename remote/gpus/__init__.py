"""The GPUs as collectives see them (issue 38): topology, PCIe path, versions, the collective probe; stdlib only
(the probe's ranks, remote/gpus/collective_rank.py, import torch in the run's environment)."""
