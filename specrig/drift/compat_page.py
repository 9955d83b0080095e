"""The compatibility matrix as pages people read: docs/compatibility.md and a self-contained
docs/compatibility.html (inline CSS, no script: a cell is a <details> that opens to its findings).

vLLM releases go down, newest first (the choice a reader makes), speculators releases across, grouped
by extraction mode. The pages hold no date: building them again from the same analysis changes nothing.
"""
from __future__ import annotations

import re
from html import escape
from itertools import groupby
from pathlib import Path

from specrig.contract import IN_PROCESS, REPOSITORY_SCRIPTS, SERVER
from specrig.drift.cells import BREAKS, FLAG, NO_MODE, PATCHSET, STATUSES, WORKS
from specrig.drift.compat_matrix import SPECULATORS_SINCE, VLLM_SINCE

MARKDOWN, HTML = "compatibility.md", "compatibility.html"
TITLE = "speculators × vLLM compatibility"
MEANING = {
    WORKS: "no drift finding: extraction works as released",
    PATCHSET: "every drift finding is fixed by the named patchset (`inv apply-patches`)",
    FLAG: "every drift finding is avoided by the named server launch flag",
    BREAKS: "a drift finding nothing fixes: the cell names the first",
    NO_MODE: "the speculators release has no extraction mode specrig runs (0.5–0.7 ship repository scripts)",
}
MODE_TITLES = {IN_PROCESS: "in-process (speculators ≤ 0.4)", SERVER: "server mode (speculators ≥ 0.8)",
               REPOSITORY_SCRIPTS: "no extraction mode (repository scripts)"}
CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#1b1b1b}
table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #bbb;padding:3px 5px;vertical-align:top}
thead th{background:#eee;position:sticky;top:0}
th.vllm{text-align:right;white-space:nowrap;background:#f6f6f6}
td{max-width:15em;overflow-wrap:anywhere}
td.works{background:#dff3df}td.patchset{background:#fff1c7}td.flag{background:#dcecff}
td.breaks{background:#fadbd8}td.no-mode{background:#f0f0f0;color:#777}
summary{cursor:pointer}
details ul{margin:.3em 0;padding-left:1.2em}
li.note{color:#666}
.where{display:block;color:#666}
code{font-size:11px}
"""


def label(cell: dict) -> str:
    """What a cell says, in words (the same in both pages and in the tests)."""
    status = cell["status"]
    flags = " + ".join(cell["flags"])
    if status == WORKS:
        return "works as is"
    if status == PATCHSET:
        return f"works with patchset {cell['patchset']}" + (f" + flag {flags}" if flags else "")
    if status == FLAG:
        return f"works with flag {flags}"
    if status == BREAKS:
        return f"breaks: {cell['first']['id']}"
    return "no extraction mode"


def coverage(matrix: dict) -> str:
    """One sentence: which releases the page covers."""
    specs, vllms = [s["version"] for s in matrix["speculators"]], matrix["vllm"]
    return (f"{len(specs)} speculators release(s) ({', '.join(specs)}) × {len(vllms)} vLLM release(s) "
            f"({vllms[0]} … {vllms[-1]})" if specs and vllms else "no releases")


def write_pages(matrix: dict, *, out: Path) -> list[Path]:
    """Both pages in `out`; their paths."""
    pages = {out / MARKDOWN: markdown(matrix), out / HTML: html(matrix)}
    for path, text in pages.items():
        path.write_text(text, encoding="utf-8")
    return list(pages)


def _anchor(spec: str, vllm: str) -> str:
    return f"s{spec}-v{vllm}".replace(".", "-")


def _preamble(matrix: dict) -> list[str]:
    return [f"Built by `inv compat-report` from the static drift analysis of released wheels (`inv check-compat`), "
            f"analyzer {matrix['analyzer'][:12]}: {coverage(matrix)}. The default covers every release of "
            f"speculators from {SPECULATORS_SINCE} and of vLLM from {VLLM_SINCE}, pre-releases and yanked "
            f"releases left out; vLLM is the CUDA wheel from PyPI. A static analysis: a cell that works here can "
            f"still fail at run time on what only running shows (patchsets/README.md, docs/extraction-drift.md)."]


def _vllm_newest_first(matrix: dict) -> list[str]:
    return list(reversed(matrix["vllm"]))


def markdown(matrix: dict) -> str:
    specs = matrix["speculators"]
    lines = [f"# {TITLE}", "", *_preamble(matrix), "", "| status | meaning |", "|---|---|"]
    lines += [f"| {status} | {MEANING[status]} |" for status in STATUSES]
    lines += ["", "| vLLM \\ speculators | " + " | ".join(f"{s['version']}<br>{s['mode']}" for s in specs) + " |",
              "|---|" + "---|" * len(specs)]
    for vllm in _vllm_newest_first(matrix):
        row = []
        for spec in specs:
            cell = matrix["cells"][spec["version"]][vllm]
            text = label(cell).replace("|", "\\|")
            row.append(f"[{text}](#{_anchor(spec['version'], vllm)})" if cell["findings"] else text)
        lines.append(f"| **{vllm}** | " + " | ".join(row) + " |")
    lines += ["", "## Findings per pair", ""]
    for spec in specs:
        for vllm in _vllm_newest_first(matrix):
            cell = matrix["cells"][spec["version"]][vllm]
            if cell["findings"]:
                lines += [f'<a id="{_anchor(spec["version"], vllm)}"></a>', "",
                          f"### speculators {spec['version']} × vLLM {vllm}: {label(cell)}", ""]
                lines += [f"- {_finding_markdown(f)}" for f in cell["findings"]] + [""]
    return "\n".join(lines).rstrip() + "\n"


def _finding_markdown(finding: dict) -> str:
    where = ", ".join(f"`{w}`" for w in (finding["consumer"], finding["provider"]) if w)
    fixed = f" Fixed by {finding['fixed_by']}." if finding["fixed_by"] else ""
    return (f"`{finding['id']}` ({finding['severity']}{'; ' + where if where else ''}): "
            f"{finding['explanation'].replace(chr(10), ' ')}{fixed}")


def html(matrix: dict) -> str:
    specs = matrix["speculators"]
    head = ["<tr><th rowspan=2>vLLM</th>"]
    for mode, group in groupby(specs, key=lambda s: s["mode"]):
        head.append(f'<th colspan={len(list(group))}>speculators: {escape(MODE_TITLES.get(mode, str(mode)))}</th>')
    head.append("</tr><tr>" + "".join(f"<th>{escape(s['version'])}</th>" for s in specs) + "</tr>")
    rows = []
    for vllm in _vllm_newest_first(matrix):
        cells = "".join(_cell_html(spec["version"], vllm, matrix["cells"][spec["version"]][vllm]) for spec in specs)
        rows.append(f'<tr><th class="vllm">{escape(vllm)}</th>{cells}</tr>')
    legend = "".join(f'<tr><td class="{s}">{s}</td><td>{_prose_html(MEANING[s])}</td></tr>' for s in STATUSES)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(TITLE)}</title>'
            f"<style>{CSS}</style></head><body>\n<h1>{escape(TITLE)}</h1>\n"
            f"<p>{_prose_html(_preamble(matrix)[0])}</p>\n<table>{legend}</table>\n<p></p>\n"
            f'<table id="matrix"><thead>{"".join(head)}</thead><tbody>\n' + "\n".join(rows)
            + "\n</tbody></table>\n</body></html>\n")


def _prose_html(text: str) -> str:
    """Prose written for the markdown page, for the HTML one: escaped, `code` spans as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def _cell_html(spec: str, vllm: str, cell: dict) -> str:
    body = (f"<p>{escape(cell['reason'])}</p>" if cell["reason"] else
            "<ul>" + "".join(_finding_html(f) for f in cell["findings"]) + "</ul>" if cell["findings"] else
            "<p>No findings.</p>")
    return (f'<td class="{cell["status"]}" id="{_anchor(spec, vllm)}" data-speculators="{escape(spec)}" '
            f'data-vllm="{escape(vllm)}" data-status="{cell["status"]}"><details><summary>{escape(label(cell))}'
            f"</summary>{body}</details></td>")


def _finding_html(finding: dict) -> str:
    where = ", ".join(escape(w) for w in (finding["consumer"], finding["provider"]) if w)
    fixed = f" <b>Fixed by {escape(finding['fixed_by'])}.</b>" if finding["fixed_by"] else ""
    return (f'<li class="{escape(finding["severity"])}"><code>{escape(finding["id"])}</code> '
            f'<span class="where">{escape(finding["severity"])}{": " + where if where else ""}</span>'
            f"{escape(finding['explanation'])}{fixed}</li>")
