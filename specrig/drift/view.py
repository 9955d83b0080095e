"""Drift reports for people: `inv verify-signatures`, `inv check-compat` (--json: the report itself) and
`inv compat-report`'s progress and summary.

Where the terminal is wide enough for a findings table to show every word whole, one
table per consumer file; narrower (a small terminal, or a pipe: rich then assumes 80
columns), one block per finding, as linters print them. No callee name is ever cut.
"""
from __future__ import annotations

import contextlib
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from specrig.drift.cells import STATUSES
from specrig.drift.compat_page import coverage
from specrig.drift.verify import Report
from specrig.ui import console, errors, print_indented, print_json
from specrig.ui.task import TaskView
from specrig.ui.terminal import markup, visible


def show(report: Report, *, as_json: bool, show_source: bool = False) -> None:
    """The report for people or, with as_json, for scripts; show_source adds the provider lines and patches."""
    if as_json:
        print_json(report.data)
        return
    data = report.data
    console.print(f"[bold]{markup(report.source)}[/]: {markup(_package_line(data))} "
                  f"({data['modules_parsed']} provider modules read in {data['elapsed_s']:.2f} s)")
    model = data.get("model")
    if model:
        # `resolved`: the directory, or a repo id and the cache snapshot it names.
        console.print(f"model: {markup(str(model['resolved']))} "
                      f"({', '.join(model['architectures']) or 'no architectures'}"
                      f"{', custom code' if model['custom_code'] else ''})")
    by_file: dict[str, list[dict]] = defaultdict(list)
    for finding in report.findings:
        by_file[finding["consumer"]["file"]].append(finding)
    tables = [(_findings_table(path, findings), findings) for path, findings in by_file.items()]
    if all(_fits_whole(table) for table, _ in tables):
        for table, findings in tables:
            console.print(table)
            for finding in findings if show_source else ():
                _show_source(finding)
    else:
        for finding in report.findings:
            _show_finding(finding)
            if show_source:
                _show_source(finding)
            console.print()
    counts = data["counts"]
    summary = _counts_line(counts)
    if counts.get("speed"):
        summary += " (the extraction runs correctly, only slower: `inv apply-patches` removes them)"
    if data.get("unchecked"):
        summary += f"; {len(data['unchecked'])} touch point(s) could not be decided from source (--json lists them)"
    console.print(("[red]" if counts["drift"] else "[green]") + markup(summary) + "[/]")


def _package_line(data: dict) -> str:
    def name(entry: dict) -> str:
        label = entry.get("name") or entry.get("package")
        return f"{label} {entry.get('version', '?')}"

    consumers = ", ".join(name(c) for c in data["consumers"])
    return f"{consumers} against {name(data['provider'])}"


def _counts_line(counts: dict) -> str:
    """"2 drift findings, 1 note", and the speed findings when there are any (a report made before speed
    findings existed has no count of them)."""
    line = (f"{counts['drift']} drift finding{'s' * (counts['drift'] != 1)}, "
            f"{counts['note']} note{'s' * (counts['note'] != 1)}")
    speed = counts.get("speed", 0)
    return line + (f", {speed} speed finding{'s' * (speed != 1)}" if speed else "")


#: A finding's colour by severity: drift breaks the run, a note may, speed slows it.
SEVERITY_STYLES = {"drift": "red", "note": "yellow", "speed": "cyan"}


def _kind_style(finding: dict) -> str:
    return SEVERITY_STYLES.get(finding["severity"], "red")


def _why(finding: dict) -> Text:
    """The explanation, then the catalogued fix's summary when there is one."""
    why = Text(finding["explanation"])
    if finding.get("fix"):
        why.append("\nfix: ", style="green").append(finding["fix"]["summary"])
    return why


def _fits_whole(table: Table) -> bool:
    """Whether the console is wide enough for `table` to break no word (a callee is one word).

    A table's minimum width sums each column's narrowest: its fixed width, else its longest
    word. Measured with no width limit, since rich caps a measurement at the width it is given.
    """
    return Measurement.get(console, console.options.update_width(sys.maxsize), table).minimum <= console.width


def _findings_table(path: str, findings: list[dict]) -> Table:
    # Only "why" may narrow when space is short: rich narrows wrappable columns without regard to their longest
    # word, so the callee column gets a fixed width, its longest callee. overflow="fold" everywhere: a cell
    # too narrow breaks a word across lines, never cuts it to "…".
    callee_header = "callee / code"
    callee_width = max(len(callee_header), *(len(f["callee"]) for f in findings))
    table = Table(title=markup(path), title_justify="left", show_lines=True, expand=True)
    table.add_column("line", justify="right", no_wrap=True, overflow="fold")
    table.add_column("kind", no_wrap=True, overflow="fold")
    table.add_column(callee_header, width=callee_width, overflow="fold")
    table.add_column("why", overflow="fold")
    for finding in findings:
        consumer = finding["consumer"]
        table.add_row(str(consumer["line"]), Text(finding["kind"], style=_kind_style(finding)),
                      Text(finding["callee"]).append("\n" + consumer["text"].strip(), style="dim"), _why(finding))
    return table


def _show_finding(finding: dict) -> None:
    """One finding as a block: `file:line  kind  callee` on one line, then, indented, the consumer's line,
    why it fails and the fix."""
    consumer = finding["consumer"]
    header = Text.assemble((f"{consumer['file']}:{consumer['line']}", "bold"), "  ",
                           (finding["kind"], _kind_style(finding)), "  ", finding["callee"])
    # soft_wrap: rich neither breaks nor crops this line; a terminal wraps it, a pipe or an editor gets it whole.
    console.print(header, soft_wrap=True)
    for text in (Text(consumer["text"].strip(), style="dim"), _why(finding)):
        print_indented(text)


def _show_source(finding: dict) -> None:
    """--show-source: the provider's lines the finding points at, and the catalogued fix's patch."""
    provider, fix = finding.get("provider"), finding.get("fix")
    if not provider and not fix:
        return
    # Ids and paths hold callee names: printed whole (soft_wrap), never broken by rich.
    console.print(f"[dim]{markup(finding['id'])}[/]", soft_wrap=True)
    if provider:
        console.print(f"{markup(provider['file'])}:{provider['start']}-{provider['end']}", soft_wrap=True)
        console.print(Syntax(visible(provider["text"]), "python", line_numbers=True, start_line=provider["start"],
                             word_wrap=True))
    if fix:
        console.print(Syntax(visible(fix["patch"]), "diff", word_wrap=True))


def show_matrix(result: dict, *, as_json: bool) -> None:
    """`inv check-compat --matrix`: drift counts, speculators versions down, vLLM versions across."""
    if as_json:
        print_json(result)
        return
    table = Table(title="drift findings (rows: speculators, columns: vLLM)")
    table.add_column("speculators", overflow="fold")
    for vllm in result["columns"]:
        table.add_column(vllm, justify="right", overflow="fold")
    for spec in result["rows"]:
        row = [spec]
        for vllm in result["columns"]:
            count = result["cells"][spec][vllm]
            row.append(f"[{'red' if count else 'green'}]{count}[/]")
        table.add_row(*row)
    console.print(table)


def verify_figures(report: Report) -> str:
    """A host's drift report in a line (a group's `inv verify-signatures`)."""
    counts = report.data["counts"]
    consumers = ", ".join(f"{c.get('name') or c.get('package')} {c.get('version', '?')}"
                          for c in report.data["consumers"])
    provider = report.data["provider"]
    speed = f", {counts['speed']} speed finding(s)" if counts.get("speed") else ""
    return (f"{counts['drift']} drift finding(s), {counts['note']} note(s){speed}; {consumers} against "
            f"{provider.get('name') or provider.get('package')} {provider.get('version', '?')}")


def verify_view(*, show_source: bool) -> TaskView:
    """`inv verify-signatures`: the report (exit 1 when it holds drift); --json its data."""
    return TaskView("verify-signatures",
                    show=lambda report, *, host, as_json: show(report, as_json=as_json, show_source=show_source),
                    figures=verify_figures, judge=lambda report: report.exit_status,
                    result_json=lambda report: report.data)


@contextlib.contextmanager
def compat_report_progress(*, total: int, as_json: bool) -> Iterator[Callable[[str, str, str], None]]:
    """`inv compat-report` while it builds: a bar over the pairs, naming the last one and how it was had
    (on stderr, so --json's stdout stays the data alone; none under --json)."""
    if as_json:
        yield lambda spec, vllm, how: None
        return
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=errors, transient=True)
    bar = progress.add_task("pairs", total=total)
    with progress:
        yield lambda spec, vllm, how: progress.update(
            bar, advance=1, description=f"speculators {spec} × vLLM {vllm}: {how}")


def show_compat_report(matrix: dict, *, pages: list[Path], as_json: bool) -> None:
    """The matrix's data (--json), or one line: where the pages are, what they cover, what each cell says."""
    if as_json:
        print_json(matrix)
        return
    counts = Counter(cell["status"] for row in matrix["cells"].values() for cell in row.values())
    statuses = ", ".join(f"{counts[status]} {status}" for status in STATUSES)
    console.print(f"{markup(' and '.join(str(p) for p in pages))}: {markup(coverage(matrix))}; {statuses}; "
                  f"{len(matrix['analyzed'])} pair(s) analyzed, {matrix['cached']} from the cache", soft_wrap=True)
