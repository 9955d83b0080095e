"""Arguments arrive byte-exact through the login shells zsh, bash and dash (real sshd, real users)."""
import pytest

from specrig.errors import UsageError
from specrig.transport import connect
from specrig.transport.quoting import AND, command_line, quote_word

TORTURE = [
    "plain", "", " ", "it's", 'say "hi"', """both ' and " nested '"'"'""", "$HOME", "${HOME}", "$(id)", "`id`",
    "*", "[0]", "!", "!!", "#not a comment", "=ls", "~", "~root", "a\nb", "line\r\nend", "\ttab\t", "back\\slash\\",
    "\\'", "'", "''", "-n", "--", ";", "&&", "|", ">out", "<in", "a b  c", "%s%d", "{a,b}", "^x", "glob?",
    "עברית RTL \u202e", "emoji 🚀🧪", "ﬁ ligature", "\x01\x1b[31mred", "x" * 100_000,
]
SHELLS = ("lab", "lab-bash", "lab-dash")


@pytest.fixture(scope="module", params=SHELLS)
def remote(request, lab):
    with connect(lab.host(request.param)) as remote:
        yield remote


def test_json_arguments_arrive_byte_exact(remote):
    result = remote.call("probe", {"echo": TORTURE + ["nul \0 inside"]})
    assert result["echo"] == TORTURE + ["nul \0 inside"]


@pytest.mark.parametrize("word", TORTURE, ids=lambda w: repr(w[:20]))
def test_shell_words_arrive_byte_exact(remote, word):
    # printf '%s' WORD prints the word as the remote shell passed it: no expansion, no splitting.
    rc, out, err = remote.exec(command_line("printf", "%s", word), timeout=30)
    assert (rc, err) == (0, "")
    assert out == word


def test_operators_stay_operators(remote):
    rc, out, _ = remote.exec(command_line("printf", "a", AND, "printf", "b"), timeout=30)
    assert (rc, out) == (0, "ab")


def test_login_shell_is_the_one_under_test(remote):
    shell = {"lab": "zsh", "lab-bash": "bash", "lab-dash": "dash"}[remote.host.name]
    assert remote.call("doctor", {})["login_shell"].endswith("/" + shell)


def test_nul_cannot_be_a_shell_word():
    with pytest.raises(UsageError, match="NUL byte"):
        quote_word("a\0b")


def test_equals_word_is_quoted_unlike_shlex():
    # shlex.quote("=ls") returns =ls bare, which zsh expands to /usr/bin/ls.
    assert quote_word("=ls") == "'=ls'"
    assert quote_word("it's") == "'it'\\''s'"
