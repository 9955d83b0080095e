"""The edits a patch can make, one class per operation (see patchsets/README.md, "Edits").

Each edit is built from its patchset.json mapping (rejecting bad values with
their repr), decides its State from a file's text alone (so a fix made by hand
counts as applied), and produces the edited text when pending.
"""
import ast
import importlib.util
import os
import sys

from patching import patchlib
from patching.patchlib import APPLIED, PENDING, State, conflict


class InvalidEdit(ValueError):
    """A patchset's edit is malformed; the message names the field and the bad value."""


def _field(spec, name, kind=str, default=None, required=True):
    if name not in spec:
        if required:
            raise InvalidEdit("missing field %r" % name)
        return default
    value = spec[name]
    if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidEdit("%s: expected a positive integer, got %r" % (name, value))
    if kind is str and (not isinstance(value, str) or not value.strip()):
        raise InvalidEdit("%s: expected a non-empty string, got %r" % (name, value))
    return value


def _identifier(spec, name):
    value = _field(spec, name)
    if not value.isidentifier():
        raise InvalidEdit("%s: %r is not a Python identifier" % (name, value))
    return value


def _expression(spec, name):
    value = _field(spec, name)
    try:
        ast.parse(value, mode="eval")
    except SyntaxError:
        raise InvalidEdit("%s: %r is not a Python expression" % (name, value)) from None
    return value


def _callee(spec):
    value = _field(spec, "call")
    if not all(part.isidentifier() for part in value.split(".")):
        raise InvalidEdit("call: %r is not a dotted name such as 'Scheduler' or 'AutoTokenizer.from_pretrained'"
                          % value)
    return value


class Edit:
    operation = None
    fields = ()

    def state(self, source):
        """The State of this edit on `source` (a patchlib.Source)."""
        raise NotImplementedError

    def apply(self, source):
        """The edited text; only called when state() is pending."""
        raise NotImplementedError

    def _calls(self, source, call, count):
        """(calls, None), or (None, conflict) when the number of calls to `call` is not `count`."""
        calls = patchlib.find_calls(source, call)
        if len(calls) != count:
            return None, conflict("expected %d call%s to %s(...), found %d" % (
                count, "" if count == 1 else "s", call, len(calls)))
        return calls, None


class RemoveKeyword(Edit):
    operation = "remove-keyword"
    fields = ("call", "keyword", "count")

    def __init__(self, spec):
        self.call = _callee(spec)
        self.keyword = _identifier(spec, "keyword")
        self.count = _field(spec, "count", int, 1, required=False)

    def describe(self):
        return "remove %s= from %s(...)" % (self.keyword, self.call)

    def state(self, source):
        calls, problem = self._calls(source, self.call, self.count)
        if problem:
            return problem
        passing = [call for call in calls if patchlib.keyword(call, self.keyword)]
        if not passing:
            return APPLIED
        if len(passing) == len(calls):
            return PENDING
        return conflict("%d of %d calls to %s(...) pass %s=" % (len(passing), len(calls), self.call, self.keyword))

    def apply(self, source):
        return patchlib.replace_spans(source.text, [patchlib.remove_keyword_edit(source, call, self.keyword)
                                                    for call in patchlib.find_calls(source, self.call)])


class AddKeyword(Edit):
    operation = "add-keyword"
    fields = ("call", "keyword", "value", "count")

    def __init__(self, spec):
        self.call = _callee(spec)
        self.keyword = _identifier(spec, "keyword")
        self.value = _expression(spec, "value")
        self.count = _field(spec, "count", int, 1, required=False)

    def describe(self):
        return "add %s=%s to %s(...)" % (self.keyword, self.value, self.call)

    def state(self, source):
        calls, problem = self._calls(source, self.call, self.count)
        if problem:
            return problem
        passing = [call for call in calls if patchlib.keyword(call, self.keyword)]
        if len(passing) == len(calls):
            return APPLIED
        if not passing:
            return PENDING
        return conflict("%d of %d calls to %s(...) already pass %s=" % (
            len(passing), len(calls), self.call, self.keyword))

    def apply(self, source):
        return patchlib.replace_spans(source.text, [
            patchlib.add_keyword_edit(source, call, self.keyword, self.value)
            for call in patchlib.find_calls(source, self.call)])


class AddBase(Edit):
    operation = "add-base"
    fields = ("class", "base", "import")

    def __init__(self, spec):
        self.cls = _identifier(spec, "class")
        self.base = _expression(spec, "base")
        self.import_from = spec.get("import")
        if self.import_from is not None:
            if not isinstance(self.import_from, dict) or set(self.import_from) != {"from", "name"}:
                raise InvalidEdit("import: expected {from: MODULE, name: NAME}, got %r" % (self.import_from,))
            _field(self.import_from, "from")
            _identifier(self.import_from, "name")

    def describe(self):
        return "make class %s derive from %s" % (self.cls, self.base)

    def state(self, source):
        cls, problem = patchlib.one_class(source, self.cls)
        if problem:
            return problem
        return APPLIED if patchlib.has_base(cls, self.base) else PENDING

    def apply(self, source):
        cls, _ = patchlib.one_class(source, self.cls)
        edits = [patchlib.add_base_edit(source, cls, self.base)]
        if self.import_from:
            edits.append(patchlib.add_import_edit(source, self.import_from["from"], self.import_from["name"]))
        return patchlib.replace_spans(source.text, [edit for edit in edits if edit])


class RenameAttribute(Edit):
    operation = "rename-attribute"
    fields = ("attribute", "to", "object", "count")

    def __init__(self, spec):
        self.attribute = _identifier(spec, "attribute")
        self.to = _identifier(spec, "to")
        self.object = _expression(spec, "object") if "object" in spec else None
        self.count = _field(spec, "count", int, 1, required=False)

    def describe(self):
        return "rename %s.%s to .%s" % (self.object or "<any>", self.attribute, self.to)

    def _accesses(self, source, name):
        return [node for node in source.nodes(ast.Attribute) if node.attr == name
                and (self.object is None
                    or ast.dump(node.value) == ast.dump(ast.parse(self.object, mode="eval").body))]

    def state(self, source):
        old, new = self._accesses(source, self.attribute), self._accesses(source, self.to)
        if len(old) == self.count and not new:
            return PENDING
        if not old and len(new) == self.count:
            return APPLIED
        return conflict("expected %d access%s to .%s (or, once applied, to .%s), found %d and %d" % (
            self.count, "" if self.count == 1 else "es", self.attribute, self.to, len(old), len(new)))

    def apply(self, source):
        edits = []
        for node in self._accesses(source, self.attribute):
            end = source.end(node)
            edits.append((end - len(self.attribute), end, self.to))
        return patchlib.replace_spans(source.text, edits)


class ReplaceSnippet(Edit):
    operation = "replace-snippet"
    fields = ("old", "new", "count")

    def __init__(self, spec):
        self.old = _field(spec, "old")
        self.new = _field(spec, "new")
        self.count = _field(spec, "count", int, 1, required=False)
        if self.old in self.new or self.new in self.old:
            raise InvalidEdit("old and new must not contain one another (the state could not be told from "
                              "the text): old=%r new=%r" % (self.old, self.new))

    def describe(self):
        first = self.old.strip().splitlines()[0]
        return "replace %r%s" % (first, " (%d times)" % self.count if self.count > 1 else "")

    def state(self, source):
        old, new = source.text.count(self.old), source.text.count(self.new)
        if old == self.count and not new:
            return PENDING
        if not old and new == self.count:
            return APPLIED
        return conflict("the snippet %r occurs %d time%s (expected %d), its replacement %d" % (
            self.old.strip().splitlines()[0], old, "" if old == 1 else "s", self.count, new))

    def apply(self, source):
        return source.text.replace(self.old, self.new)


class Script(Edit):
    """A Python file beside patchset.json defining state(text) -> State and apply(text) -> text."""

    operation = "script"
    fields = ("file",)

    def __init__(self, spec, folder):
        name = _field(spec, "file")
        if os.path.basename(name) != name or not name.endswith(".py"):
            raise InvalidEdit("file: %r must be the name of a .py file in the patchset folder" % name)
        self.file = os.path.join(folder, name)
        if not os.path.isfile(self.file):
            raise InvalidEdit("file: %r does not exist in %s" % (name, folder))
        # Scripts written before patchlib moved into patching/ import it by its old top-level name: both work.
        sys.modules.setdefault("patchlib", patchlib)
        module_spec = importlib.util.spec_from_file_location("patchset_script_" + name[:-3], self.file)
        self.module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(self.module)
        for function in ("state", "apply"):
            if not callable(getattr(self.module, function, None)):
                raise InvalidEdit("file: %s defines no function %s(source)" % (name, function))

    def describe(self):
        doc = (self.module.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else "run %s" % os.path.basename(self.file)

    def state(self, source):
        state = self.module.state(source.text)
        if not isinstance(state, State):
            raise TypeError("%s: state() returned %r, not a patchlib.State" % (self.file, state))
        return state

    def apply(self, source):
        return self.module.apply(source.text)


OPERATIONS = {cls.operation: cls for cls in (RemoveKeyword, AddKeyword, AddBase, RenameAttribute, ReplaceSnippet,
                                             Script)}


def build(spec, folder):
    """The Edit for a patch's `edit:` mapping (exactly one operation)."""
    if not isinstance(spec, dict) or len(spec) != 1:
        raise InvalidEdit("expected exactly one operation (%s), got %r" % (", ".join(OPERATIONS), spec))
    (operation, fields), = spec.items()
    cls = OPERATIONS.get(operation)
    if cls is None:
        raise InvalidEdit("unknown operation %r (use one of %s)" % (operation, ", ".join(OPERATIONS)))
    if not isinstance(fields, dict):
        raise InvalidEdit("%s: expected a mapping of fields, got %r" % (operation, fields))
    unknown = sorted(set(fields) - set(cls.fields))
    if unknown:
        raise InvalidEdit("%s: unknown field %r (allowed: %s)" % (operation, unknown[0], ", ".join(cls.fields)))
    try:
        return cls(fields, folder) if cls is Script else cls(fields)
    except InvalidEdit as exc:
        raise InvalidEdit("%s.%s" % (operation, exc)) from None
