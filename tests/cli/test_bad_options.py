"""Options that take a whole number: a word is one line naming it, exit 2, before any host is reached."""
import pytest

from specrig.exit_status import ExitStatus
from support.lab import inv

CASES = [
    (("lab.up", "--hosts", "x"), "--hosts 'x': give a whole number"),
    (("lab.up", "--hosts", "300"), "lab.up --hosts 300: give a number of hosts from 1 to 199"),
    (("logs", "--host", "nosuch", "-n", "x"), "-n 'x': give a whole number"),
    (("smoke", "--host", "nosuch", "--samples", "x"), "--samples 'x': give a whole number"),
    (("extract", "--host", "lab-slurm", "--array", "x"), "--array 'x': give a whole number"),
    (("extract", "--host", "lab-slurm", "--array", "1"), "--array 1: give 2 or more tasks"),
    (("extract", "--host", "lab-cpu", "--array", "2"), "--array on 'lab-cpu', which is no Slurm login node"),
]


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(args) for args, _ in CASES])
def test_a_word_for_a_number_is_one_line_and_exit_2(args, message):
    result = inv(*args)
    assert result.returncode == ExitStatus.USAGE, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
