"""`python -m specrig`: the `specrig` command (specrig/cli/program.py)."""
from specrig.cli.program import main

main()
