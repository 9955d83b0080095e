"""Every command a call may name (remote/rpc.py COMMANDS) is a function of a module that imports: a module
moved or renamed without its line in the table fails here, not as a script error on a host."""
import importlib

import pytest

import rpc


@pytest.mark.parametrize("command", sorted(rpc.COMMANDS))
def test_every_command_names_a_function_of_its_module(command):
    module, function = rpc.COMMANDS[command].split(":")
    assert callable(getattr(importlib.import_module(module), function, None)), rpc.COMMANDS[command]
