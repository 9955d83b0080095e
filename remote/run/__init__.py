"""The run stage, host half: preflight, smoke, supervised runs (runs.py; the supervisor program
supervisor.py, its loop supervision.py and the in-process workload in_process.py; rundir.py), the
extraction driver, the failure classifier, and server mode (server/: speculators >= 0.8)."""
