"""Slurm, laptop half: a host that is a cluster's login node (hosts.yaml's `scheduler: slurm`), its
`slurm:` settings (settings.py). The host half is remote/slurm/."""
