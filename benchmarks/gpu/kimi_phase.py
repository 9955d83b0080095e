"""Issue 29's phases of the GPU run: the shrunk Kimi-K2.5 (shrunk_kimi.py) through specrig's own tasks on the
device, vLLM 0.26.0 + speculators 0.9.0, `inv ... --host local` as a user runs them. device_run.py hands any
phase named kimi:STEP here (`run(harness, phase)`, harness: harness.py, its inv, run, record, ...).

    kimi:build    shrunk_kimi.py build: $SG/models/kimi/{kimi-k25, kimi-k2-text, reference-bf16} and
                  N_KIMI_DATA conversations; the model checks (remote/run/model_support.py) on both directories
    kimi:drift    inv verify-signatures and inv apply-patches with --model the stand-in: the findings as the
                  analyzer sees them for this class
    kimi:forward  vLLM's own residual stream at the same ids with extraction off (vllm_forward.py: forward
                  hooks in the offline LLM), N_KIMI_FORWARD chats: the class, else the text model alone, else
                  its bf16 copy
    kimi:states   each kept set not yet checked in the call (the forward's; after kimi:extract, what it
                  kept) against transformers' forward of the dequantized bf16 copy (gpu_tools.py reference: the tolerance from bf16's own error, the
                  shifted-layer control that must fail)
    kimi:extract  inv extract --max-samples 64, speculators' own layer choice for the shrunk depth (the
                  function that gives [2, 30, 58, 61] for 61 layers gives [2, 4, 5, 8] for 8), --enforce-eager
                  (no compile in a call of 600 s); the class first: as a user runs it (the preflight, which
                  refuses it for verify-signatures' mla-refused, predicted for vLLM 0.26.0) and, refused
                  there, again with --skip-preflight to see vLLM's own verdict; the text model alone when
                  that run fails otherwise than by the connector's refusal of MLA; files kept for kimi:states
    kimi:smoke    inv smoke --model the stand-in (the driver on its config shrunk again, dummy weights)

Environment: as harness.py reads it; N_KIMI_DATA (256 conversations), N_KIMI_FORWARD (16 chats).
"""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
N_SAMPLES = 64
N_KIMI_DATA = int(os.environ.get("N_KIMI_DATA", "256"))
#: The published depth, whose layer choice is mapped onto the shrunk one by the same function.
PUBLISHED_LAYERS = 61


def paths(harness):
    root = os.path.join(harness.SG, "models", "kimi")
    return {"root": root, "kimi": os.path.join(root, "kimi-k25"), "text": os.path.join(root, "kimi-k2-text"),
            "reference": os.path.join(root, "reference-bf16"),
            "data": os.path.join(harness.SG, "data", "chat-kimi.jsonl")}


def default_layer_ids(num_layers):
    """speculators' default choice as specrig's launch reads it (remote/base/server_command.py)."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "remote"))
    from base import server_command as launch

    return launch.default_layer_ids(num_layers)


def model_checks(model):
    """remote/run/model_support.py's checks of `model` on this machine, as doctor and the preflight make them."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "remote"))
    from run import model_support

    return model_support.host_checks(model)


def step_build(harness):
    where = paths(harness)
    if not os.path.exists(os.path.join(where["kimi"], "config.json")):
        rc, out, err, seconds = harness.run([sys.executable, os.path.join(HERE, "shrunk_kimi.py"), "build",
                                             where["root"], where["data"], str(N_KIMI_DATA)], timeout=600)
        harness.log("shrunk_kimi build rc %d in %.0f s: %s %s" % (rc, seconds, out[-400:], err[-1500:] if rc else ""))
        harness.record("kimi_build", {"exit": rc, "seconds": seconds,
                                      "built": json.loads(out.strip().splitlines()[-1]) if rc == 0 else err[-2000:]})
        if rc:
            raise SystemExit("the shrunk Kimi build failed")
    harness.record("kimi_model_checks", {name: model_checks(where[name]) for name in ("kimi", "text")})
    harness.record("kimi_numba", __import__("importlib.util").util.find_spec("numba") is not None)


def step_drift(harness):
    model = paths(harness)["kimi"]
    found = {}
    for task in ("verify-signatures", "apply-patches"):
        done = harness.inv(task, "--host", "local", "--model", model, "--json", timeout=300)
        found[task] = {"argv": done["argv"], "exit": done["exit"], "seconds": done["seconds"],
                       "stderr_tail": done["stderr_tail"],
                       "result": harness.trim_patch_result(done["json"]) if task == "apply-patches" else done["json"]}
        harness.log("%s: exit %s in %.1f s" % (task, done["exit"], done["seconds"]))
    harness.record("kimi_drift", found)


def extract_one(harness, name, model, skip_preflight=False):
    """inv extract of `model` over N_SAMPLES; its files kept for kimi:states when it wrote any."""
    out = os.path.join(harness.SG, "out", "kimi-" + name)
    shutil.rmtree(out, ignore_errors=True)
    launched = harness.inv("extract", "--host", "local", "--model", model, "--data", paths(harness)["data"],
                           "--out", out, "--max-len", "2048", "--max-samples", str(N_SAMPLES), "--port",
                           str(harness.PORT), "--enforce-eager", *(["--skip-preflight"] if skip_preflight else []),
                           "--json", timeout=600)
    info = launched["json"] or {}
    found = {"model": model, "launch_exit": launched["exit"], "launch_s": launched["seconds"],
             "skip_preflight": skip_preflight, "stderr_tail": launched["stderr_tail"],
             "preflight": info.get("preflight")}
    if not info.get("launched"):
        return dict(found, error="not launched", failed_checks=[c.get("name") for c in info.get("preflight") or []
                                                                 if not c.get("ok")])
    beat, status, done = harness.wait_run(info["path"], lambda b, s: harness.run_state(info["path"]) in harness.FINAL,
                                          timeout=540)
    plan = (harness.read_json(os.path.join(info["path"], "run.json"), {}) or {}).get("server") or {}
    files = harness.hs_files(out)
    harness.keep_run_files("kimi-" + name, info["path"])
    found.update(state=harness.run_state(info["path"]), run_id=info["run_id"], samples=len(files),
                 tokens=harness.tokens_in(files), layer_ids=plan.get("layer_ids"),
                 num_hidden_layers=plan.get("num_hidden_layers"), server_argv=plan.get("server_argv"),
                 error=(status or {}).get("error"), mla_refused=mla_refused(info["path"]))
    if files:
        keep = os.path.join(harness.SG, "states-input", "kimi-" + name)
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(out, keep, ignore=shutil.ignore_patterns(".specrig-staging"))
        found["kept"] = keep
    return found


#: What vLLM 0.26's ExampleHiddenStatesConnector raises at start-up for an MLA target
#: (example_hidden_states_connector.py:133-137); specrig's analyzer predicts it (point C16, mla-refused).
MLA_REFUSAL = "Could not uniquely identify the extract-hidden-states KV cache group"


def mla_refused(run_path):
    """Whether the run's server log holds the connector's refusal of an MLA target."""
    try:
        with open(os.path.join(run_path, "server.log"), errors="replace") as handle:
            return MLA_REFUSAL in handle.read()
    except OSError:
        return None


def step_extract(harness):
    where = paths(harness)
    mapped = default_layer_ids(8)
    runs = {"kimi-k25": extract_one(harness, "kimi-k25", where["kimi"])}
    last = runs["kimi-k25"]
    # The preflight refuses a run verify-signatures finds drift for (mla-refused is expected): what the user
    # meets first. Then the same run past it: whether vLLM's start-up refuses it as the analyzer says.
    if last.get("failed_checks") == ["verify-signatures"]:
        last = runs["kimi-k25-skip-preflight"] = extract_one(harness, "kimi-k25-skip-preflight", where["kimi"],
                                                             skip_preflight=True)
    # The text model alone is MLA too: after the connector's refusal it would only repeat it.
    if last.get("state") != "succeeded" and not last.get("mla_refused"):
        harness.wait_port_free()
        runs["kimi-k2-text"] = extract_one(harness, "kimi-k2-text", where["text"],
                                           skip_preflight=last.get("skip_preflight", False))
    harness.record("kimi_extract", {
        "layer_choice": {"published_depth": PUBLISHED_LAYERS, "published_ids": default_layer_ids(PUBLISHED_LAYERS),
                         "shrunk_depth": 8, "shrunk_ids": mapped,
                         "rule": "speculators' default [2, L // 2, L - 3, L] (launch_vllm.py), applied to each depth"},
        "runs": runs})


#: Chats read by vLLM's forward with extraction off (vllm_forward.py): the states check's second subject.
N_FORWARD = int(os.environ.get("N_KIMI_FORWARD", "16"))


def step_forward(harness):
    """vLLM's own residual stream with extraction off (vllm_forward.py): the class, else the text model alone,
    else its bf16 copy (MLA and the routing without the INT4 kernels); the files kept for kimi:states."""
    where = paths(harness)
    ids = default_layer_ids(8)
    found = {}
    for name in ("kimi", "text", "reference"):
        out = os.path.join(harness.SG, "states-input", "kimi-forward-" + name)
        shutil.rmtree(out, ignore_errors=True)
        harness.wait_idle()
        rc, stdout, err, seconds = harness.run([sys.executable, os.path.join(HERE, "vllm_forward.py"), where[name],
                                                where["data"], str(N_FORWARD), out, ",".join(map(str, ids))],
                                               timeout=400)
        harness.log("vllm_forward %s rc %d in %.0f s: %s %s" % (name, rc, seconds, stdout[-300:],
                                                                 err[-1500:] if rc else ""))
        with open(os.path.join(harness.EXTRAS, "vllm_forward-%s.log" % name), "w") as log:
            log.write(err)  # vLLM's own start-up lines: model loading, KV cache size, what it refused
        found[name] = {"exit": rc, "seconds": seconds, "layer_ids": ids, "kept": out if rc == 0 else None,
                       "result": json.loads(stdout.strip().splitlines()[-1]) if rc == 0 else err[-3000:]}
        if rc == 0:
            break
    harness.record("kimi_forward", found)


def step_states(harness):
    """Every kept set of states (the extraction's, vLLM's forward with extraction off) not yet checked in this
    call against transformers' forward of the dequantized bf16 copy: gpu_tools.py reference, its tolerance and
    shifted control."""
    subjects = {}
    for name, entry in ((harness.results.get("kimi_extract") or {}).get("runs") or {}).items():
        if entry.get("kept"):
            subjects["extraction " + name] = entry
    for name, entry in (harness.results.get("kimi_forward") or {}).items():
        if entry.get("kept"):
            subjects["vllm forward, extraction off, " + name] = entry
    checked = {label: found for label, found in (harness.results.get("kimi_states") or {}).items()
               if isinstance(found, dict)}  # an earlier kimi:states of this call: its sets are not checked again
    subjects = {label: entry for label, entry in subjects.items() if label not in checked}
    if not subjects:
        if not checked:
            harness.record("kimi_states", {"error": "neither kimi:extract nor kimi:forward kept files in this call"})
        return
    for label, entry in subjects.items():
        harness.wait_idle()
        target = os.path.join(harness.SG, "reference-kimi-%d.json" % len(checked))
        rc, out, err, seconds = harness.run([sys.executable, os.path.join(HERE, "gpu_tools.py"), "reference",
                                             entry["kept"], paths(harness)["reference"],
                                             ",".join(map(str, entry["layer_ids"])), target], timeout=300)
        harness.log("kimi reference of %s rc %d in %.0f s: %s %s" % (label, rc, seconds, out[-300:],
                                                                     err[-2000:] if rc else ""))
        result = (harness.read_json(target) or {}) if rc == 0 else {"exit": rc, "error": err[-3000:]}
        result["reference_model"] = ("reference-bf16: the text model, experts dequantized to bf16 (value x scale, "
                                     "rounded once), in transformers")
        checked[label] = result
    harness.record("kimi_states", checked)


def step_smoke(harness):
    smoke = harness.inv("smoke", "--host", "local", "--model", paths(harness)["kimi"], "--json", timeout=560)
    harness.record("kimi_smoke", smoke)
    harness.log("kimi smoke: exit %d in %.0f s" % (smoke["exit"], smoke["seconds"]))


STEPS = {"build": step_build, "drift": step_drift, "extract": step_extract, "forward": step_forward,
         "states": step_states, "smoke": step_smoke}


def run(harness, phase):
    step = phase.split(":", 1)[1] if ":" in phase else ""
    if step not in STEPS:
        raise ValueError("phase %r: one of %s" % (phase, ", ".join("kimi:" + s for s in STEPS)))
    os.makedirs(harness.EXTRAS, exist_ok=True)  # each run's logs are kept there (keep_run_files)
    STEPS[step](harness)
