"""Slurm, host half: what a cluster's login node sees of its cluster (cluster.py, for doctor), Slurm's
own formats, read on both sides (formats.py), whether a job's request fits a partition (partition_fit.py),
supervised runs as jobs (jobs.py the scripts and sbatch; submission.py a run, an array's tasks or a
multi-node job's runs submitted; time_limit.py what a time limit means for its run), and a call (smoke) run
as a job (jobs.py). What Slurm says of a job is asked in the ground (base/slurm_queries.py); a run's stop by
scancel and a multi-node job's start are the run stage's (run/slurm_stop.py, run/slurm_allocation.py)."""
