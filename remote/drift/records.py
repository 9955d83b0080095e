"""Frozen records: what the analysis's data classes used of `dataclasses`, without importing it.

`dataclasses` imports `inspect` and writes each class's methods as source it compiles: 50 ms of a
cold verify's start for the analyzer's 37 classes (docs/benchmarks.md), more than its analysis of
most modules. A record is a class whose annotated attributes (its bases' first) are its fields, in
order, a class attribute of the same name a field's default. It is made with the fields as
positional or keyword arguments (then `__post_init__`, if it has one), cannot be changed after,
equals another of the same class with equal fields and hashes by them (by identity with eq=False),
and shows as `Name(field=value, ...)`, leaving out the fields named in `unshown`.
"""

def record(cls=None, *, eq=True, unshown=()):
    """The class decorator (`@record`, `@record(eq=False)`)."""
    def make(cls):
        fields = []
        for klass in reversed(cls.__mro__):
            for name in klass.__dict__.get("__annotations__", {}):
                if name not in fields:
                    fields.append(name)
        defaults = {name: getattr(cls, name) for name in fields if hasattr(cls, name)}
        shown = [name for name in fields if name not in unshown]
        count = len(fields)
        field_set = frozenset(fields)

        def arguments(args, kwargs):
            """Every field's value in order, from arguments that are not exactly all of them in order."""
            values = dict(defaults)
            values.update(zip(fields, args))
            values.update(kwargs)
            if (len(args) > count or not field_set.issuperset(kwargs) or len(values) != count
                    or not kwargs.keys().isdisjoint(fields[:len(args)])):
                raise TypeError(refusal(args, kwargs))
            return map(values.__getitem__, fields)

        def refusal(args, kwargs):
            if len(args) > count:
                return "%s() takes %d arguments but %d were given" % (cls.__name__, count, len(args))
            for name in kwargs:
                if name not in field_set or name in fields[:len(args)]:
                    return "%s() got an unexpected or repeated argument %r" % (cls.__name__, name)
            missing = next(name for name in fields[len(args):] if name not in kwargs and name not in defaults)
            return "%s() missing the argument %r" % (cls.__name__, missing)

        def __init__(self, *args, **kwargs):
            if kwargs or len(args) != count:  # else every field given in order: most calls
                args = arguments(args, kwargs)
            # Into the instance's dict at once: past the __setattr__ that refuses changes, and a
            # third of the time object.__setattr__ per field took (records are made by the thousand).
            self.__dict__.update(zip(fields, args))
            if hasattr(self, "__post_init__"):
                self.__post_init__()

        def __setattr__(self, name, value):
            raise AttributeError("cannot assign to field %r of a frozen %s" % (name, type(self).__name__))

        def __delattr__(self, name):
            raise AttributeError("cannot delete field %r of a frozen %s" % (name, type(self).__name__))

        def __repr__(self):
            return "%s(%s)" % (type(self).__qualname__,
                               ", ".join("%s=%r" % (name, getattr(self, name)) for name in shown))

        methods = {"__init__": __init__, "__setattr__": __setattr__, "__delattr__": __delattr__,
                   "__repr__": __repr__, "_record_fields": tuple(fields)}
        if eq:
            def __eq__(self, other):
                if other.__class__ is not self.__class__:
                    return NotImplemented
                return all(getattr(self, name) == getattr(other, name) for name in fields)

            def __hash__(self):
                return hash(tuple(getattr(self, name) for name in fields))

            methods.update(__eq__=__eq__, __hash__=__hash__)
        for name, method in methods.items():
            setattr(cls, name, method)
        return cls

    return make if cls is None else make(cls)


def replace(instance, **changes):
    """A copy of a record with some fields changed (dataclasses.replace)."""
    return type(instance)(**{name: changes.get(name, getattr(instance, name)) for name in instance._record_fields})
