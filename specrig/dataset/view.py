"""`inv verify-dataset` for people: the verdict, the counts, every bad row with its reason, the refusals and the
training command; a sharded run's hosts and their union. Host text is escaped (`markup`, `visible`)."""
from __future__ import annotations

from pathlib import PurePosixPath

from rich.table import Table

from specrig.dataset.verify import judge
from specrig.exit_status import ExitStatus, most_serious
from specrig.group import GroupResult
from specrig.inventory import Host
from specrig.ui import console, human_bytes, print_indented, print_json
from specrig.ui.group import outcomes_json, show_summary
from specrig.ui.task import TaskView
from specrig.ui.terminal import markup, visible


def figures(result: dict) -> str:
    counts = result["counts"]
    verdict = "trainable" if result["trainable"] else (
        f"NOT trainable: {len(result['bad'])} bad row(s), {len(result['refusals']) + len(result['problems'])} "
        f"other problem(s)")
    return f"{counts['rows']} rows, {human_bytes(counts['bytes'])}: {verdict}"


def show(result: dict, *, host: Host, as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    trainer = result["trainer"]
    outs = ", ".join(share["out"] for share in result["shares"])
    verdict = "[bold green]trainable[/]" if result["trainable"] else "[bold red]NOT trainable[/]"
    console.print(f"{verdict} by speculators {markup(trainer['version'] or '?')} "
                  f"({markup(trainer['command'] or 'no trainer reads extraction outputs')})")
    console.print(f"output: {markup(host.name)}:{markup(outs)}", soft_wrap=True)
    plan = result["plan"]
    console.print(f"layers {plan['layer_ids']} (the last the verifier's), hidden size {plan['hidden_size']}, "
                  f"{markup(plan['storage'])} storage, {markup(result['format'])} files")
    counts = result["counts"]
    table = Table(show_header=True, box=None, pad_edge=False)
    for column in ("rows", "files", "tokens", "bytes", "loaded by the trainer's code"):
        table.add_column(column, justify="right")
    loaded = f"{counts['loaded']} ({'all' if result['full'] else 'a sample; --full: all'})"
    table.add_row(str(counts["rows"]), str(counts["files"]), str(counts["tokens"]), human_bytes(counts["bytes"]),
                  loaded)
    console.print(table)
    if result["bad"]:
        rows = Table(title=f"{len(result['bad'])} bad row(s)", title_justify="left", box=None, pad_edge=False)
        rows.add_column("row", justify="right", no_wrap=True)
        rows.add_column("reason")
        for bad in result["bad"]:
            rows.add_row(str(bad["row"]), markup(bad["reason"]))
        console.print(rows)
    for line in result["refusals"]:
        print_indented(f"[bold red]refused:[/] {markup(line)}", indent=0)
    for line in result["problems"]:
        print_indented(f"[bold red]problem:[/] {markup(line)}", indent=0)
    vocab = result["vocab"]
    if vocab.get("note"):
        print_indented(f"vocabulary: {markup(vocab['note'])}", indent=0)
    for line in result["notes"]:
        print_indented(f"note: {markup(line)}", indent=0)
    if result["command_line"]:
        where = f" (written to {markup(result['command_file'])})" if result["command_file"] else ""
        console.print(f"training command{where}:")
        console.print(visible(result["command_line"]), markup=False, soft_wrap=True)


def run_end_text(dataset: dict) -> str:
    """What a run's end recorded of its dataset (exit.json's "dataset", remote/dataset/verify.py at_run_end)."""
    if not dataset.get("verified"):
        return f"[bold red]not verified[/]: {markup(dataset.get('error') or '?')}"
    if dataset["trainable"]:
        # The run's own output holds the file (its path is the row above): its name fits 80 columns.
        name = PurePosixPath(dataset["command_file"]).name if dataset["command_file"] else "-"
        return f"[green]trainable[/]: {dataset['rows']} rows; the command is the output's {markup(name)}"
    return (f"[bold red]NOT trainable[/]: {dataset['bad_rows']} bad row(s), {len(dataset['problems'])} other "
            f"problem(s); `inv verify-dataset` names them")


DATASET = TaskView("verify-dataset", show=show, figures=figures, judge=judge)


def show_group(run_id: str | None, shards: GroupResult, found: dict, *, as_json: bool) -> ExitStatus:
    """A sharded run over several hosts: each host's line, then what the shards are together."""
    if as_json:
        print_json({"run": run_id, **found, "hosts": outcomes_json(shards.outcomes)})
    else:
        show_summary(f"verify-dataset {run_id or ''}".strip(), shards.outcomes, figures=figures)
        if found["trainable"]:
            console.print(f"trainable: {found['rows']} rows, every one once", markup=False)
        for line in found["problems"]:
            print_indented(f"[bold red]problem:[/] {markup(line)}", indent=0)
    return most_serious([shards.exit_status, ExitStatus.OK if found["trainable"] else ExitStatus.FINDINGS])
