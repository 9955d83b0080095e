"""What a name in the provider refers to, and how sure the analysis is of it."""


class Ref:
    """What a name refers to. Subclasses say how sure the answer is."""

    #: The object certainly exists.
    exists = True


class ModuleRef(Ref):
    def __init__(self, name):
        self.name = name

    @property
    def dotted(self):
        return self.name


class DefRef(Ref):
    """A class or function defined in the provider's source."""

    def __init__(self, module, node, qualname):
        self.module = module
        self.node = node
        self.qualname = qualname

    @property
    def dotted(self):
        return self.module.name + "." + self.qualname

    def __eq__(self, other):
        return isinstance(other, DefRef) and other.node is self.node

    def __hash__(self):
        return id(self.node)


class ClassRef(DefRef):
    pass


class FunctionRef(DefRef):
    def __init__(self, module, node, qualname, owner=None):
        super().__init__(module, node, qualname)
        #: The ClassRef whose body defines this function, for methods.
        self.owner = owner


class ValueRef(Ref):
    """A module or class attribute bound to some value whose type is not tracked."""

    def __init__(self, module, node, dotted):
        self.module = module
        self.node = node
        self.dotted = dotted


class ExternalRef(Ref):
    """Something outside the packages being read (torch, typing, ...): exists, not inspected."""

    def __init__(self, dotted):
        self.dotted = dotted


class MaybeRef(Ref):
    """Not defined anywhere readable, but a module-level __getattr__ may provide it."""

    exists = None

    def __init__(self, module, dotted):
        self.module = module
        self.dotted = dotted


class MissingRef(Ref):
    exists = False

    def __init__(self, dotted):
        self.dotted = dotted


class UnknownRef(Ref):
    """The analysis cannot tell (unparsable module, dynamic construction)."""

    exists = None

    def __init__(self, dotted, reason):
        self.dotted = dotted
        self.reason = reason
