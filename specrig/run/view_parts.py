"""What the views of every run shape draw alike: a launch's notes on its layers and storage, the verdict on
a run followed to its end, the samples of several runs added up. One place, so that one run (view.py), a
sharded run (sharded_view.py) and a multi-node job (node_view.py) say them the same way. A preflight's
checks, which a Slurm submission's view draws too, are specrig/ui/preflight_checks.py's.
"""
from __future__ import annotations

from collections.abc import Sequence

from specrig.contract import SUCCEEDED
from specrig.exit_status import ExitStatus
from specrig.ui import console
from specrig.ui.group import OUTPUT_LOCK
from specrig.ui.terminal import markup


def final_verdict(result: dict) -> ExitStatus:
    """A result that followed its run to the end ("final"): OK only if the run succeeded."""
    final = result.get("final")
    return ExitStatus.OK if final is None or final["state"] == SUCCEEDED else ExitStatus.FINDINGS


def layers_note(layers: dict | None, source: str | None) -> str | None:
    """One line when a server-mode run stores other layer ids than speculators' training takes by default:
    a choice when --layers asked for them, a warning when they come from hosts.yaml (issue 17)."""
    if not layers or layers["ids"] == layers["training_default"]:
        return None
    ids, default = layers["ids"], layers["training_default"]
    if source == "--layers":
        return (f"layers {ids}, as --layers asks; speculators' training defaults to {default}: "
                f"train with these ids (specrig-layers.json beside the files records them)")
    return (f"[yellow]warning:[/] layers {ids} ({markup(source or 'the run')}) differ from speculators' training "
            f"default {default}, which training assumes: pass --layers to choose them, or drop that setting")


def storage_note(storage: dict | None) -> str | None:
    """One line when a server-mode run stores fp8: which connector writes, and how training reads the files."""
    if not storage or storage["type"] != "fp8":
        return None
    return (f"fp8 storage: {markup(storage['connector'])} writes the files (hidden_states F8_E4M3 with per-token "
            f"scales); speculators' training reads them with --hidden-states-backend fp8")


def show_layers_note(launched: dict, *, host: str | None = None) -> None:
    """layers_note's line for a launch (its `layers` and `layers_source`), if it has one; on a group
    (a shard, a multi-node job) `host` says whose."""
    note = layers_note(launched.get("layers"), launched.get("layers_source"))
    if note:
        with OUTPUT_LOCK:
            console.print(f"[bold]{markup(host)}[/]: {note}" if host else note)


def runs_total(runs: Sequence[dict]) -> str | None:
    """The total line of several hosts' runs: their samples added up, how many runs in each state."""
    done = total = hosts = 0
    states: dict[str, int] = {}
    for run in runs:
        beat = run.get("heartbeat") or {}
        hosts += 1
        states[run["state"]] = states.get(run["state"], 0) + 1
        done += beat.get("samples_done") or 0
        total += beat.get("samples_total") or 0
    if not hosts:
        return None
    return (f"total: {done}/{total or '?'} samples over {hosts} host(s) ("
            + ", ".join(f"{n} {state}" for state, n in states.items()) + ")")


def training_text(training: dict | None, plan: dict | None = None) -> str | None:
    """A training run's progress in one line (status.json "training", remote/run/training/progress.py): epoch,
    step, loss, the trainer's first accuracy figure, tokens/s, ETA and the last checkpoint; None before any."""
    if not training:
        return None
    parts = []
    if training.get("epoch") is not None:
        parts.append(f"epoch {training['epoch'] + 1}/{training.get('epochs') or '?'}")
    if training.get("step") is not None:
        per_epoch = training.get("steps_per_epoch") or f"~{training.get('steps_per_epoch_planned') or '?'}"
        parts.append(f"step {training['step']}/{per_epoch}")
    if training.get("global_step") is not None:
        parts.append(f"{training['global_step']}/{training.get('total_steps') or '?'} in all")
    if training.get("loss") is not None:
        parts.append(f"loss {training['loss']:.3f}")
    accuracy = training.get("accuracy") or {}
    if "full_acc_0" in accuracy:
        parts.append(f"acc@1 {accuracy['full_acc_0']:.2f}")
    if training.get("tokens_per_s"):
        parts.append(f"{training['tokens_per_s']:,.0f} tok/s")
    if training.get("eta_s") is not None:
        parts.append(f"ETA {format_duration(training['eta_s'])}")
    if training.get("memory_mib"):
        parts.append(f"{training['memory_mib'] / 1024:.1f} GiB")
    checkpoint = training.get("last_checkpoint")
    if checkpoint:
        where = f"step {checkpoint['local_step']}" if checkpoint["local_step"] else "its end"
        parts.append(f"last checkpoint: epoch {checkpoint['epoch'] + 1}, {where}")
    else:
        parts.append("no checkpoint yet")
    if plan:
        parts.append(checkpoint_plan_text(plan, step_s=training.get("step_s")))
    return ", ".join(parts)


def checkpoint_plan_text(plan: dict, *, step_s: float | None = None) -> str:
    """How often the trainer checkpoints, and the work a crash may lose at that rate; and at the measured
    `step_s` where the plan was made before any step was timed (the next attempt plans with it)."""
    lost = plan["every_steps"] * plan["step_s"]
    rate = "measured" if plan["basis"] == "measured" else "planned"
    text = (f"a checkpoint every {plan['every_steps']} steps: a crash loses at most ~{format_duration(lost)} "
            f"at the {rate} {plan['step_s']:.2f} s/step")
    if plan["basis"] != "measured" and step_s:
        text += f" (~{format_duration(plan['every_steps'] * step_s)} at the measured {step_s:.2f})"
    return text


def format_duration(seconds: float) -> str:
    """A duration as the run views show one: "1h02m", "0m27s"."""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
