"""The run stage, laptop half: settings, preflight, supervised runs, smoke, and their views (remote/run/ does the work)."""
