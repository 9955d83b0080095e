"""The command line: the task namespace (tasks.py), the `specrig` program, and how a task fails (guard.py)."""
