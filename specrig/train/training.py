"""`inv train`: speculators' trainer on a dataset `inv verify-dataset` passed, launched as a supervised run.

Data only: returns what the host reports (remote/run/training/launch.py) and prints nothing; the views are
specrig/train/view.py. The run is an ordinary run of the host: `inv status`, `logs`, `stop` and `resume` take
it, and `resume` continues from the trainer's last checkpoint.
"""
from __future__ import annotations

from specrig.contract import TRAIN_CHECKPOINT_MINUTES
from specrig.errors import UsageError
from specrig.inventory import Host
from specrig.run.settings import supervisor_options
from specrig.slurm.submit import refuse_impossible, slurm_settings
from specrig.transport import connect

#: The launch probes torch for the GPUs (a CUDA context on each) before anything is written.
LAUNCH_TIMEOUT_S = 300


def checkpoint_minutes(value: str | float | None) -> float:
    """`--checkpoint-minutes`: a number of minutes above 0 (checked before any host is reached)."""
    if value is None:
        return TRAIN_CHECKPOINT_MINUTES
    try:
        minutes = float(value)
    except (TypeError, ValueError):
        minutes = 0.0
    if not minutes > 0 or minutes != minutes or minutes == float("inf"):
        raise UsageError(f"--checkpoint-minutes {value!r}: give the minutes of training a crash may lose, above 0",
                         hint=f"e.g. --checkpoint-minutes {TRAIN_CHECKPOINT_MINUTES:g} (the default)")
    return minutes


def train(host: Host, given: dict, *, skip_preflight: bool) -> dict:
    """Launch the training of the states `given` names (run or out): {run_id, path, kind, train: its plan,
    preflight: the checks}. A refusal (states not verified, no accelerator, a save path that cannot hold the
    checkpoints) is the host's one line, with nothing written."""
    slurm = slurm_settings(host)
    with connect(host) as remote:
        if slurm:
            refuse_impossible(remote, host, paths=[f"{host.workdir}/runs"])
        return remote.call("train.launch", {"workdir": host.workdir, "host": host.name, **given,
                                            "skip_preflight": skip_preflight, "env": dict(host.env),
                                            "options": supervisor_options(host), "slurm": slurm},
                           timeout=LAUNCH_TIMEOUT_S)
