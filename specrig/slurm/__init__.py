"""Slurm, laptop half: a host that is a cluster's login node (hosts.yaml's `scheduler: slurm`). What is
refused before anything is submitted (submit.py); how people see a run's job and the submissions (view.py).
It stands below the run stage, which launches runs as Slurm jobs (specrig/run/slurm_job_array.py,
specrig/run/slurm_node_job.py); below it stand hosts.yaml's `slurm:` settings (specrig/slurm_settings.py,
read by the inventory) and the cluster in `inv doctor` (specrig/ui/slurm_cluster.py). The host half is
remote/slurm/."""
