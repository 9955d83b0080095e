"""Slurm, host half: what a cluster's login node sees of its cluster (cluster.py, for doctor) and
Slurm's own formats, read on both sides (formats.py)."""
