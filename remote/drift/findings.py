"""One class per kind of drift; each finding explains itself in one sentence and serializes to JSON.

The JSON shape and the id format are documented in docs/findings.md.
"""


class Location:
    """A line range of a module's file: `text` is what `sed -n START,ENDp` prints."""

    def __init__(self, module, start, end=None):
        self.module = module
        self.start = start
        self.end = end if end is not None else start

    def as_consumer(self):
        return {"module": self.module.name, "file": self.module.relpath, "line": self.start,
                "text": self.module.line(self.start)}

    def as_provider(self):
        return {"module": self.module.name, "file": self.module.relpath, "start": self.start, "end": self.end,
                "text": self.module.text(self.start, self.end)}


class Finding:
    kind = None
    severity = "drift"

    def __init__(self, *, consumer, callee, detail=None, provider=None, parameters=None, fix=None):
        #: Location in the consumer's source (a single line).
        self.consumer = consumer
        #: Dotted path of the provider object involved (where it is defined).
        self.callee = callee
        #: What is wrong with it: a keyword, a parameter, an attribute, an interface.
        self.detail = detail
        #: Location of the provider's declaration (signature, field, class header) or None.
        self.provider = provider
        #: The callee's parameters (list of Parameter) for signature kinds.
        self.parameters = parameters
        #: {"summary", "patch"} for catalogued behaviour changes.
        self.fix = fix

    @property
    def id(self):
        return ":".join(part for part in (self.kind, self.callee, self.detail) if part)

    @property
    def short_callee(self):
        return self.callee.rpartition(".")[2]

    def explain(self):
        raise NotImplementedError

    def as_json(self):
        result = {
            "id": self.id,
            "kind": self.kind,
            "severity": self.severity,
            "consumer": self.consumer.as_consumer(),
            "callee": self.callee,
            "provider": self.provider.as_provider() if self.provider else None,
            "explanation": self.explain(),
            "fix": self.fix,
        }
        if self.parameters is not None:
            result["parameters"] = [p.as_json() for p in self.parameters]
        return result


class MissingSymbol(Finding):
    kind = "missing-symbol"

    def explain(self):
        module, _, name = self.callee.rpartition(".")
        return "%s does not exist in the installed provider (no module or name %r in %s)." % (
            self.callee, name, module or self.callee)


class MaybeSymbol(Finding):
    kind = "maybe-symbol"
    severity = "note"

    def explain(self):
        module, _, name = self.callee.rpartition(".")
        return ("%s defines no %r, but its module-level __getattr__ may provide it at run time; "
                "whether it does cannot be read from source." % (module, name))


class UnexpectedKeyword(Finding):
    kind = "unexpected-keyword"

    def explain(self):
        return "%s() takes no parameter named %r (and no **kwargs)." % (self.short_callee, self.detail)


class MissingArgument(Finding):
    kind = "missing-argument"

    def explain(self):
        return "%s() now requires %r, which this call does not pass." % (self.short_callee, self.detail)


class TooManyPositional(Finding):
    kind = "too-many-positional"

    def explain(self):
        return "%s() is given %s positional arguments, more than it accepts." % (self.short_callee, self.detail)


class KeywordOnlyPositional(Finding):
    kind = "keyword-only-positional"

    def explain(self):
        return "%s() takes %r as keyword-only, but this call passes it positionally." % (
            self.short_callee, self.detail)


class PositionalOnlyKeyword(Finding):
    kind = "positional-only-keyword"

    def explain(self):
        return "%s() takes %r positional-only, but this call passes it by name." % (
            self.short_callee, self.detail)


class MissingAttribute(Finding):
    kind = "missing-attribute"

    def explain(self):
        return "%s has no attribute or method %r." % (self.short_callee, self.detail)


class ModelInterface(Finding):
    kind = "model-interface"

    def __init__(self, *, missing_members, checked_by, **kwargs):
        super().__init__(**kwargs)
        self.missing_members = missing_members
        self.checked_by = checked_by

    def explain(self):
        return "%s does not implement %s (%s false; it lacks %s), so the worker extension refuses the model." % (
            self.short_callee, self.detail, self.checked_by, ", ".join(self.missing_members))


class ModelAttribute(Finding):
    kind = "model-attribute"

    def explain(self):
        owner, _, attr = self.detail.rpartition(".")
        where = "its inner model %s" % owner if owner else self.short_callee
        return "The worker extension uses %r on %s, which does not define it." % (attr or self.detail, where)


class TrustRemoteCode(Finding):
    kind = "trust-remote-code"

    def __init__(self, *, loaded, display, **kwargs):
        super().__init__(**kwargs)
        #: Which files of the model directory declare custom code.
        self.loaded = loaded
        #: How people call the loader: "AutoTokenizer.from_pretrained", "ModelConfig".
        self.display = display

    def explain(self):
        return ("The model directory ships custom code (auto_map in %s); %s() without trust_remote_code=True "
                "refuses to load it." % (self.loaded, self.display))


class Behaviour(Finding):
    kind = "behaviour"

    def __init__(self, *, rule, **kwargs):
        super().__init__(**kwargs)
        self.rule = rule

    @property
    def id(self):
        return "behaviour:" + self.rule.id

    def explain(self):
        return self.rule.explanation


SIGNATURE_KINDS = {cls.kind: cls for cls in (
    UnexpectedKeyword, MissingArgument, TooManyPositional, KeywordOnlyPositional, PositionalOnlyKeyword)}
