"""Differential test: every vLLM callee the analyzer checks calls against has the parameter list griffe reads.

griffe is only the oracle here (the remote analyzer is standard-library code). It
knows `def`s and `__init__`s; vLLM's configuration classes are pydantic dataclasses
made by vLLM's own `@config` decorator, which griffe's dataclass support does not
recognise, so for those the oracle is griffe's reading of the class's annotated
attributes, turned into `__init__` parameters by the dataclass rules.
"""
from __future__ import annotations

import ast
import functools

import griffe
import pytest

from support.drift_wheels import KIMI_CONFIG, report, root

# griffe compiles vLLM's docstrings; their invalid escapes are vLLM's business.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

KINDS = {"positional-only": "positional-only", "positional or keyword": "positional-or-keyword",
         "variadic positional": "var-positional", "keyword-only": "keyword-only",
         "variadic keyword": "var-keyword"}


@functools.cache
def loader(vllm: str) -> griffe.GriffeLoader:
    # No extensions: griffe's dataclasses extension would drop InitVar attributes of every class.
    return griffe.GriffeLoader(search_paths=[root("vllm", vllm)["root"]], allow_inspection=False,
                               extensions=griffe.Extensions())


def griffe_object(vllm: str, dotted: str):
    load = loader(vllm)
    try:
        return load.modules_collection[dotted]  # loading "vllm" once loads every submodule
    except KeyError:
        pass
    module = dotted
    while module:
        try:
            load.load(module)
            break
        except (ImportError, griffe.LoadingError, KeyError):
            module = module.rpartition(".")[0]
    return load.modules_collection[dotted]


def normalized(text) -> str | None:
    if text is None:
        return None
    try:
        return ast.unparse(ast.parse(str(text), mode="eval"))
    except SyntaxError:
        return str(text)


def from_function(function, *, bound: bool) -> list[tuple]:
    params = [(p.name, KINDS[p.kind.value], normalized(p.default)) for p in function.parameters]
    return params[1:] if bound else params


def field_default(value) -> tuple[bool, str | None]:
    """(in __init__, default text) of a dataclass attribute's value as griffe read it."""
    if value is None:
        return True, None
    text = str(value)
    call = ast.parse(text, mode="eval").body
    if isinstance(call, ast.Call) and ast.unparse(call.func).rpartition(".")[2] in ("Field", "field"):
        keywords = {k.arg: k.value for k in call.keywords}
        if isinstance(keywords.get("init"), ast.Constant) and keywords["init"].value is False:
            return False, None
        if "default" in keywords:
            return True, ast.unparse(keywords["default"])
        if "default_factory" in keywords:
            return True, ast.unparse(keywords["default_factory"]) + "()"
        if call.args and not (isinstance(call.args[0], ast.Constant) and call.args[0].value is Ellipsis):
            return True, ast.unparse(call.args[0])
        return True, None
    return True, normalized(text)


def from_dataclass(cls) -> list[tuple]:
    fields: dict[str, tuple] = {}
    for klass in [*reversed(cls.mro()), cls]:
        methods = [(m.lineno, m.endlineno) for m in klass.members.values() if m.is_function]
        for name, member in klass.members.items():
            if not member.is_attribute or member.annotation is None or "property" in member.labels:
                continue
            if any(start <= member.lineno <= end for start, end in methods):
                continue  # `self.x: T = ...` in a method: an attribute, not a field
            if "class-attribute" in member.labels and "instance-attribute" not in member.labels:
                continue  # griffe's reading of a ClassVar
            in_init, default = field_default(member.value)
            if in_init:
                fields[name] = (name, "positional-or-keyword", default)
            else:
                fields.pop(name, None)
    return list(fields.values())


def oracle(vllm: str, callee: str) -> list[tuple]:
    obj = griffe_object(vllm, callee)
    if obj.is_function:
        return from_function(obj, bound=obj.parent.is_class)
    for klass in [obj, *obj.mro()]:
        if "__init__" in klass.members:
            return from_function(klass.members["__init__"], bound=True)
    return from_dataclass(obj)


def reported_callees():
    """Every vLLM callable a consumer call was checked against, in each release."""
    for vllm in ("0.11.0", "0.16.0", "0.17.0"):
        for checked in report(vllm, model_config=str(KIMI_CONFIG))["checked"]:
            yield pytest.param(vllm, checked, id=f"{vllm}-{checked['callee']}")


@pytest.mark.parametrize(("vllm", "checked"), list(reported_callees()))
def test_parameters_match_griffe(vllm, checked):
    ours = [(p["name"], p["kind"], normalized(p["default"])) for p in checked["parameters"]]
    assert ours == oracle(vllm, checked["callee"])


def test_findings_carry_the_checked_parameters():
    data = report("0.17.0")
    checked = {c["callee"]: c["parameters"] for c in data["checked"]}
    for finding in data["findings"]:
        if "parameters" in finding:
            assert finding["parameters"] == checked[finding["callee"]]
