"""An acceptance measurement (run kind "accept", issue 36): the target served by vLLM with an EAGLE-3 draft,
then with an untrained draft of the same shape, on prompts the draft was not trained on; the acceptance rates
side by side, with a verdict (docs/acceptance.md).

    launch.py    the `accept.launch` remote command: arguments checked, the run's plan, the run started
    draft.py     a speculators draft checkpoint: its config, its training command, the untrained twin's command
    measure.py   the program the supervisor runs: the untrained draft made, each draft measured in a fresh vLLM
    verdict.py   the results read back: rates per position, mean acceptance length, the verdict
    workload.py  the supervisor's workload for the kind (run/supervisor_loop.py)
"""
