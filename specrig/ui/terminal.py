"""Text from a host, made safe to show on a terminal: its control characters visibly escaped.

A host's text (a log line from a dataset or a model, a failure's evidence, a path, a package
version) may hold bytes a terminal obeys: `ESC ] 0;` retitles it, `ESC [2J` clears the screen,
OSC 52 writes the user's clipboard. Shown to a person, every control character becomes its escape,
as journalctl shows them (`\\x1b]0;title\\x07`); tabs and line ends stay. Rich markup in host text
is escaped too (`markup`): `[bold]` in a log line is text.

Where host text reaches people: `inv logs` (visible_on: escaped on a terminal, as they are into a
pipe or file; `--raw` writes them as they are, write_raw), and every view (status, the live view, the
fleet's lines and errors, doctor), which escape what they show whatever the output is.
`--json` never goes through here: JSON escapes control characters itself.
"""
from __future__ import annotations

import re
import sys

from rich.console import Console
from rich.markup import escape

#: C0 controls but tab and line feed, DEL, and the C1 controls (U+0080-U+009F: U+009B is CSI, U+009D OSC
#: where a terminal takes 8-bit controls).
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: A carriage return ends a line: CRLF, and a progress bar's lone CR (one update a line, as the status's
#: log tail shows them). A CR can no longer write over a line to hide what it said.
_LINE_END = re.compile("\r\n?")


def _escaped(match: re.Match) -> str:
    return "\\x%02x" % ord(match.group())


def visible(text: str) -> str:
    """`text` with every control character shown as its escape (`\\x1b`), tabs and line ends kept."""
    text = str(text)
    if not CONTROL.search(text):
        return text
    return CONTROL.sub(_escaped, _LINE_END.sub("\n", text))


def markup(text: str) -> str:
    """Host text placed inside rich markup: brackets escaped (`[bold]` stays text), controls visible."""
    return escape(visible(text))


def visible_on(console: Console, text: str) -> str:
    """`text` as `console` should show it: escaped where it is a terminal, as it is into a pipe or file."""
    return visible(text) if console.is_terminal else text


def write_raw(text: str, *, stream=None) -> None:
    """Write a host's text as it came (`inv logs --raw`): not through rich, which would drop some
    control characters and wrap lines."""
    stream = stream or sys.stdout
    stream.write(text)
    stream.flush()
