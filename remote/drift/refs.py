"""What a name in the provider refers to, and how sure the analysis is of it."""
from __future__ import annotations

from drift import syntax as ast
from drift.records import record
from drift.source import Module


class Ref:
    """What a name refers to. Subclasses say how sure the answer is."""

    #: The object certainly exists.
    exists = True


@record
class ModuleRef(Ref):
    name: str

    @property
    def dotted(self):
        return self.name


# eq=False: the __eq__/__hash__ below, by definition node, are kept by subclasses that add fields too.
@record(eq=False)
class DefRef(Ref):
    """A class or function defined in the provider's source."""

    module: Module
    node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    qualname: str

    @property
    def dotted(self):
        return self.module.name + "." + self.qualname

    def __eq__(self, other):
        return isinstance(other, DefRef) and other.node is self.node

    def __hash__(self):
        return id(self.node)


class ClassRef(DefRef):
    pass


@record(eq=False)
class FunctionRef(DefRef):
    #: The ClassRef whose body defines this function, for methods.
    owner: ClassRef | None = None


@record
class ValueRef(Ref):
    """A module or class attribute bound to some value whose type is not tracked."""

    module: Module
    #: The statement binding it (or a `setattr(self, "name", ...)` call).
    node: ast.AST
    dotted: str


@record
class ExternalRef(Ref):
    """Something outside the packages being read (torch, typing, ...): exists, not inspected."""

    dotted: str


@record
class MaybeRef(Ref):
    """Not defined anywhere readable, but a module-level __getattr__ may provide it."""

    exists = None

    module: Module
    dotted: str


@record
class MissingRef(Ref):
    exists = False

    dotted: str


@record
class UnknownRef(Ref):
    """The analysis cannot tell (unparsable module, dynamic construction)."""

    exists = None

    dotted: str
    reason: str
