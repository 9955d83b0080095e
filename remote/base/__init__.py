"""The host side's shared ground: what two stages or more need (files written whole, processes, units,
versions, package metadata, the contracts, the run's records and output formats, Slurm's job queries).

It imports no stage and no entry module; every stage imports it (`from base import contract`).
"""
