"""Frozen records: what the analysis's data classes used of `dataclasses`, without importing it.

`dataclasses` imports `inspect` and writes each class's methods as source it compiles: 50 ms of a
cold verify's start for the analyzer's 37 classes (docs/benchmarks.md), more than its analysis of
most modules. A record is a class whose annotated attributes (its bases' first) are its fields, in
order, a class attribute of the same name a field's default. It is made with the fields as
positional or keyword arguments (then `__post_init__`, if it has one), cannot be changed after,
equals another of the same class with equal fields and hashes by them (by identity with eq=False),
and shows as `Name(field=value, ...)`, leaving out the fields named in `unshown`.
"""
_MISSING = object()


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

        def __init__(self, *args, **kwargs):
            if not kwargs and len(args) == count:  # every field given in order: most calls
                for name, value in zip(fields, args):
                    object.__setattr__(self, name, value)
            else:
                if len(args) > count:
                    raise TypeError("%s() takes %d arguments but %d were given" % (cls.__name__, count, len(args)))
                values = dict(zip(fields, args))
                for name, value in kwargs.items():
                    if name not in fields or name in values:
                        raise TypeError("%s() got an unexpected or repeated argument %r" % (cls.__name__, name))
                    values[name] = value
                for name in fields:
                    value = values.get(name, defaults.get(name, _MISSING))
                    if value is _MISSING:
                        raise TypeError("%s() missing the argument %r" % (cls.__name__, name))
                    object.__setattr__(self, name, value)
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
