"""The run stage, host half: preflight, smoke, supervised runs (runs.py, supervisor.py, rundir.py), the extraction driver, and the failure classifier."""
