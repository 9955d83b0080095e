"""Slurm, laptop half: a host that is a cluster's login node (hosts.yaml's `scheduler: slurm`). Its
`slurm:` settings checked (settings.py); what is refused before anything is submitted (submit.py); a
sharded run as one job array (job_array.py) and a multi-node job in one allocation (node_job.py); how
people see a run's job and these submissions (view.py) and the cluster in `inv doctor`
(cluster_view.py). The host half is remote/slurm/."""
