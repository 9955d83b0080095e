"""One class per kind of drift; each finding explains itself in one sentence and serializes to JSON;
report() puts an analysis's findings in the report every mode of verify returns.

The JSON shape and the id format are documented in docs/findings.md.
"""
from __future__ import annotations

import time

from drift.records import record
from drift.source import Module

TYPE_CHECKING = False  # typing's own flag, without importing typing (3 ms of a cold verify's start)
if TYPE_CHECKING:
    from collections.abc import Callable

    from drift.signatures import Parameter


#: Finding severities: drift breaks the extraction (verify exits 1), a note may (it depends on the setup),
#: speed makes it slower and changes nothing of what it writes.
DRIFT, NOTE, SPEED = "drift", "note", "speed"
SEVERITIES = (DRIFT, NOTE, SPEED)


@record
class Location:
    """A line range of a module's file: `text` is what `sed -n START,ENDp` prints."""

    module: Module
    start: int
    #: Last line; a single line when not given.
    end: int | None = None

    def __post_init__(self):
        if self.end is None:
            object.__setattr__(self, "end", self.start)  # frozen: the one way to complete a field

    @classmethod
    def of(cls, module, node):
        """The lines of `node` in `module`: a def or class header with its decorators, any other node whole."""
        return cls(module, *module.span(node))

    def as_consumer(self):
        return {"module": self.module.name, "file": self.module.relpath, "line": self.start,
                "text": self.module.line(self.start)}

    def as_provider(self):
        return {"module": self.module.name, "file": self.module.relpath, "start": self.start, "end": self.end,
                "text": self.module.text(self.start, self.end)}


@record
class Finding:
    """A kind of drift at one consumer location. Subclasses set `kind`, `severity` and explain().

    Python 3.9 dataclasses have no kw_only, so a field a subclass adds after the defaulted ones
    here needs a default too; every caller passes it.
    """

    kind = None
    severity = DRIFT

    #: Location in the consumer's source (a single line).
    consumer: Location
    #: Dotted path of the provider object involved (where it is defined).
    callee: str
    #: What is wrong with it: a keyword, a parameter, an attribute, an interface.
    detail: str | None = None
    #: Location of the provider's declaration (signature, field, class header) or None.
    provider: Location | None = None
    #: The callee's parameters for signature kinds.
    parameters: list[Parameter] | None = None
    #: {"summary", "patch"} for catalogued behaviour changes.
    fix: dict | None = None

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
    """A module or name the consumer imports or reads that the provider lacks; `provider`, where the module that
    would define it begins (or the nearest module of the path there is), when it has source."""

    kind = "missing-symbol"

    def explain(self):
        module, _, name = self.callee.rpartition(".")
        if self.provider is None:
            return "%s does not exist in the installed provider (no module or name %r in %s)." % (
                self.callee, name, module or self.callee)
        found = self.provider.module
        if found.name == module:
            return "%s does not exist in the installed provider: %s (%s) has no module or name %r." % (
                self.callee, found.relpath, module, name)
        return "%s does not exist in the installed provider: there is no module %s (the nearest is %s, %s)." % (
            self.callee, module, found.name, found.relpath)


class MaybeSymbol(Finding):
    kind = "maybe-symbol"
    severity = NOTE

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


@record
class ModelInterface(Finding):
    kind = "model-interface"

    #: The interface's members the class lacks.
    missing_members: list[str] | None = None
    #: The check the worker extension runs: "supports_eagle3()".
    checked_by: str | None = None

    def explain(self):
        return "%s does not implement %s (%s false; it lacks %s), so the worker extension refuses the model." % (
            self.short_callee, self.detail, self.checked_by, ", ".join(self.missing_members))


class ModelAttribute(Finding):
    kind = "model-attribute"

    def explain(self):
        owner, _, attr = self.detail.rpartition(".")
        where = "its inner model %s" % owner if owner else self.short_callee
        return "The worker extension uses %r on %s, which does not define it." % (attr or self.detail, where)


@record
class TrustRemoteCode(Finding):
    kind = "trust-remote-code"

    #: Which files of the model directory declare custom code.
    loaded: str | None = None
    #: How people call the loader: "AutoTokenizer.from_pretrained", "ModelConfig".
    display: str | None = None

    def explain(self):
        return ("The model directory ships custom code (auto_map in %s); %s() without trust_remote_code=True "
                "refuses to load it." % (self.loaded, self.display))


@record
class Rule:
    id: str
    title: str
    explanation: str
    #: Called with the Analysis: the Hits where the consumer relies on the old behaviour.
    detector: Callable
    fix_summary: str
    #: A unified diff of the consumer's source.
    patch: str

    @property
    def fix(self):
        """The finding's `fix` (docs/findings.md)."""
        return {"summary": self.fix_summary, "patch": self.patch}


@record
class Behaviour(Finding):
    kind = "behaviour"

    #: The catalogue entry that fired.
    rule: Rule | None = None

    @property
    def id(self):
        return "behaviour:" + self.rule.id

    def explain(self):
        return self.rule.explanation


SIGNATURE_KINDS = {cls.kind: cls for cls in (
    UnexpectedKeyword, MissingArgument, TooManyPositional, KeywordOnlyPositional, PositionalOnlyKeyword)}


@record
class ServerContract(Finding):
    """A point of the server mode's contract (docs/server-mode.md section 10) that the installed vLLM breaks.

    The check that found it (drift/server/) words the explanation: each point breaks in its own way.
    """

    kind = "server-contract"

    #: "drift", or "note" where the point breaks only in some setups (tensor parallelism, no model given).
    severity: str = DRIFT
    #: The contract point of docs/server-mode.md section 10: "C1".
    point: str | None = None
    #: The point's id in drift.server.points.POINTS, the id's middle part: "method-known".
    rule: str | None = None
    #: What is wrong and what fails because of it.
    message: str | None = None

    @property
    def id(self):
        return ":".join(part for part in (self.kind, self.rule, self.detail) if part)

    def explain(self):
        return self.message

    def as_json(self):
        return dict(super().as_json(), point=self.point)


@record
class StartupRefusal(ServerContract):
    """A setting on by default that vLLM's config validation refuses with the connector or the method specrig
    launches with (drift/server/startup.py): the server stops at start-up, before loading the model."""

    kind = "startup-refusal"

    #: The connector or method the refusal names.
    trigger: str | None = None
    #: vLLM's error text.
    error: str | None = None
    #: The server flag turning the setting off, which specrig's launch passes; None when the parser has none.
    #: As JSON `launch_flag`, the field docs/findings.md names for any finding a launch flag avoids.
    launch_flag: str | None = None
    #: "path:line" of the setting's default (True).
    default: str | None = None

    @property
    def id(self):
        return ":".join((self.kind, self.detail))

    def explain(self):
        avoided = ("specrig's launch passes %s on this vLLM" % self.launch_flag if self.launch_flag
                   else "no server flag turns it off: the server cannot start with %s" % self.trigger)
        return ("vLLM refuses %s=True with %s at start-up (%r), and %s is on by default (%s): %s." % (
            self.detail, self.trigger, self.error, self.detail, self.default, avoided))

    def as_json(self):
        return dict(super().as_json(), trigger=self.trigger, error=self.error, launch_flag=self.launch_flag,
                    default=self.default)


@record
class SlowCall(ServerContract):
    """A call that works and is slow: the extraction runs correctly, at the pace of this call instead of the
    GPU's (drift/server/speed.py). Its id names the slow call and what makes it slow."""

    kind = "slow-call"
    severity: str = SPEED

    @property
    def id(self):
        return ":".join((self.kind, self.callee, self.detail))


class UnsupportedRelease(Finding):
    """speculators 0.5-0.7: their data generation ships only as repository scripts (remote/base/contract.py)."""

    kind = "unsupported-release"

    def explain(self):
        return ("speculators %s ships its data generation only as repository scripts, outside the wheel (the wheel "
                "has no data-generation command): specrig supports speculators <= 0.4 (in-process) and "
                ">= 0.8 (a vLLM server)." % self.detail)


def report(findings, *, started, consumers, provider, model, unchecked, calls_checked, checked, modules_parsed,
           mode=None, contract=None):
    """The report of one analysis (docs/findings.md): `findings` (Finding objects) in the order of their
    consumer lines, as JSON, with their counts; `mode` (the extraction mode analysed) leads it and `contract` follows `checked` when given.

    started: time.perf_counter() when the analysis began; model: as verify read it (or None).
    """
    ordered = sorted(findings, key=lambda f: (f.consumer.module.relpath, f.consumer.start, f.id))
    found = [f.as_json() for f in ordered]
    data = {"mode": mode} if mode else {}
    data.update({
        "consumers": consumers,
        "provider": provider,
        "model": _model_summary(model),
        "findings": found,
        "counts": {severity: sum(1 for f in found if f["severity"] == severity) for severity in SEVERITIES},
        "unchecked": unchecked,
        "calls_checked": calls_checked,
        "checked": checked,
    })
    if contract is not None:
        data["contract"] = contract
    data.update({"modules_parsed": modules_parsed, "elapsed_s": round(time.perf_counter() - started, 3)})
    return data


def _model_summary(model):
    if model is None:
        return None
    config = model.get("config") or {}
    # repo_id and resolved: a model named by its Hugging Face id, and the cache snapshot it was read from.
    return {"path": model.get("path"), "repo_id": model.get("repo_id"),
            "resolved": model.get("resolved") or model.get("path"), "architectures": config.get("architectures") or [],
            "custom_code": bool(config.get("auto_map") or (model.get("tokenizer_config") or {}).get("auto_map"))}
