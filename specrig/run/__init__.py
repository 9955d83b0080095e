"""The run stage, laptop half: settings, preflight, supervised runs, smoke, a run as Slurm jobs, and their views (remote/run/ does the work)."""
