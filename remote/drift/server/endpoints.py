"""The contract's points in vLLM's HTTP API: the completion protocol's fields (C6, C7), the render
endpoint prepare-data calls, whether it is enabled, what it takes and answers (C8-C11), /health and
/v1/models (C12).
"""
import ast

from drift import findings as F
from drift.classes import class_member
from drift.refs import ClassRef, MissingRef
from drift.server.context import COMPLETION_PROTOCOL, RENDER_PATH, Problem, Skip


def _field(ctx, module, class_name, field):
    """(ClassRef, member) of a protocol class's field; member is a MissingRef when absent."""
    cls = ctx.cls(module, class_name)
    if cls is None:
        raise Skip("%s defines no %s" % (module.relpath, class_name))
    return cls, _member(ctx, cls, field)


def _member(ctx, cls, name):
    """A class's member, where no unread base (pydantic's BaseModel, torch) provides one of vLLM's fields."""
    return class_member(ctx.index, cls, name, opaque_lacks=lambda base, n: True)


def _protocol_fields(ctx, fields):
    module = ctx.need(COMPLETION_PROTOCOL, "completion protocol")
    problems = []
    for class_name, field, why in fields:
        cls, member = _field(ctx, module, class_name, field)
        if isinstance(member, MissingRef):
            problems.append(Problem("%s has no field %r: %s" % (class_name, field, why),
                                    provider=F.Location.of(module, cls.node), callee=cls.dotted, detail=field))
    return problems


def check_response_field(ctx):
    return _protocol_fields(ctx, [("CompletionResponse", "kv_transfer_params",
                                   "the client finds no hidden_states_path in the answer.")])


def check_token_ids(ctx):
    return _protocol_fields(ctx, [
        ("CompletionRequest", "return_token_ids", "the server ignores the client's request for the prompt's ids."),
        ("CompletionResponseChoice", "prompt_token_ids", "the client rejects every answer (no prompt_token_ids)."),
    ])


def _render_route(ctx):
    found = ctx.route_or_unread(RENDER_PATH)
    if not found:
        raise Skip("no render endpoint")
    return found[0]


def check_render_path(ctx):
    if ctx.route_or_unread(RENDER_PATH):
        return []
    module = ctx.module(("entrypoints.openai.api_server",))
    return [Problem("No route serves POST %s: prepare-data gets 404 for every conversation." % RENDER_PATH,
                    provider=(F.Location.of(module, module.tree.body[0]) if module is not None and module.tree.body
                              else None),
                    callee=ctx.package + ".entrypoints", detail=RENDER_PATH)]


def check_render_enabled(ctx):
    module, _, _ = _render_route(ctx)
    if ".scale_out." not in module.name + ".":
        return []  # served with the OpenAI routes, unconditionally
    gate = None
    for name in ctx.tree.walk(module.name.rsplit(".", 2)[0]):
        if b"enable_scale_out" in ctx.tree.read_bytes(name):
            gate_module = ctx.tree.module(name)
            for node in ast.walk(gate_module.tree):
                if isinstance(node, ast.Constant) and node.value == "enable_scale_out":
                    gate = (gate_module, node)
                    break
            if gate:
                break
    if gate is None:
        return []
    found = ctx.server_parser()
    if found is not None and found.knows("--enable-scale-out"):
        ctx.remarks[ctx.current] = ("served only with --enable-scale-out (%s:%d, 403 otherwise): the launch must "
                                    "be given enable_scale_out" % (gate[0].relpath, gate[1].lineno))
        return []
    return [Problem("The render endpoint is one of the scale-out endpoints, answered with 403 unless the server "
                    "runs with --enable-scale-out, and the server's parser (make_arg_parser and the classes it "
                    "adds) has no such flag.", provider=F.Location.of(gate[0], gate[1]),
                    callee=gate[0].name, detail="enable_scale_out")]


def check_render_request(ctx):
    module, function, _ = _render_route(ctx)
    args = function.args.posonlyargs + function.args.args
    if not args or args[0].annotation is None:
        raise Skip("the render handler's request type is not annotated")
    cls = ctx.index.resolve_in(module, args[0].annotation)
    if not isinstance(cls, ClassRef):
        raise Skip("the render handler's request type is not read")
    sent = _render_fields_sent(ctx)
    problems = []
    for field in sent:
        if isinstance(_member(ctx, cls, field), MissingRef):
            problems.append(Problem(
                "%s, the render endpoint's request, has no field %r, which prepare-data sends: the server ignores "
                "it%s." % (cls.node.name, field,
                           " (it truncates from the default side, not the right: long conversations lose their "
                           "beginning, not their end)" if field == "truncation_side" else ""),
                provider=F.Location.of(cls.module, cls.node), callee=cls.dotted, detail=field))
    return problems


def _render_fields_sent(ctx):
    module = ctx.consumer_module("speculators", "speculators.data_generation.render_client",
                                 "speculators has no render client")
    fields = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == "body" and isinstance(node.value, ast.Dict):
                fields += [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
            elif (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                  and target.value.id == "body"):
                key = target.slice.value if type(target.slice).__name__ == "Index" else target.slice
                if isinstance(key, ast.Constant):
                    fields.append(key.value)
    return sorted(set(fields))


def check_render_answer(ctx):
    module, function, decorator = _render_route(ctx)
    model = next((k.value for k in decorator.keywords if k.arg == "response_model"), None)
    if model is None:
        raise Skip("the render route declares no response_model")
    if isinstance(model, ast.Name) and model.id in ("list", "List") or isinstance(model, ast.Subscript) and (
            getattr(model.value, "id", None) in ("list", "List")):
        return [Problem("The render endpoint answers a list (the conversation and engine prompts), not an object "
                        "with 'token_ids': prepare-data's render client raises RenderError for every conversation.",
                        provider=F.Location.of(module, function), callee=module.name + "." + function.name,
                        detail="token_ids")]
    cls = ctx.index.resolve_in(module, model)
    if isinstance(cls, ClassRef) and isinstance(_member(ctx, cls, "token_ids"), MissingRef):
        return [Problem("The render endpoint answers %s, which has no 'token_ids': prepare-data's render client "
                        "raises RenderError." % cls.node.name, provider=F.Location.of(module, function),
                        callee=module.name + "." + function.name, detail="token_ids")]
    return []


def check_health_models(ctx):
    problems = []
    for path, who in (("/health", "specrig waits for GET /health before it starts the client"),
                      ("/v1/models", "the client asks GET /v1/models for the served model")):
        if not ctx.route_or_unread(path):
            problems.append(Problem("No route serves %s: %s." % (path, who), callee=ctx.package + ".entrypoints",
                                    detail=path))
    return problems
