"""What an arm of the GPU measurement is, in plain data (standard library only, no GPU): its spec, its name,
the state of speculators' client code it ran, the prompts it sent, the prepared-data cache key, the
prefix-caching setting of its server, its figures, the call presets and what each phase needs of a call's
budget, and the one wait for a server's /health (the harness's and gpu_tools.py bare-client's).

arm_phase.py and arm_runs.py run the arms; summarize.py and the tests read what this module names. Issue 26
(point 5): every arm stands alone and names what it varies, so that two arms with different client code or
settings never share a name.

    arm:WAY[:C[:KEY=VALUE,...]]     WAY: specrig, hand or bare; C: requests in flight (empty or "default":
                                    specrig's own default, none passed); KEY=VALUE: more of inv extract's
                                    options (specrig), and the arm options profile=1 and patch=1/patch=0
"""
import ast
import hashlib
import json
import os
import re
import struct
import time
import urllib.request

WAYS = ("specrig", "hand", "bare")
#: How each way runs (the results' "way": the earlier runs' words, kept).
WAY_WORDS = {"specrig": "specrig extract", "hand": "by hand (speculators' docs)",
             "bare": "bare prefill (no extraction, max_tokens=1)"}
#: Arm options that are not inv extract's: the profile window and the client patch.
ARM_OPTIONS = ("profile", "patch")
#: The harness's own place options (not inv extract's): `out` puts the arm's --out under a directory.
HARNESS_SETTINGS = ("out",)
#: Concurrency of a by-hand or bare arm given none: generate-offline-data's own default.
CLIENT_DEFAULT_CONCURRENCY = 32
#: The patch of issue 26 (patchset speculators-0.8-0.9-client): its file and function.
CLIENT_FILE = os.path.join("speculators", "data_generation", "vllm_client.py")
CLIENT_FUNCTION = "generate_hidden_states_async"
CLIENT_PATCH_ID = "client-token-ids-in-extra-body"


class SpecError(ValueError):
    """An arm spec the harness cannot run; the message says why."""


def parse_spec(spec):
    """arm:WAY[:C[:K=V,...]] -> {way, concurrency (int or None: the way's default), settings, profile, patch}."""
    parts = spec.split(":", 3)
    if parts[0] != "arm" or len(parts) < 2 or parts[1] not in WAYS:
        raise SpecError("%r: expected arm:WAY[:C[:KEY=VALUE,...]] with WAY one of %s" % (spec, ", ".join(WAYS)))
    way = parts[1]
    given = parts[2] if len(parts) > 2 else ""
    if given in ("", "default"):
        concurrency = None
    elif given.isdigit() and int(given) > 0:
        concurrency = int(given)
    else:
        raise SpecError("%r: concurrency %r is not a whole number above 0 (or empty, or 'default')" % (spec, given))
    settings = parse_options(spec, parts[3] if len(parts) > 3 else "")
    profile = settings.pop("profile", None)
    patch = settings.pop("patch", None)
    if patch not in (None, "0", "1"):
        raise SpecError("%r: patch=%s: 1 (inv apply-patches before the arm) or 0 (inv revert-patches)" % (spec, patch))
    if way == "hand" and patch == "1":
        raise SpecError("%r: a by-hand arm runs speculators as shipped: it reverts the patches itself" % spec)
    if way != "specrig" and settings:
        raise SpecError("%r: %s are inv extract's options: a %s arm takes none" % (spec, ", ".join(settings), way))
    return {"way": way, "concurrency": concurrency, "settings": settings,
            "profile": profile not in (None, "0"), "patch": patch}


def parse_options(spec, text):
    """KEY=VALUE,... of a phase's spec (an arm's, a fault's) as a dict, in order."""
    options = {}
    for item in text.split(",") if text else []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError("%r: %r is not KEY=VALUE" % (spec, item))
        options[key] = value
    return options


#: How a flag's value is written in a spec: 1/0 (true/false, yes/no, on/off alike).
FLAG_VALUES = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
               "off": False}


def task_flags(tasks_source, task):
    """{parameter: default} of the boolean parameters of `task` in specrig's tasks module (its source: the
    harness runs inv from the tree and imports none of it): invoke makes each one a flag that takes no value,
    --name where it is off by default, --no-name where it is on."""
    for node in ast.walk(ast.parse(tasks_source)):
        if isinstance(node, ast.FunctionDef) and node.name == task:
            named = node.args.args[len(node.args.args) - len(node.args.defaults):]
            return {arg.arg: default.value for arg, default in zip(named, node.args.defaults, strict=True)
                    if isinstance(default, ast.Constant) and isinstance(default.value, bool)}
    raise SpecError("no task %r in specrig's tasks" % task)


def inv_options(settings, flags):
    """inv's words for `settings` (KEY=VALUE, values as written in a spec): --key VALUE for an option that takes a
    value; a flag (`flags`: task_flags) takes no value (inv refuses --render-server 1): 1 is --key, whatever its
    default, so that the arm asks for what it names; 0 is --no-key where the flag is on by default, and nothing
    where it is off (invoke gives a flag that is off by default no --no- form)."""
    words = []
    for key, value in settings.items():
        option = "--" + key.replace("_", "-")
        if key not in flags:
            words += [option, str(value)]
            continue
        wanted = FLAG_VALUES.get(str(value).lower())
        if wanted is None:
            raise SpecError("%s=%s: %s is a flag of inv extract: give 1 or 0" % (key, value, key))
        if wanted:
            words.append(option)
        elif flags[key]:
            words.append("--no-" + key.replace("_", "-"))
    return words


def nondefault(settings, defaults):
    """The settings that differ from specrig's defaults (remote/base/contract.py SERVER_DEFAULTS), compared as
    text: writer_threads=8 is named where the default is 8, not where it is None (the connector's own)."""
    return {key: value for key, value in settings.items()
            if key in HARNESS_SETTINGS or key not in defaults or str(defaults[key]) != str(value)}


def label(way, concurrency, settings=None, client=None, shape=None, main_shape="llama8b", profiled=False):
    """The arm's name: its way, concurrency, every setting that differs from the defaults (sorted), the state
    of speculators' client code where the arm runs it (patched/unpatched), the model shape where it is not
    the main one, and -profiled. A name is a file name too (logs, profiles): a '/' in a value becomes '_'."""
    words = ["%s-c%s" % (way, concurrency if concurrency is not None else "default")]
    words += ["%s=%s" % (key, str(value).replace("/", "_")) for key, value in sorted((settings or {}).items())]
    if client:
        words.append(client)
    if shape and shape != main_shape:
        words.append(shape)
    if profiled:
        words.append("profiled")
    return "-".join(words)


def unique(name, taken):
    """`name`, or name-r2, -r3, ... where an arm of that name is already in the results: a repeat never
    overwrites the first."""
    if name not in taken:
        return name
    n = 2
    while "%s-r%d" % (name, n) in taken:
        n += 1
    return "%s-r%d" % (name, n)


# -- speculators' client code: patched or not -------------------------------------------------------

def _dotted(node):
    words = []
    while isinstance(node, ast.Attribute):
        words.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        words.append(node.id)
    return ".".join(reversed(words))


def client_patch_state(source):
    """Whether speculators' client sends the prompt's token ids in extra_body: `generate_hidden_states_async`'s
    completions.create call (not the chat one) passes prompt=[] with a "prompt" key in its extra_body dict
    (the patch client-token-ids-in-extra-body). {"state": "patched" | "unpatched" | "unknown", "detail"}."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return {"state": "unknown", "detail": "does not parse: %s" % exc}
    function = next((node for node in ast.walk(tree) if isinstance(node, (ast.AsyncFunctionDef, ast.FunctionDef))
                     and node.name == CLIENT_FUNCTION), None)
    if function is None:
        return {"state": "unknown", "detail": "no function %s" % CLIENT_FUNCTION}
    calls = [node for node in ast.walk(function) if isinstance(node, ast.Call)
             and _dotted(node.func).endswith("completions.create")
             and not _dotted(node.func).endswith("chat.completions.create")]
    if not calls:
        return {"state": "unknown", "detail": "%s makes no completions.create call" % CLIENT_FUNCTION}
    states = []
    for call in calls:
        keywords = {word.arg: word.value for word in call.keywords if word.arg}
        prompt, extra = keywords.get("prompt"), keywords.get("extra_body")
        empty = isinstance(prompt, ast.List) and not prompt.elts
        ids_in_extra = isinstance(extra, ast.Dict) and any(
            isinstance(key, ast.Constant) and key.value == "prompt" for key in extra.keys)
        if empty and ids_in_extra:
            states.append("patched")
        elif prompt is not None and not empty and not ids_in_extra:
            states.append("unpatched")
        else:
            states.append("unknown")
    state = states[0] if len(set(states)) == 1 else "unknown"
    detail = {"patched": "completions.create(prompt=[], extra_body={'prompt': ids, ...}) (line %d)",
              "unpatched": "completions.create(prompt=token_ids) through openai's transform (line %d)",
              "unknown": "completions.create neither as shipped nor as patched (line %d)"}[state] % calls[0].lineno
    return {"state": state, "detail": detail}


def client_patch_file_state(path):
    """client_patch_state() of the file at `path`, with the path and the file's sha256."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return {"state": "unknown", "detail": "cannot read: %s" % exc, "path": path, "sha256": None}
    found = client_patch_state(data.decode("utf-8", errors="replace"))
    found.update(path=path, sha256=hashlib.sha256(data).hexdigest())
    return found


# -- the prompts an arm sent --------------------------------------------------------------------------

SAFETENSORS_INTS = {"I64": "q", "I32": "i", "U32": "I", "I16": "h", "U16": "H", "U8": "B", "I8": "b"}


def token_ids(path):
    """The token_ids tensor of a hidden-states file, as a list of ints, read from its safetensors header and
    bytes (no torch)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        entry = header["token_ids"]
        start, end = entry["data_offsets"]
        f.seek(8 + n + start)
        data = f.read(end - start)
    code = SAFETENSORS_INTS[entry["dtype"]]
    return list(struct.unpack("<%d%s" % (len(data) // struct.calcsize(code), code), data))


def prompts_digest(prompts):
    """{samples, tokens, sha256} of a set of prompts (lists of token ids), independent of their order: the
    sha256 of the sorted per-prompt sha256s. Two arms with the same digest sent the same prompts."""
    digests, tokens = [], 0
    for ids in prompts:
        tokens += len(ids)
        digests.append(hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest())
    return {"samples": len(digests), "tokens": tokens,
            "sha256": hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()}


def spread(items, k):
    """k of `items` spread evenly over them, first and last included (all of them when k >= len): a states
    check on a subset sees early and late files, with and without the shared system prompt (even and odd
    indices alike)."""
    items = list(items)
    if k >= len(items):
        return items
    if k <= 1:
        return items[:k]
    return [items[round(j * (len(items) - 1) / (k - 1))] for j in range(k)]


# -- prepared prompts, shared between arms ------------------------------------------------------------

#: A model directory's files that decide how the server renders a conversation into tokens.
TOKENIZER_FILES = re.compile(r"^(tokenizer.*|special_tokens_map\.json|chat_template.*|added_tokens\.json|"
                             r"vocab\.json|merges\.txt|config\.json|generation_config\.json)$")


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepared_key_inputs(data, model, seq_length, max_samples, seed=None, versions=None):
    """What prepare-data's output depends on: the dataset's bytes, the model's tokenizer and chat template
    files (the server renders with them), prepare-data's arguments, and the speculators and vLLM releases
    (prepare-data's code, the render endpoint's)."""
    tokenizer = {name: file_sha256(os.path.join(model, name)) for name in sorted(os.listdir(model))
                 if TOKENIZER_FILES.match(name) and os.path.isfile(os.path.join(model, name))}
    return {"data_sha256": file_sha256(data), "tokenizer_sha256": tokenizer, "seq_length": seq_length,
            "max_samples": max_samples, "seed": seed, "versions": versions or {}}


def prepared_key(inputs):
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]


# -- prefix caching: the bare arm's server as the extraction server -----------------------------------

PREFIX_FLAGS = {"--enable-prefix-caching": "on", "--no-enable-prefix-caching": "off"}


def prefix_caching_flag(argv):
    """The prefix-caching flag a server command passes (the last one wins, as argparse takes it), or None:
    vLLM's own default."""
    found = None
    for word in argv or []:
        flag = word.split("=", 1)[0].replace("_", "-")
        if flag in PREFIX_FLAGS:
            found = flag
    return found


def prefix_caching_in_log(text):
    """What the server ran with, from vLLM's engine config line (`enable_prefix_caching=True`), or None."""
    found = re.findall(r"enable_prefix_caching=(True|False)", text or "")
    return {"True": True, "False": False}[found[-1]] if found else None


# -- an arm's figures, from its times ------------------------------------------------------------------

def figures(arm):
    """The figures summarize.py reports, from an arm's times (seconds from the arm's start): tokens/s over
    its wall, after the load (to its end, the server's stop included: runs 1-4's figure), from the server's
    health to the last file (issue 26's "after the load"), and the health to the first file."""
    for key, value in (("tokens_per_s", "tokens"), ("samples_per_s", "samples")):
        if arm.get(value) and arm.get("wall_s"):
            arm[key] = round(arm[value] / arm["wall_s"], 2)
    if arm.get("generate_s") and arm.get("tokens"):
        arm["tokens_per_s_generate"] = round(arm["tokens"] / arm["generate_s"], 1)
    ready = arm.get("server_ready_s")
    if ready and arm.get("wall_s") and arm.get("tokens"):
        after = arm["wall_s"] - ready
        arm["after_load_s"] = round(after, 2)
        arm["tokens_per_s_after_load"] = round(arm["tokens"] / after, 1)
    if ready and arm.get("first_sample_s"):
        arm["health_to_first_file_s"] = round(arm["first_sample_s"] - ready, 2)
    if ready and arm.get("last_sample_s") and arm.get("tokens"):
        arm["health_to_last_file_s"] = round(arm["last_sample_s"] - ready, 2)
        arm["tokens_per_s_to_last_file"] = round(arm["tokens"] / arm["health_to_last_file_s"], 1)
    return arm


# -- the calls: presets, and what a phase needs of the budget -----------------------------------------

#: One device call's phases, by name (device_run.py PRESET ...). issue26: issue 26's measurement, every arm
#: that belongs together in one call within 600 s, after a staging call that ran `prep warm` (the first
#: server start's cold caches out of this call). specrig first, with its defaults after inv apply-patches and
#: profiled: the arm the issue is about, so that a budget running short skips another; its plan then gives
#: the bare arm the extraction server's prefix caching, and its prepare-data output (the same command) fills
#: the prepared-data cache the bare arm reads. The states of a subset of its files next, while they are on the
#: disk; bare prefill at c128 (the ceiling; run 4: c32 and c128 alike in the steady part); by hand last (it
#: reverts the patches: speculators as shipped).
PRESETS = {
    "issue26": {"env": {"N_MEASURE": "512"},
                "phases": ["prep", "clean", "arm:specrig:default:patch=1,profile=1", "states:specrig",
                           "arm:bare:128", "arm:hand:32"]},
    # Issue 29 in one call (kimi_phase.py): the shrunk Kimi-K2.5 built, analyzed and patched; vLLM's forward and
    # its states check first (the extraction is expected to be refused for MLA, and a refused server may be
    # started twice); then the extraction, the states of whatever it kept, the smoke where the budget allows.
    "issue29": {"env": {}, "phases": ["kimi:build", "kimi:drift", "kimi:forward", "kimi:states", "kimi:extract",
                                      "kimi:states", "kimi:smoke"]},
    # Issue 35 (point 5) in one call (fault_phase.py), after a staging call that ran `prep warm:bare`. The cells
    # only a GPU shows first: one run of 256 samples, the EngineCore SIGSTOPped at 64 (a hang), then, once the
    # run went on, the API server killed at 160; eager (--enforce-eager), since that run starts its server three
    # times; FAULT_WATCH_S 90: a hang not called within 90 s of files every few ms is a miss either way. Its
    # states after the recovery while its files are on the disk. Then the render server on a first run (no
    # prepared-data cache) against bare prefill at 512 samples (issue 35 point 4: 0.80 of bare's tokens/s from
    # /health to the last file); a phase the budget cannot hold is skipped and said, for a second call.
    "issue35": {"env": {"N_MEASURE": "512", "N_FAULT": "256", "FAULT_WATCH_S": "90"},
                "phases": ["prep", "clean", "fault:stop-engine-core@64+kill-api-server@160:enforce_eager=1,patch=1",
                           "states:fault", "arm:specrig:default:render_server=1,prepared_cache=0", "arm:bare:128"]},
}
#: The least a phase takes, in seconds (the runs so far, docs/gpu.md: the quickest arm of each way at 512 8B
#: samples, with a warm compile cache; states: the reference's imports, two loads of the 8B model, bf16 and
#: fp32, about 20 s, and 64 files): a phase is not begun with less than this left of the call's budget,
#: since one cut short brings back nothing and costs what it ran.
PHASE_MIN_S = {"arm:bare": 95, "arm:hand": 120, "arm:specrig": 130, "states": 45, "extract": 300, "stop": 120,
               "smoke": 190, "train": 240,
               # issue 35's fault cell of two faults: three eager server starts (estimate: runs 5-6's starts
               # with compile took 60-97 s) and the back-offs, the watches at their quickest
               "fault": 200,
               # issue 29's (estimates before its first run: the build on the CPU took 24 s; a smoke 190 s)
               "kimi:build": 20, "kimi:drift": 30, "kimi:extract": 150, "kimi:forward": 90, "kimi:states": 40,
               "kimi:smoke": 190,
               # issue 36 (train_accept_phase.py): trainrun picks up where an earlier call stopped (a poll or
               # two when done); accept starts vLLM twice, the 8B target with each draft (60-120 s each)
               "trainrun": 30, "accept": 200}


def expand(phases, env):
    """Phases with the presets expanded, and the environment the presets set where `env` does not."""
    out, settings = [], {}
    for phase in phases:
        preset = PRESETS.get(phase)
        if preset is None:
            out.append(phase)
            continue
        out += preset["phases"]
        settings.update({key: value for key, value in preset["env"].items() if key not in env})
    return out, settings


def phase_min_s(phase):
    """PHASE_MIN_S of a phase (arm:WAY..., kimi:STEP, states:..., fault:..., or a plain name); 0 for one not
    listed."""
    head = phase.split(":")
    key = ":".join(head[:2]) if head[0] in ("arm", "kimi") else head[0]
    return PHASE_MIN_S.get(key, 0)


def wait_for_health(port, timeout=900, given_up=None):
    """Until the server on `port` answers /health with 200 (polled every 0.1 s): True; False at `timeout`,
    or as soon as `given_up()` holds (the server's process ended, the watch was stopped)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if given_up is not None and given_up():
            return False
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as answer:
                if answer.status == 200:
                    return True
        except Exception:  # not up yet
            pass
        time.sleep(0.1)
    return False
