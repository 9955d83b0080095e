"""The fault matrix: its cells as data (cells.py) and its tests (issue 35)."""
