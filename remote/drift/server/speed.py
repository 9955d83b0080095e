"""The checks of what works but holds the extraction back: speed findings (severity "speed"), never a crash.

client-prompt-transform: speculators' client (data_generation/vllm_client.py, 0.8.0-0.9.0) sends each
sample as `client.completions.create(prompt=token_ids, ...)`. openai's Completions.create runs its request
transform (`maybe_transform` / `async_maybe_transform`) over the whole params dict, `prompt` included, and
that transform walks a list of token ids element by element with its typing checks: 10-20 us a token on one
core, 8-25 ms for a 512-1301-token prompt (benchmarks/gpu/client_request_cost.py). On an H200 that held the
client's event loop at a whole core, 78 % of it in the transform, and the GPU 67-73 % busy (docs/gpu.md,
"The fourth run"). openai merges `extra_body` into the transformed body without transforming it, so the same
JSON bytes go out with `prompt=[]` and the ids in `extra_body` (patchset speculators-0.8-0.9-client).

Consumer side: a call `<x>.completions.create(...)` in speculators' client passing `prompt=` anything but
an empty list. Provider side: openai's `[Async]Completions.create` passes "prompt" through its transform.
"""
import ast

from drift import findings as F
from drift.server.context import Problem, Skip

#: speculators' client module and openai's completions resource, as their trees name them.
CLIENT_MODULE = "speculators.data_generation.vllm_client"
COMPLETIONS_MODULE = "openai.resources.completions"
#: The transforms openai's resources run over a request's params, by the resource class's flavour.
TRANSFORMS = {"AsyncCompletions": "async_maybe_transform", "Completions": "maybe_transform"}
#: What one token costs in the transform on one core, measured (benchmarks/gpu/client_request_cost.py).
COST_PER_TOKEN_US = "10-20"


def check_client_prompt_transform(ctx):
    client = ctx.consumer_module("speculators", CLIENT_MODULE, "speculators has no %s" % CLIENT_MODULE)
    completions = ctx.consumer_module("openai", COMPLETIONS_MODULE,
                                      "openai is not installed beside speculators (its completions resource "
                                      "cannot be read)")
    transformed = {name: method for name, method in _create_methods(completions)
                   if _transforms_prompt(method, TRANSFORMS[name])}
    if not transformed:
        raise Skip("openai's Completions.create does not run its transform over the prompt")
    problems = []
    for function, call in _prompt_calls(client.tree):
        flavour = "AsyncCompletions" if isinstance(function, ast.AsyncFunctionDef) else "Completions"
        method = transformed.get(flavour)
        if method is None:
            continue
        callee = "%s.%s.create" % (COMPLETIONS_MODULE, flavour)
        problems.append(Problem(
            message=("a speed finding, not a crash: %s() sends prompt=%s, and openai's %s.create() runs its "
                     "request transform (%s) over that list of token ids element by element, about %s us a "
                     "token on one core, before the same JSON goes out: the client process, not the GPU, "
                     "then sets the pace of the extraction"
                     % (function.name, ast.unparse(_keyword(call, "prompt")), flavour, TRANSFORMS[flavour],
                        COST_PER_TOKEN_US)),
            provider=F.Location.of(completions, method), callee=callee, detail="prompt", severity=F.SPEED,
            consumer=F.Location(client, call.lineno)))
    return problems


def _create_methods(module):
    """(class name, `create` method node) of the Completions and AsyncCompletions classes."""
    for node in module.tree.body:
        if isinstance(node, ast.ClassDef) and node.name in TRANSFORMS:
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and member.name == "create":
                    yield node.name, member


def _transforms_prompt(method, transform):
    """Whether `method` calls `transform` on a dict literal holding the key "prompt"."""
    for node in ast.walk(method):
        if (isinstance(node, ast.Call) and _name(node.func) == transform and node.args
                and isinstance(node.args[0], ast.Dict)
                and any(isinstance(k, ast.Constant) and k.value == "prompt" for k in node.args[0].keys)):
            return True
    return False


def _prompt_calls(tree):
    """(innermost enclosing function, call) of each `<x>.completions.create(prompt=P)` where P is not `[]`."""
    enclosing = {}
    for function in ast.walk(tree):  # breadth first: an inner function overwrites its outer one below
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                enclosing[node] = function
    for node, function in enclosing.items():
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "create" and _name(node.func.value) == "completions"):
            continue
        prompt = _keyword(node, "prompt")
        if prompt is not None and not (isinstance(prompt, ast.List) and not prompt.elts):
            yield function, node


def _keyword(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _name(node):
    """The last name of a Name or an attribute chain (`client.completions` -> "completions")."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None
