"""A bad hosts.yaml is refused in one line: the one assertion every inventory test makes."""
from __future__ import annotations

import pytest

from specrig.errors import InventoryError
from specrig.inventory import load_inventory


def refused_in_one_line(path, words) -> str:
    """load_inventory(path)'s error as its one line, which names the file and holds each of `words`."""
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    line = caught.value.one_line()
    assert "\n" not in line and str(path) in line
    for word in words:
        assert word in line
    return line
