"""The run stage, host half: preflight, smoke, supervised runs (the runs.* commands: launching.py, stop.py,
status.py, output_check.py; the supervisor program supervisor.py, its loop supervisor_loop.py, what an
attempt is built with attempt.py and the in-process workload in_process.py; a run's processes
processes.py), the extraction driver, the failure classifier, and server mode (server/: speculators >= 0.8).
A run on a Slurm cluster is submitted by slurm/, stopped by slurm_stop.py and, over several nodes, started
by slurm_allocation.py. The top stage: it imports the ground and the stages below it, none imports it."""
