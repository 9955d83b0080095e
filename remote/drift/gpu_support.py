"""What the installed vLLM does on GPUs of one compute capability (issue 38, point 4), read from its source with
`ast` as the analyzer reads everything else; nothing imported. Each answer is a check {name, ok, detail, advice}
whose detail names the source it was read from (`vllm/platforms/cuda.py:132`):

- `mla-backend`: the MLA attention backends vLLM would try for the capability, in its order
  (platforms/cuda.py `_get_backend_priorities`), and whether each one's `supports_compute_capability` takes it;
- `custom-all-reduce` and `symm-mem`: whether vLLM's own all-reduces are on for the GPU count and topology
  (CustomAllreduce's world sizes and its PCIe-only refusal, the size tables per capability, envs.py's defaults);
- `int4-moe`: the compressed-tensors INT4 (WNA16) MoE method and the device gates of its Marlin kernel.

A capability test is evaluated where it is one of the forms vLLM writes (`capability.major == 12`,
`.major in [9, 10]`, `has_device_capability((7, 5))`, `is_device_capability_family(120)`, `is_cuda()`); any other
is "unknown", never guessed.
"""
import ast
import os

from drift import syntax

HAS, IS, FAMILY = "has_device_capability", "is_device_capability", "is_device_capability_family"
TRUE_ON_CUDA = ("is_cuda", "is_cuda_alike")
FALSE_ON_CUDA = ("is_rocm", "is_cpu", "is_xpu", "is_tpu")
COMMUNICATORS = os.path.join("distributed", "device_communicators")


def ref(vllm_dir, path, node, end=False):
    """'vllm/platforms/cuda.py:132' (or :132-136 with `end`)."""
    where = os.path.relpath(path, os.path.dirname(vllm_dir))
    last = getattr(node, "end_lineno", None)
    return "%s:%d%s" % (where, node.lineno, "-%d" % last if end and last and last != node.lineno else "")


# -- a capability test, evaluated ---------------------------------------------------------------------------

def _as_cap(node):
    """(12, 0) from 120, (7, 5) from (7, 5) or 75; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return divmod(node.value, 10)
    if isinstance(node, ast.Tuple) and len(node.elts) == 2 and all(
            isinstance(e, ast.Constant) and isinstance(e.value, int) for e in node.elts):
        return (node.elts[0].value, node.elts[1].value)
    return None


def _value(node, cap):
    if isinstance(node, ast.Attribute) and node.attr in ("major", "minor"):
        return cap[0] if node.attr == "major" else cap[1]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to_int":
        return cap[0] * 10 + cap[1]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        values = [_value(e, cap) for e in node.elts]
        return None if None in values else values
    return None


COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
           ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
           ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def evaluate(node, cap):
    """True/False of a capability test at `cap` ((12, 0)); None where the test is not one of vLLM's forms."""
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = evaluate(node.operand, cap)
        return None if inner is None else not inner
    if isinstance(node, ast.BoolOp):
        values = [evaluate(v, cap) for v in node.values]
        if isinstance(node.op, ast.And):
            return False if False in values else (None if None in values else True)
        return True if True in values else (None if None in values else False)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARE:
        left, right = _value(node.left, cap), _value(node.comparators[0], cap)
        if left is None or right is None or isinstance(left, list):
            return None
        try:
            return COMPARE[type(node.ops[0])](left, right)
        except TypeError:
            return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        name = node.func.attr
        if name in TRUE_ON_CUDA or name in FALSE_ON_CUDA:
            return name in TRUE_ON_CUDA
        wanted = _as_cap(node.args[0]) if node.args else None
        if wanted and name == HAS:
            return cap >= wanted
        if wanted and name == IS:
            return cap == wanted
        if node.args and name == FAMILY and isinstance(node.args[0], ast.Constant):
            return cap[0] == node.args[0].value // 10
    return None


def _function(tree, name):
    return next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == name), None) if tree else None


def _class(tree, name):
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None) if tree else None


def _returned(function):
    return next((n.value for n in ast.walk(function) if isinstance(n, ast.Return) and n.value is not None), None)


# -- MLA attention backends -----------------------------------------------------------------------------------

def _taken(body, cap, taken):
    """The statements of `body` whose If tests hold at `cap` (both ways where unknown); the If lines taken."""
    for statement in body:
        if isinstance(statement, ast.If) and not (isinstance(statement.test, ast.Name)):
            verdict = evaluate(statement.test, cap)
            if verdict is not False:
                taken.append(statement)
                yield from _taken(statement.body, cap, taken)
            if verdict is not True:
                yield from _taken(statement.orelse, cap, taken)
        else:
            yield statement


def mla_priorities(vllm_dir, cap):
    """{"backends": [names, vLLM's order], "ref"} for MLA at `cap`, or None where the source has no such table."""
    path = os.path.join(vllm_dir, "platforms", "cuda.py")
    function = _function(syntax.parse_file(path), "_get_backend_priorities")
    branch = next((n for n in ast.walk(function) if isinstance(n, ast.If) and isinstance(n.test, ast.Name)
                   and n.test.id == "use_mla"), None) if function else None
    if branch is None:
        return None
    taken, names = [], []
    for statement in _taken(branch.body, cap, taken):
        for node in ast.walk(statement):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.isupper() \
                    and node.value.id in ("AttentionBackendEnum", "_Backend") and node.attr not in names:
                names.append(node.attr)
    where = taken[-1] if taken else branch
    return {"backends": names, "ref": ref(vllm_dir, path, where, end=True)}


def backend_support(vllm_dir, name, cap):
    """{"backend", "supports": bool or None, "ref"}: the backend's supports_compute_capability at `cap`."""
    registry = os.path.join(vllm_dir, "v1", "attention", "backends", "registry.py")
    enum = _class(syntax.parse_file(registry), "AttentionBackendEnum")
    dotted = None
    for node in (enum.body if enum else ()):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            dotted = node.value.value
    if not dotted:
        return {"backend": name, "supports": None, "ref": "not in %s" % os.path.relpath(registry, vllm_dir)}
    module, cls = dotted.rsplit(".", 1)
    path = os.path.join(os.path.dirname(vllm_dir), *module.split(".")) + ".py"
    tree = syntax.parse_file(path)
    klass = _class(tree, cls)
    method = _function(klass, "supports_compute_capability") if klass else None
    if method is None:  # inherited from the base class: every capability
        return {"backend": name, "supports": True if klass else None,
                "ref": "%s (no supports_compute_capability of its own)" % (ref(vllm_dir, path, klass) if klass
                                                                           else dotted)}
    return {"backend": name, "supports": evaluate(_returned(method), cap), "ref": ref(vllm_dir, path, method)}


def mla_check(vllm_dir, cap, sparse=False):
    found = mla_priorities(vllm_dir, cap)
    sm = "sm_%d%d" % cap
    if found is None:
        return _check("mla-backend", True, "vLLM's MLA backend order not found in platforms/cuda.py: not checked")
    tried = [backend_support(vllm_dir, name, cap) for name in found["backends"]
             if sparse or "SPARSE" not in name]
    picked = next((b for b in tried if b["supports"]), None)
    listing = "; ".join("%s %s (%s)" % (b["backend"], {True: "takes", False: "refuses", None: "unknown for"}[
        b["supports"]] + " " + sm, b["ref"]) for b in tried)
    if picked:
        return _check("mla-backend", True, "%s: vLLM picks %s (order at %s): %s" % (
            sm, picked["backend"], found["ref"], listing))
    return _check("mla-backend", False, "%s: no MLA backend of vLLM's order (%s) takes it: %s" % (
        sm, found["ref"], listing), "use a vLLM whose MLA backends support %s (vLLM #47266), or "
                                    "--attention-backend TRITON_MLA where it exists" % sm)


def _check(name, ok, detail, advice=None):
    return {"name": name, "ok": bool(ok), "detail": detail, "advice": None if ok else advice}


# -- vLLM's own all-reduces -------------------------------------------------------------------------------------

def _assigned(vllm_dir, name):
    """(value node, ref) of the first module-level or class-level `name = ...` under device_communicators/."""
    folder = os.path.join(vllm_dir, COMMUNICATORS)
    for file_name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        path = os.path.join(folder, file_name)
        if not file_name.endswith(".py"):
            continue
        for node in ast.walk(syntax.parse_file(path) or ast.Module(body=[], type_ignores=[])):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return node.value, ref(vllm_dir, path, node)
    return None, None


def _env_default(vllm_dir, variable):
    """(the default text of vLLM's environment variable, ref) from envs.py's getenv(variable, default)."""
    path = os.path.join(vllm_dir, "envs.py")
    for node in ast.walk(syntax.parse_file(path) or ast.Module(body=[], type_ignores=[])):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getenv" \
                and len(node.args) == 2 and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value == variable and isinstance(node.args[1], ast.Constant):
            return node.args[1].value, ref(vllm_dir, path, node)
    return None, None


def _sizes(node):
    """{'9.0': [2, 4, 6, 8], ...} of a size table; {} when it is not a literal dict."""
    if not isinstance(node, ast.Dict):
        return {}
    return {k.value: [e.value for e in v.keys if isinstance(e, ast.Constant)] if isinstance(v, ast.Dict) else []
            for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}


def all_reduce_checks(vllm_dir, cap, world, pcie_only):
    """custom-all-reduce and symm-mem for `world` GPUs of `cap`, PCIe only or not."""
    version = "%d.%d" % cap
    if world <= 1:
        return [_check("custom-all-reduce", True, "one GPU: vLLM runs no all-reduce")]
    path = os.path.join(vllm_dir, COMMUNICATORS, "custom_all_reduce.py")
    sizes_node, sizes_ref = _assigned(vllm_dir, "_SUPPORTED_WORLD_SIZES")
    worlds = _value(sizes_node, cap) if sizes_node is not None else None
    text = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
    refusal = text.find("more than two PCIe-only GPUs")
    refusal_ref = "%s:%d" % (os.path.relpath(path, os.path.dirname(vllm_dir)), text.count("\n", 0, refusal) + 1) \
        if refusal >= 0 else None
    table, table_ref = _assigned(vllm_dir, "CUSTOM_ALL_REDUCE_MAX_SIZES")
    skip, skip_ref = _env_default(vllm_dir, "VLLM_SKIP_P2P_CHECK")
    if worlds is not None and world not in worlds:
        custom = "off: world size %d is not one of %s (%s)" % (world, worlds, sizes_ref)
    elif pcie_only and world > 2 and refusal_ref:
        custom = "off: \"not supported on more than two PCIe-only GPUs\" (%s)" % refusal_ref
    else:
        custom = "on for %d %sGPUs%s%s" % (
            world, "PCIe-only " if pcie_only else "", ", trusting the driver's P2P report (VLLM_SKIP_P2P_CHECK "
            "default %r, %s)" % (skip, skip_ref) if skip == "1" else "",
            "; no size table for %s (%s: %s): its default size" % (version, table_ref, ", ".join(_sizes(table)))
            if table is not None and version not in _sizes(table) else "")
    found = [_check("custom-all-reduce", True, custom)]
    symm, symm_ref = _assigned(vllm_dir, "SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    use, use_ref = _env_default(vllm_dir, "VLLM_ALLREDUCE_USE_SYMM_MEM")
    if symm is None:
        found.append(_check("symm-mem", True, "no symmetric-memory all-reduce in this vLLM"))
    elif use == "0":
        found.append(_check("symm-mem", True, "off by default (VLLM_ALLREDUCE_USE_SYMM_MEM, %s)" % use_ref))
    elif version not in _sizes(symm):
        found.append(_check("symm-mem", True, "off on %s: no sizes for it (%s has %s)" % (
            version, symm_ref, ", ".join(_sizes(symm)))))
    else:
        on = world in _sizes(symm)[version]
        found.append(_check("symm-mem", True, "%s for %d GPUs of %s (%s)" % ("on" if on else "off", world, version,
                                                                          symm_ref)))
    return found


# -- the INT4 compressed-tensors MoE path -------------------------------------------------------------------------

def int4_moe_check(vllm_dir, cap):
    """The WNA16 MoE method compressed-tensors returns, and the device gates of the Marlin MoE kernel at `cap`."""
    sm = "sm_%d%d" % cap
    layers = os.path.join(vllm_dir, "model_executor", "layers")
    method, gates = None, []
    for root, _, files in os.walk(layers):
        for file_name in sorted(files):
            path = os.path.join(root, file_name)
            if not file_name.endswith(".py") or ("compressed_tensors_moe" not in file_name and "marlin" not in file_name):
                continue
            tree = syntax.parse_file(path)
            if tree is None:
                continue
            if method is None and "compressed_tensors_moe" in file_name:
                method = next((ref(vllm_dir, path, n) + " " + n.name for n in ast.walk(tree)
                               if isinstance(n, ast.ClassDef) and "WNA16" in n.name and "MoE" in n.name), None)
            if "marlin" in file_name and "fused_moe" in root + file_name:
                function = _function(tree, "_supports_current_device")
                if function is not None:
                    gates.append((evaluate(_returned(function), cap), ref(vllm_dir, path, _returned(function))))
    if method is None:
        return _check("int4-moe", True, "no compressed-tensors WNA16 MoE method found: not checked")
    if not gates:
        return _check("int4-moe", True, "%s; no device gate of a Marlin MoE kernel found: not checked" % method)
    verdict = [ok for ok, _ in gates]
    detail = "%s; Marlin MoE kernel's device gate %s %s (%s)" % (
        method, {True: "takes", False: "refuses", None: "is unknown for"}[
            True if all(verdict) else (False if False in verdict else None)], sm, ", ".join(r for _, r in gates))
    if False in verdict:
        return _check("int4-moe", False, detail, "INT4 experts need Marlin on %s: a vLLM whose Marlin MoE takes it"
                      % sm)
    return _check("int4-moe", True, detail + "; whether the wheel's compiled kernels include %s is the build's: "
                  "the torch-arch check reads torch's, vLLM's own are not read" % sm)
