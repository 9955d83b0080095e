"""Can this host's vLLM serve this model directory at all? Told in one line each, before any load (stdlib only).

Two checks, shared by `doctor` (remote/doctor/report.py) and the preflight (remote/run/preflight.py):

- **remote code**: the `auto_map` entries of config.json, tokenizer_config.json, preprocessor_config.json and
  processor_config.json that vLLM would run, and whether their files are in the directory. vLLM runs its own
  class for an architecture its registry lists and its own config class for a model_type its config registry
  lists (vllm/model_executor/models/registry.py, vllm/transformers_utils/config.py `_CONFIG_REGISTRY`,
  read with `ast`); the tokenizer's and the image processor's custom classes it loads through transformers
  with `trust_remote_code` (vllm/tokenizers/registry.py, vllm/transformers_utils/processor.py), and
  specrig's server command does not pass --trust-remote-code.
- **quantization**: the config's `quantization_config` against the GPUs' compute capability, by what vLLM's
  source requires (`QUANT_MIN_CAPABILITY`).
"""
import ast
import json
import os

from base import hfcache, server_command, telemetry
from base.failure import RemoteFailure
from drift import syntax

#: Files whose `auto_map` names custom code, and what loads each.
AUTO_MAP_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json")
#: The least compute capability (major * 10 + minor) vLLM 0.26 serves a quantization method on, from its
#: source: CompressedTensorsConfig.get_min_capability() returns 70
#: (vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:116), checked against
#: the GPU at vllm/config/vllm.py:684 ("The quantization method ... is not supported for the current GPU").
QUANT_MIN_CAPABILITY = {"compressed-tensors": 70}
#: Below this, vLLM 0.26 has no Marlin kernel for INT4 weights (marlin_utils.query_marlin_supported_quant_types:
#: `if device_capability < 75: return []`): INT4 MoE experts then run on the slower Triton WNA16 kernel.
MARLIN_MIN_CAPABILITY = 75
#: vLLM's Marlin MoE kernel's shapes (marlin_utils.check_moe_marlin_supports_layer): hidden_size a multiple
#: of this, the experts' intermediate size per GPU a multiple of the group size.
MARLIN_HIDDEN_MULTIPLE = 128


def host_checks(model, *, server_python=None, tp=None, visible=None):
    """Both checks for `model` (a directory or a repo id in the hub cache) on this host: the vLLM of
    `server_python` (default: this environment), the GPUs nvidia-smi shows (`visible`: CUDA_VISIBLE_DEVICES).
    [] when the model cannot be found or read: the model check says why."""
    try:
        model_dir = hfcache.resolve(model, os.environ).path
    except RemoteFailure:
        return []
    config = _json(os.path.join(model_dir, "config.json"))
    if not config:
        return []
    try:
        vllm_dir = server_command.server_environment(server_python)[1]
    except server_command.PlanError:
        vllm_dir = None
    caps = telemetry.compute_caps(timeout=15)
    return [remote_code_check(model_dir, vllm_dir), quantization_check(config, telemetry.visible_gpus(caps["gpus"], visible), tp)]


def check(name, ok, detail, advice=None):
    return {"name": name, "ok": bool(ok), "detail": detail, "advice": None if ok else advice}


def _json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            content = json.load(handle)
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def _references(auto_map):
    """(auto_map key, 'module.Class') pairs; a tokenizer's entry may be a [slow, fast] pair with None."""
    for key, value in sorted(auto_map.items()):
        for reference in value if isinstance(value, list) else [value]:
            if isinstance(reference, str) and reference:
                yield key, reference


def _served_by_vllm(file_name, key, config, vllm_names):
    """Whether vLLM runs its own code instead of this auto_map entry of config.json."""
    if file_name != "config.json" or vllm_names is None:
        return False
    if key == "AutoConfig":
        return config.get("model_type") in vllm_names["config_types"]
    return any(arch in vllm_names["architectures"] for arch in config.get("architectures") or [])


def remote_code(model_dir, vllm_dir=None):
    """[{file, key, reference, module_file, present, needed}] for every auto_map entry of the directory's files;
    `needed` False where vLLM (at `vllm_dir`, its `vllm/` package directory) runs its own class instead."""
    config = _json(os.path.join(model_dir, "config.json"))
    vllm_names = vllm_registries(vllm_dir) if vllm_dir else None
    entries = []
    for file_name in AUTO_MAP_FILES:
        auto_map = _json(os.path.join(model_dir, file_name)).get("auto_map")
        if not isinstance(auto_map, dict):
            continue
        for key, reference in _references(auto_map):
            # "org/repo--module.Class" names code in another repository: never in this directory.
            local = "--" not in reference
            module_file = reference.split("--")[-1].rsplit(".", 1)[0].replace(".", os.sep) + ".py"
            entries.append({"file": file_name, "key": key, "reference": reference, "module_file": module_file,
                            "present": local and os.path.isfile(os.path.join(model_dir, module_file)),
                            "needed": not _served_by_vllm(file_name, key, config, vllm_names)})
    return entries


def remote_code_check(model_dir, vllm_dir=None):
    """One line: the custom code vLLM would need from the directory, and whether it is there."""
    needed = [e for e in remote_code(model_dir, vllm_dir) if e["needed"]]
    if not needed:
        return check("remote-code", True, "no custom code needed (no auto_map vLLM would follow)")
    missing = [e for e in needed if not e["present"]]
    named = ", ".join("%s (%s %s)" % (e["module_file"], e["file"], e["key"]) for e in (missing or needed))
    if missing:
        return check("remote-code", False, "custom code missing from %s: %s" % (model_dir, named),
                     "download the model directory whole (its *.py files too: `hf download REPO`), or use a "
                     "copy whose config needs none")
    return check("remote-code", False, "needs custom code run with --trust-remote-code: %s" % named,
                 "specrig's server command does not pass --trust-remote-code; use a directory whose "
                 "tokenizer and processor load without custom code")


def vllm_registries(vllm_dir):
    """{architectures, config_types}: the names vLLM serves with its own classes, read from its source (ast)."""
    names = {"architectures": set(), "config_types": set()}
    registry = syntax.parse_file(os.path.join(vllm_dir, "model_executor", "models", "registry.py"))
    for node in ast.walk(registry) if registry else ():
        if isinstance(node, ast.Dict):
            names["architectures"].update(k.value for k in node.keys
                                          if isinstance(k, ast.Constant) and isinstance(k.value, str))
    configs = syntax.parse_file(os.path.join(vllm_dir, "transformers_utils", "config.py"))
    for node in ast.walk(configs) if configs else ():
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call)
                and any(isinstance(t, ast.Name) and t.id == "_CONFIG_REGISTRY"
                        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
            names["config_types"].update(k.arg for k in node.value.keywords if k.arg)
    return names


# -- quantization against the GPUs ------------------------------------------------------------------------

def _capability(text):
    """'9.0' -> 90; None when nvidia-smi gave none."""
    try:
        major, minor = str(text).strip().split(".")
        return int(major) * 10 + int(minor)
    except (AttributeError, ValueError):
        return None


def _weights(quant):
    """The first config group's weights scheme of a compressed-tensors config, or {}."""
    for group in (quant.get("config_groups") or {}).values():
        if isinstance(group, dict) and isinstance(group.get("weights"), dict):
            return group["weights"]
    return {}


def quantization_check(config, gpus, tp=None):
    """One line: the model's quantization on the GPUs the run takes (`gpus`: nvidia-smi rows with
    compute_cap; the first `tp` are used)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    quant = config.get("quantization_config") or text.get("quantization_config")
    if not isinstance(quant, dict):
        return check("quantization", True, "none (weights in %s)" % (text.get("dtype") or text.get("torch_dtype")
                                                                      or config.get("dtype") or "the model's dtype"))
    method = quant.get("quant_method") or "?"
    weights = _weights(quant)
    scheme = method
    if weights:
        scheme += " %s%s %s group %s" % (weights.get("type", "?"), weights.get("num_bits", "?"),
                                         quant.get("format", "?"), weights.get("group_size"))
    used = gpus[:tp or len(gpus)]
    caps = [c for c in (_capability(g.get("compute_cap")) for g in used) if c is not None]
    if not caps:
        return check("quantization", True, "%s: no GPU capability known, not checked" % scheme)
    lowest, least = min(caps), QUANT_MIN_CAPABILITY.get(method)
    where = "sm_%d" % lowest
    if least is None:
        return check("quantization", True, "%s on %s: not a method specrig knows vLLM's floor of" % (scheme, where))
    if lowest < least:
        return check("quantization", False, "%s needs compute capability %d.%d+ in vLLM; the GPUs are %s"
                     % (scheme, least // 10, least % 10, where), "use GPUs of sm_%d or newer" % least)
    notes = []
    if weights.get("num_bits") == 4 and lowest < MARLIN_MIN_CAPABILITY:
        notes.append("no Marlin kernel below sm_%d: INT4 experts on Triton's slower kernel" % MARLIN_MIN_CAPABILITY)
    if text.get("n_routed_experts") and weights.get("group_size"):
        per_gpu = text.get("moe_intermediate_size", 0) // (tp or 1)
        if text.get("hidden_size", 0) % MARLIN_HIDDEN_MULTIPLE or per_gpu % weights["group_size"]:
            notes.append("hidden %s / experts' %s per GPU outside Marlin's tiles: Triton's kernel"
                         % (text.get("hidden_size"), per_gpu))
    return check("quantization", True, "%s on %s%s" % (scheme, where, "".join("; " + n for n in notes)))
