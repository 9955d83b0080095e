"""The names run/server/workload.py and run/server/node_roles.py import from here, where the supervisor's
loop and its attempt's parts were one module: now run/supervisor_loop.py (NodeRole) and run/attempt.py
(the rest). run/server/ is being changed on another branch; once its two imports name those modules,
this file goes."""
from run.attempt import POLL_S, RETRY, AttemptEnds, NotStarted, Watch, child_env, found_failure, log_since, log_size
from run.supervisor_loop import NodeRole

__all__ = ["POLL_S", "RETRY", "AttemptEnds", "NodeRole", "NotStarted", "Watch", "child_env", "found_failure",
           "log_since", "log_size"]
