"""What `inv train` shows: the preflight's checks, the plan (the trainer's command, the checkpoint frequency and
the work a crash may lose), then the run live as an extraction's (specrig/run/live.py)."""
from __future__ import annotations

from collections.abc import Callable

from specrig.exit_status import ExitStatus
from specrig.inventory import Host
from specrig.run.view_parts import checkpoint_plan_text
from specrig.ui import console, print_json
from specrig.ui.preflight_checks import show_checks
from specrig.ui.task import TaskView
from specrig.ui.terminal import markup


def show_train(result: dict, *, host: Host, as_json: bool, follow: Callable[[Host, str], ExitStatus] | None
               ) -> ExitStatus | None:
    if as_json:
        print_json(result)
        return None
    if result.get("preflight"):
        show_checks(result["preflight"])
    plan = result["train"]
    console.print(f"launched training run [bold]{markup(result['run_id'])}[/] on {host.name}: "
                  f"{plan['epochs']} epochs, ~{plan['steps_per_epoch']} steps each on {plan['gpus']} GPU(s), "
                  f"--total-seq-len {plan['total_seq_len']}")
    console.print(f"checkpoints under {markup(plan['save_path'])}; {checkpoint_plan_text(plan['checkpoint'])}, "
                  f"planned again from the measured rate at every restart")
    if result.get("slurm"):
        console.print(f"submitted Slurm job {markup(result['slurm']['job_id'])}")
    return follow(host, result["run_id"]) if follow else None


def show_refused(found, *, host: Host, as_json: bool) -> None:
    """A refused launch (remote/run/training/launch.py): its checks where it ran them; the one line follows."""
    checks = found.payload if isinstance(found.payload, list) else []
    if as_json:
        print_json({"launched": False, "preflight": checks, "error": found.one_line()})
    elif checks:
        show_checks(checks)


def train_view(follow: Callable[[Host, str], ExitStatus] | None) -> TaskView:
    return TaskView("train", show=lambda result, *, host, as_json: show_train(result, host=host, as_json=as_json,
                                                                             follow=follow),
                    figures=lambda result: f"training run {result['run_id']} launched", show_findings=show_refused)
