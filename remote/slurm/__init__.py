"""Slurm, host half: what a cluster's login node sees of its cluster (cluster.py, for doctor), Slurm's
own formats, read on both sides (formats.py), whether a job's request fits a partition (partition_fit.py),
supervised runs as jobs (jobs.py the scripts, sbatch and what Slurm says of a job; submission.py a run,
an array's tasks or a multi-node job's runs submitted; cancellation.py `inv stop` by scancel;
allocation.py a multi-node job's nodes filled in at its start; time_limit.py what a time limit means for
its run), and a call (smoke) run as a job (jobs.py)."""
