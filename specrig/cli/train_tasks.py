"""`inv train`: the training of a draft on extracted states, supervised as an extraction (issue 36).

Its own module beside specrig/cli/tasks.py, which gathers it into the one namespace; heavy imports inside
the task, as there.
"""
from specrig.cli.guard import guarded, task, whole_number
from specrig.cli.runner import run_task
from specrig.errors import UsageError

HOST_HELP = "host name from hosts.yaml, or 'local'; or a group, 'all', or a comma list (each trains its own states)"


@task(help={"host": HOST_HELP,
            "run": "the extraction run whose output to train on (its states must have passed verify-dataset)",
            "out": "or: the directory of states `inv verify-dataset` checked (a job array's merged one)",
            "gpus": "train on N GPUs of the host through torchrun (default 1)",
            "epochs": "epochs to train (default: the command's, else speculators' 20)",
            "max_steps": "stop after N optimizer steps in all",
            "total_seq_len": "tokens packed into one step per GPU (speculators' default 8192; lower it when the "
                             "GPU runs out of memory)",
            "checkpoint_minutes": "the minutes of training a crash may lose (default 15): the checkpoint frequency "
                                  "follows from the measured step rate",
            "save_path": "where the checkpoints go (default: the command's, <out>-draft)",
            "no_compile": "run the draft without torch.compile (TORCHDYNAMO_DISABLE=1)",
            "collective_safe": "NCCL_P2P_DISABLE=1 for the ranks (when the preflight's probe passes only so)",
            "skip_preflight": "launch without asking torch for the GPUs and without the room check",
            "detach": "launch and return at once instead of showing the live view",
            "json": "print JSON for scripts instead of tables"})
@guarded
def train(c, host, run=None, out=None, gpus=None, epochs=None, max_steps=None, total_seq_len=None,
          checkpoint_minutes=None, save_path=None, no_compile=False, collective_safe=False, skip_preflight=False,
          detach=False, json=False):
    """Train an EAGLE-3 draft on extracted states that `inv verify-dataset` passed, supervised and live.

    Runs the training command verify-dataset wrote, detached on the host: `inv status`, `logs`, `stop` (the
    trainer saves a checkpoint first) and `resume` (from its last checkpoint) take the run. A crashed trainer
    is restarted from its last checkpoint; out of GPU memory, a torch.compile failure and a full disk are
    named with their fix and not restarted. Exit 0 launched (attached: trained), 1 refused or failed, 2 bad
    input."""
    from specrig.run import live
    from specrig.train import training
    from specrig.train.view import train_view

    if bool(run) == bool(out):
        raise UsageError("name the states to train on: --run ID or --out DIR, one of them",
                         hint="`inv verify-dataset --host HOST --run ID` first; then `inv train --host HOST --run ID`")
    given = {"run": run, "out": out, "save_path": save_path, "no_compile": no_compile,
             "collective_safe": collective_safe,
             "gpus": whole_number(gpus, option="--gpus", default=None),
             "epochs": whole_number(epochs, option="--epochs", default=None),
             "max_steps": whole_number(max_steps, option="--max-steps", default=None),
             "total_seq_len": whole_number(total_seq_len, option="--total-seq-len", default=None),
             "checkpoint_minutes": training.checkpoint_minutes(checkpoint_minutes)}
    attach = not (detach or json)
    return run_task(host, lambda target: training.train(target, given, skip_preflight=skip_preflight),
                    train_view(live.follow if attach else None), as_json=json)
