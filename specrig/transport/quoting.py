"""Shell command text that means the same under sh, dash, bash and zsh.

Every word is single-quoted, always. `shlex.quote` leaves "safe" words bare,
and zsh expands a bare `=word` to the path of the command `word`; bare `~`,
`*` or `[0]` are other traps. A single-quoted word is literal in every POSIX
shell and in zsh; a single quote inside it is written '\\''.
"""
from __future__ import annotations

from specrig.errors import UsageError

#: Shell operators a command may put between quoted words.
OPERATORS = frozenset({"&&", "||", ";", "|", ">", ">>", "<", "2>", "2>&1", ">/dev/null", "</dev/null", "&"})


def quote_word(word: str) -> str:
    """Single-quote one word. Refuses what no shell argument can carry (NUL)."""
    if not isinstance(word, str):
        raise UsageError(f"shell word must be a string, got {word!r}")
    if "\0" in word:
        raise UsageError(f"cannot pass {word[:40]!r}… to a remote shell: it contains a NUL byte, "
                         "which no command-line argument can carry (send it inside a JSON argument file)")
    return "'" + word.replace("'", "'\\''") + "'"


class Operator(str):
    """A shell operator placed unquoted between words, e.g. Operator('&&')."""

    def __new__(cls, text: str):
        if text not in OPERATORS:
            raise ValueError(f"not a known shell operator: {text!r}")
        return super().__new__(cls, text)


AND = Operator("&&")
OR = Operator("||")
THEN = Operator(";")
WRITE_TO = Operator(">")


def command_line(*parts: str | Operator) -> str:
    """Join words (quoted) and Operators (verbatim) into one command line."""
    return " ".join(part if isinstance(part, Operator) else quote_word(part) for part in parts)
