"""specrig: bring up EAGLE-3 hidden-state extraction on remote GPU hosts whose vLLM drifted."""

__version__ = "0.1.0"
