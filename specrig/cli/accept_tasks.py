"""`inv accept`: a trained EAGLE-3 draft served with its target by the host's vLLM, its acceptance measured
beside an untrained draft of the same shape (issue 36; docs/acceptance.md). Added to the namespace of
specrig/cli/tasks.py; thin as its tasks are: options checked, then specrig/train/accept.py's data function and
its view (specrig/train/accept_view.py) handed to the runner."""
from __future__ import annotations

from specrig.cli.guard import guarded, task, whole_number
from specrig.cli.runner import run_task
from specrig.errors import UsageError
from specrig.exit_status import ExitStatus

HELP = {
    "host": "host name from hosts.yaml",
    "draft": "the draft: a checkpoint directory of `speculators train` on the host (<save_path>/<epoch> or "
             "<save_path>/checkpoint_best)",
    "run": "instead of --draft: an acceptance run's id, to follow it and show its report",
    "untrained": "the draft to compare with: auto (made on the host with the draft's training command and "
                 "--dry-run), none, or a checkpoint directory (default auto)",
    "model": "the target: a directory or Hugging Face id on the host (default: the verifier in the draft's config)",
    "prompts": "a jsonl of conversations on the host (default: the dataset of the extraction the draft was "
               "trained on, from the first row it did not use)",
    "first_row": "the first row of --prompts to use",
    "num_prompts": "prompts to generate from (default 64)",
    "max_tokens": "tokens to generate per prompt, greedy (default 128)",
    "k": "speculative tokens per step, -k N (default 3)",
    "tp": "tensor parallel size of the target (default 1)",
    "detach": "return once launched instead of following the run to its report",
    "json": "print JSON for scripts instead of tables (a launch returns at once)",
}


@task(help=HELP)
@guarded
def accept(c, host, draft=None, run=None, untrained="auto", model=None, prompts=None, first_row=None,
           num_prompts=None, max_tokens=None, k=None, tp=None, detach=False, json=False):
    """Prove a draft speeds up its target: vLLM serves the target with it (EAGLE-3, greedy) on prompts it was not
    trained on, then with an untrained draft of the same shape; per-position acceptance and the mean acceptance
    length side by side. Exit 0: clearly better (position 0's 95% bounds do not overlap); 1: not, or the run
    failed; 2: bad input, nothing changed on the host. Ctrl-C detaches; the run goes on."""
    from specrig.train import accept as acceptance
    from specrig.train.accept_view import ACCEPT
    from specrig.ui import console

    if (draft is None) == (run is None):
        raise UsageError("give --draft DIR (a new measurement) or --run ID (an acceptance run's report), one of them")
    if not untrained:
        raise UsageError(f"--untrained {untrained!r}: auto, none or a checkpoint directory on the host")
    sizes = acceptance.check_sizes({
        "first_row": whole_number(first_row, option="--first-row", default=None),
        "num_prompts": whole_number(num_prompts, option="--num-prompts", default=None),
        "max_tokens": whole_number(max_tokens, option="--max-tokens", default=None),
        "k": whole_number(k, option="-k", default=None), "tp": whole_number(tp, option="--tp", default=None)})
    seen = {"run_id": run, "step": None}

    def follow(status: dict) -> None:
        seen["run_id"] = status["run_id"]
        beat = status.get("heartbeat") or {}
        step = (status["state"], beat.get("phase"), beat.get("draft"), beat.get("prompts_done"))
        if step != seen["step"] and not json:
            seen["step"] = step
            done = f", {beat['prompts_done']}/{beat['prompts_total']} prompts" if "prompts_total" in beat else ""
            console.print(f"{status['run_id']}: {status['state']}, {beat.get('phase') or '-'} "
                          f"{beat.get('draft') or ''}{done}", markup=False)

    if run is not None:
        def work(target):
            return acceptance.report(target, run, on_update=None if detach else follow)
    else:
        given = {"draft": draft, "untrained": untrained, "model": model, "prompts": prompts, **sizes}

        def work(target):
            return acceptance.launch(target, given, on_update=None if detach or json else follow)
    try:
        return run_task(host, work, ACCEPT, as_json=json)
    except KeyboardInterrupt:
        console.print(f"detached; the run goes on. `inv accept --host {host} --run {seen['run_id']}` follows it, "
                      f"`inv stop --host {host} --run {seen['run_id']}` ends it.", markup=False)
        return ExitStatus.INTERRUPTED
