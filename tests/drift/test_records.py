"""remote/drift/records.py: the parts of dataclasses the analysis's classes use, kept as they were."""
import pytest

from drift.records import record, replace


@record
class Point:
    x: int
    y: int = 0
    label: str = "p"

    def __post_init__(self):
        if self.label == "auto":
            object.__setattr__(self, "label", "%d,%d" % (self.x, self.y))


class Named(Point):
    kind = "named"


@record(eq=False, unshown=("y",))
class Handle:
    x: int
    y: list


def test_arguments_defaults_post_init_and_replace():
    assert Point(1, 2, "a") == Point(x=1, y=2, label="a") == Point(1, y=2, label="a")
    assert Point(1).y == 0 and Point(1, 2, "auto").label == "1,2"
    assert replace(Point(1, 2), y=5) == Point(1, 5)
    for bad in (lambda: Point(), lambda: Point(1, 2, "a", 4), lambda: Point(1, x=1), lambda: Point(1, z=1)):
        with pytest.raises(TypeError):
            bad()


def test_frozen_equal_by_class_and_fields_and_shown_as_dataclasses_show_them():
    point = Point(1, 2)
    with pytest.raises(AttributeError):
        point.x = 3
    with pytest.raises(AttributeError):
        del point.x
    assert {point: 1}[Point(1, 2)] == 1
    assert Named(1, 2) != Point(1, 2) and Named(1, 2) == Named(1, 2)
    assert repr(point) == "Point(x=1, y=2, label='p')"
    handle = Handle(1, [])
    assert handle != Handle(1, []) and handle == handle and repr(handle) == "Handle(x=1)"
    assert len({handle, Handle(1, [])}) == 2
