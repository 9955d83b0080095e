"""A host's text reaches the terminal with its control characters shown, not obeyed (specrig/ui/terminal.py):
the three sequences a log line can use against the user's terminal, through every view that shows host
text, rendered into a terminal-like console (rich's own styling on: only the host's escapes must go)."""
from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from base.contract import FAILED, RUNNING
from specrig.errors import RemoteScriptError
from specrig.run import live, view
from specrig.ui import group, terminal

TITLE = "\x1b]0;pwned\x07"          # retitles the terminal
CLEAR = "\x1b[2J"                    # clears the screen
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"   # writes the clipboard (OSC 52)
ATTACKS = (TITLE, CLEAR, CLIPBOARD)
LOG = f"INFO loading\n{TITLE}title\n{CLEAR}cleared\n{CLIPBOARD}clipboard\tand a tab\n[bold]not markup[/]"


def terminal_console(width: int = 200) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, color_system="truecolor", width=width, highlight=False), out


def assert_shown_not_obeyed(output: str) -> None:
    for attack in ATTACKS:
        assert attack not in output, f"{attack!r} reached the terminal"
    assert "\\x1b]0;pwned\\x07" in output and "\\x1b[2J" in output and "\\x1b]52;c;cm0gLXJmIH4=\\x07" in output


def test_visible_escapes_every_control_character_but_tabs_and_line_ends():
    assert terminal.visible(LOG).splitlines()[1] == "\\x1b]0;pwned\\x07title"
    assert "clipboard\tand a tab" in terminal.visible(LOG)
    assert terminal.visible("a\r\nb\rc\x00d\x7fe\x9bf") == "a\nb\nc\\x00d\\x7fe\\x9bf"
    assert terminal.visible("plain text, ünïcode ✓") == "plain text, ünïcode ✓"
    assert terminal.visible(terminal.visible(LOG)) == terminal.visible(LOG)  # nothing left to escape


def test_markup_in_host_text_stays_text():
    console, out = terminal_console()
    console.print(f"[bold]run[/] {terminal.markup('[red]x[/] ' + CLEAR)}")
    assert "[red]x[/]" in out.getvalue() and CLEAR not in out.getvalue()


def test_visible_on_escapes_for_a_terminal_and_leaves_a_pipe_the_text():
    console, _ = terminal_console()
    assert terminal.visible_on(console, TITLE) == "\\x1b]0;pwned\\x07"
    pipe = Console(file=io.StringIO(), force_terminal=False)
    assert terminal.visible_on(pipe, TITLE) == TITLE


def test_write_raw_writes_the_text_as_it_came():
    out = io.StringIO()
    terminal.write_raw(LOG, stream=out)
    assert out.getvalue() == LOG


def test_status_shows_the_log_tail_escaped(monkeypatch):
    console, out = terminal_console()
    monkeypatch.setattr(view, "console", console)
    run = {"run_id": "20261201-140000-abcd", "state": RUNNING, "attempts": [],
           "heartbeat": {"phase": f"extracting{CLEAR}"}, "out": f"/data/out{TITLE}"}
    view.show_run(run, log_tail=LOG)
    view.show_runs([run], host=type("H", (), {"name": "h"})())
    assert_shown_not_obeyed(out.getvalue())
    assert "[bold]not markup[/]" in out.getvalue()


def test_a_failures_evidence_is_escaped(monkeypatch):
    console, out = terminal_console()
    monkeypatch.setattr(view, "console", console)
    failure = {"kind": "unknown", "explain": "the driver failed", "evidence": LOG, "advice": "look",
               "retryable": False}
    view.show_run({"run_id": "r", "state": FAILED, "attempts": [{"attempt": 1, "failure": failure}]})
    assert_shown_not_obeyed(out.getvalue())


def test_the_live_view_shows_the_tail_escaped():
    console, out = terminal_console()
    progress, bar = live.samples_bar()
    run = {"run_id": "r", "state": RUNNING, "attempts": [{}], "heartbeat": {"phase": "extracting"}}
    console.print(live.render(run, LOG, progress, bar))
    for attack in ATTACKS:
        assert attack not in out.getvalue()
    assert "\\x1b[2J" in out.getvalue()


def test_fleet_logs_are_escaped_on_a_terminal_and_raw_with_raw(monkeypatch, capsys):
    console, out = terminal_console()
    monkeypatch.setattr(group, "console", console)
    with group.PrefixedLines(["lab"]).writer("lab") as write:
        write(LOG + "\n")
    assert_shown_not_obeyed(out.getvalue())
    assert "lab | \\x1b]0;pwned\\x07title" in out.getvalue()
    with group.PrefixedLines(["lab"], raw=True).writer("lab") as write:
        write(LOG + "\n")
    assert capsys.readouterr().out == "".join(f"lab | {line}\n" for line in LOG.split("\n"))


def test_a_failures_message_and_traceback_from_the_host_are_escaped(monkeypatch):
    import invoke

    from specrig.cli import guard

    console, out = terminal_console()
    monkeypatch.setattr(guard, "errors", console)

    @guard.guarded
    def task():
        raise RemoteScriptError(f"lab: remote command failed: {TITLE}", detail=f"Traceback\n{CLIPBOARD}{CLEAR}")

    with pytest.raises(invoke.Exit):
        task()
    for attack in ATTACKS:
        assert attack not in out.getvalue()
    assert "\\x1b]0;pwned\\x07" in out.getvalue() and "\\x1b[2J" in out.getvalue()


def test_json_keeps_the_text_as_it_is(capsys):
    from specrig.ui import print_json

    print_json({"log_tail": LOG})
    printed = capsys.readouterr().out
    assert "\x1b" not in printed  # JSON escapes control characters itself
    assert json.loads(printed)["log_tail"] == LOG
