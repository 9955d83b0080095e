"""Engine settings vLLM refuses at start-up with the connector or method specrig launches with, read from
vLLM's config validation (`vllm/config/`), and what the launch passes because of them.

A refusal is an `if` whose test names the connector (`kv_connector == "ExampleHiddenStatesConnector"`) or
the method, and one setting of another config (`self.scheduler_config.enable_chunked_prefill`), and whose
body raises. It matters when that setting is on by default (its config field defaults to True): the
server launched as specrig launches it then stops before loading. When the parser takes the setting's
`--no-` form, the launch passes it (launch_settings()), on exactly the vLLM whose source has the refusal.

vLLM 0.22.0-0.23.0 (vllm/config/vllm.py, VllmConfig._post_init_kv_transfer_config) refuses chunked
prefill with ExampleHiddenStatesConnector; chunked prefill is on by default (SchedulerConfig).
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass

from drift import findings as F
from drift.classes import class_member
from drift.refs import ClassRef, ValueRef
from drift.server.context import Context, Problem, string_constants

#: The package of vLLM's configuration classes and their validation.
CONFIG_PACKAGE = "config"


@dataclass(frozen=True)
class Refusal:
    """One setting vLLM refuses with what specrig launches: where, its default, the flag avoiding it."""

    #: The config field: "enable_chunked_prefill".
    setting: str
    #: What the refusal names: the connector or the method.
    trigger: str
    #: The `if ...: raise` (a Location) and the text of vLLM's error.
    where: F.Location
    error: str
    #: The field's declaration (a Location) when it defaults to True; None when it is off by default.
    default_on: F.Location | None
    #: The server flag turning the setting off ("--no-enable-chunked-prefill"), or None when the parser has none.
    flag: str | None


def _conditions(test):
    return list(test.values) if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]


def _names_launch(condition, names):
    """Whether a condition tests for the connector or the method (a literal, or `uses_<method>()`)."""
    if any(text in names for text in string_constants(condition)):
        return True
    return any(isinstance(n, ast.Attribute) and n.attr in {"uses_" + name for name in names}
               for n in ast.walk(condition))


def _is_guard(condition):
    """`x is not None`: a precondition of the test, not a setting."""
    return (isinstance(condition, ast.Compare) and len(condition.ops) == 1 and isinstance(condition.ops[0], ast.IsNot)
            and isinstance(condition.comparators[0], ast.Constant) and condition.comparators[0].value is None)


def _error_text(body):
    for node in body:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Raise) and sub.exc is not None:
                return " ".join(string_constants(sub.exc)).replace("  ", " ")
    return None


def _enclosing_class(module, target):
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ClassDef) and any(sub is target for sub in ast.walk(node)):
            return ClassRef(module, node, node.name)
    return None


def _field_default_on(ctx, owner, setting):
    """The Location of `setting.attr`'s declaration when its config field defaults to True, else None.
    `setting` is `self.<group>.<field>` inside class `owner`; the group's class is its annotation there."""
    group = class_member(ctx.index, owner, setting.value.attr)
    if not isinstance(group, ValueRef) or not isinstance(group.node, ast.AnnAssign):
        return None
    annotation = group.node.annotation
    if isinstance(annotation, ast.BinOp):  # `SchedulerConfig | None`
        annotation = annotation.left
    config = ctx.index.resolve_in(group.module, annotation)
    if not isinstance(config, ClassRef):
        return None
    field = class_member(ctx.index, config, setting.attr)
    value = getattr(getattr(field, "node", None), "value", None)
    if isinstance(field, ValueRef) and isinstance(value, ast.Constant) and value.value is True:
        return F.Location.of(field.module, field.node)
    return None


def _off_flag(ctx, setting):
    option = "--" + setting.replace("_", "-")
    found = ctx.server_parser()
    return "--no-" + option[2:] if found is not None and found.knows("--no-" + option[2:]) else None


def _refusals_in(ctx, module, names):
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.If) or _error_text(node.body) is None:
            continue
        conditions = _conditions(node.test)
        trigger = [c for c in conditions if _names_launch(c, names)]
        rest = [c for c in conditions if c not in trigger and not _is_guard(c)]
        if not trigger or len(rest) != 1 or not isinstance(rest[0], ast.Attribute) \
                or not isinstance(rest[0].value, ast.Attribute):
            continue  # only "<launch> and <one setting on>" is read: anything else is not a default refusal
        owner = _enclosing_class(module, node)
        setting = rest[0]
        yield Refusal(setting=setting.attr, trigger=next(n for n in names if _names_launch(trigger[0], [n])),
                      where=F.Location(module, node.lineno, node.test.end_lineno), error=_error_text(node.body),
                      default_on=_field_default_on(ctx, owner, setting) if owner is not None else None,
                      flag=_off_flag(ctx, setting.attr))


def _refusals(ctx):
    """Every Refusal in vLLM's config validation of what specrig's launch sends (cached per Context)."""
    def read():
        names = (ctx.launch.CONNECTOR, ctx.launch.METHOD)
        found = []
        for name in ctx.tree.walk(ctx.package + "." + CONFIG_PACKAGE):
            if not any(n.encode() in ctx.tree.read_bytes(name) for n in names):
                continue
            module = ctx.tree.module(name)
            if module is not None and module.tree is not None:
                found += _refusals_in(ctx, module, names)
        return found
    return ctx.cached("startup-refusals", read)


def check_default_refused(ctx):
    """The point: each setting on by default that vLLM refuses with the connector or the method."""
    problems = []
    for refusal in _refusals(ctx):
        if refusal.default_on is None:
            continue
        problems.append(Problem(
            message=None, provider=refusal.where, callee=refusal.where.module.name, detail=refusal.setting,
            severity="note" if refusal.flag else "drift",
            advice=("none needed: specrig's launch passes %s on this vLLM" % refusal.flag) if refusal.flag else
            "no server flag turns %s off on this vLLM: use another vLLM release" % refusal.setting,
            facts={"trigger": refusal.trigger, "error": refusal.error, "launch_flag": refusal.flag,
                   "default": "%s:%d" % (refusal.default_on.module.relpath, refusal.default_on.start)}))
    return problems


def launch_settings(*, ctx):
    """What specrig's launch takes from this vLLM's source: the distribution, whether the parser has
    --enable-scale-out, and the flags avoiding start-up refusals ([{"flag", "because"}])."""
    found = ctx.server_parser()
    flags = [{"flag": r.flag, "because": "%s refuses %s with %s (%s:%d)" % (
        ctx.distribution.strip(), r.setting, r.trigger, r.where.module.relpath, r.where.start)}
        for r in _refusals(ctx) if r.default_on is not None and r.flag]
    return {"distribution": ctx.server_distribution,
            "enable_scale_out": found is not None and found.knows("--enable-scale-out"),
            "startup_flags": flags}


def installed_launch_settings(*, vllm_package_dir, distribution, version=None):
    """launch_settings() of the vLLM installed at `vllm_package_dir` (its `vllm/` directory), for a run's plan."""
    root, package = os.path.split(os.path.normpath(vllm_package_dir))
    ctx = Context([], {"root": root, "package": package, "name": distribution, "version": version}, None)
    return launch_settings(ctx=ctx)
