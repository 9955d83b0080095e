"""`inv verify-signatures`: the drift report of a host's environment, and how people see it.

The analysis runs on the host (remote/verify.py → remote/drift/); only its JSON
comes back. docs/findings.md documents that JSON and the finding ids.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

from specrig.errors import CouldNotCheck, UsageError
from specrig.exit_status import ExitStatus
from specrig.inventory import Host
from specrig.transport import Remote, connect
from specrig.ui import console, print_json

VERIFY_TIMEOUT_S = 300

@dataclass(frozen=True)
class Report:
    """One analysis result (docs/findings.md) and where it came from."""

    data: dict
    #: The host name, or a description such as "wheels" for check-compat.
    source: str

    def __post_init__(self):
        if not isinstance(self.data, dict) or "findings" not in self.data:
            raise ValueError(f"not a drift report: {self.data!r:.200}")

    @property
    def findings(self) -> list[dict]:
        return self.data["findings"]

    @property
    def drift(self) -> list[dict]:
        return [f for f in self.findings if f["severity"] == "drift"]

    @property
    def ids(self) -> set[str]:
        return {f["id"] for f in self.drift}

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.FINDINGS if self.drift else ExitStatus.OK


def verify_host(remote: Remote, *, model: str | None = None) -> Report:
    """Run the analysis on a connected host (one call on an open connection: apply-patches reuses it)."""
    args = {"consumers": ["speculators"], "provider": "vllm"}
    if model:
        args["model"] = model
    try:
        data = remote.call("verify", args, timeout=VERIFY_TIMEOUT_S)
    except CouldNotCheck:
        raise
    except UsageError as exc:
        # The one argument of this call a host can find bad is the model directory.
        raise CouldNotCheck(exc.message, hint=f"check --model {model!r}: it must be a model directory on the "
                                              f"host holding config.json") from None
    return Report(data=data, source=remote.host.name)


def verify(host: Host, *, model: str | None = None) -> Report:
    """`inv verify-signatures`: one connection, one remote call."""
    with connect(host) as remote:
        return verify_host(remote, model=model)


def _package_line(data: dict) -> str:
    def name(entry: dict) -> str:
        label = entry.get("name") or entry.get("package")
        return f"{label} {entry.get('version', '?')}"

    consumers = ", ".join(name(c) for c in data["consumers"])
    return f"{consumers} against {name(data['provider'])}"


def show(report: Report, *, as_json: bool, show_source: bool = False) -> None:
    """The report for people (a table per consumer file) or, with as_json, for scripts."""
    if as_json:
        print_json(report.data)
        return
    data = report.data
    console.print(f"[bold]{escape(report.source)}[/]: {escape(_package_line(data))} "
                  f"({data['modules_parsed']} provider modules read in {data['elapsed_s']:.2f} s)")
    model = data.get("model")
    if model:
        console.print(f"model: {escape(str(model['path']))} "
                      f"({', '.join(model['architectures']) or 'no architectures'}"
                      f"{', custom code' if model['custom_code'] else ''})")
    by_file: dict[str, list[dict]] = defaultdict(list)
    for finding in report.findings:
        by_file[finding["consumer"]["file"]].append(finding)
    for path, findings in by_file.items():
        table = Table(title=escape(path), title_justify="left", show_lines=True, expand=True)
        table.add_column("line", justify="right", no_wrap=True)
        table.add_column("kind", no_wrap=True)
        table.add_column("callee / code", overflow="fold")
        table.add_column("why")
        for finding in findings:
            style = "yellow" if finding["severity"] == "note" else "red"
            consumer = finding["consumer"]
            table.add_row(str(consumer["line"]), f"[{style}]{finding['kind']}[/]",
                          f"{escape(finding['callee'])}\n[dim]{escape(consumer['text'].strip())}[/]",
                          escape(finding["explanation"]))
        console.print(table)
        if show_source:
            _show_sources(findings)
    counts = data["counts"]
    summary = (f"{counts['drift']} drift finding{'s' * (counts['drift'] != 1)}, "
               f"{counts['note']} note{'s' * (counts['note'] != 1)}")
    if data.get("unchecked"):
        summary += f"; {len(data['unchecked'])} touch point(s) could not be decided from source (--json lists them)"
    console.print(("[red]" if counts["drift"] else "[green]") + escape(summary) + "[/]")


def _show_sources(findings: list[dict]) -> None:
    for finding in findings:
        provider = finding.get("provider")
        if not provider:
            continue
        console.print(f"[dim]{escape(finding['id'])}[/]\n"
                      f"{escape(provider['file'])}:{provider['start']}-{provider['end']}")
        console.print(Syntax(provider["text"], "python", line_numbers=True, start_line=provider["start"],
                             word_wrap=True))
        if finding.get("fix"):
            console.print(f"fix: {escape(finding['fix']['summary'])}")
            console.print(Syntax(finding["fix"]["patch"], "diff", word_wrap=True))
