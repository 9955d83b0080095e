"""A model named by a Hugging Face repo id, found in this host's hub cache as huggingface_hub finds it.

vLLM, transformers and speculators take `--model moonshotai/Kimi-K2.5` as well as a directory: a
directory that exists wins (transformers checks `os.path.isdir` first); an id is looked up in the hub
cache, `<cache>/models--moonshotai--Kimi-K2.5/snapshots/<commit>/`, the commit read from `refs/main`
(or given as a 40-hex revision). This module does the same statically, standard library only, with
huggingface_hub's own rules (constants.py, file_download.py, _snapshot_download.py, utils/_validators.py;
huggingface_hub 0.36, 1.33 and 2.4 agree on all of it but ids with non-ASCII letters, refused since 1.x):

    cache   HF_HUB_CACHE, else the legacy HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub; HF_HOME defaults to
            $XDG_CACHE_HOME/huggingface, XDG_CACHE_HOME to ~/.cache; `~` and $VARS expanded in HF_HOME
            and HF_HUB_CACHE. TRANSFORMERS_CACHE does not count: only transformers < 5 reads it, for its
            own files, while vLLM loads the weights through huggingface_hub.
    offline HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE, is 1, ON, YES or TRUE (any case).

specrig never downloads: the driver and preflight get the snapshot directory itself, so a run reads
exactly the revision found here, online or not.

`env` is the environment the run sees (the login environment under hosts.yaml's `env:`, as rpc.py
applies it to os.environ); `~` is this user's home.
"""
import collections
import hashlib
import os
import re

from base.failure import RemoteFailure

DEFAULT_REVISION = "main"
#: huggingface_hub's REPO_ID_REGEX (1.x on; `\w` ASCII only): "name" or "namespace/name", each 1-96 of
#: [A-Za-z0-9_.-], starting and ending with a letter, digit or underscore.
REPO_ID = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b", re.ASCII)
COMMIT_HASH = re.compile(r"[0-9a-f]{40}")
TRUE_VALUES = ("1", "ON", "YES", "TRUE")
#: posixpath.expandvars' pattern, applied to `env` rather than os.environ.
ENV_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})", re.ASCII)
#: What decides the cache, first set first.
CACHE_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


#: A model directory on this host, and the Hugging Face repo id it was found by (None: a directory given).
Model = collections.namedtuple("Model", "path repo_id")


def is_repo_id(text):
    """Whether huggingface_hub's validate_repo_id accepts `text`."""
    return (text.count("/") <= 1 and REPO_ID.fullmatch(text) is not None and "--" not in text
            and ".." not in text and not text.endswith(".git"))


def is_offline(env):
    """huggingface_hub's offline mode (HF_HUB_OFFLINE, else TRANSFORMERS_OFFLINE) under `env`."""
    value = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE")
    return bool(value) and value.upper() in TRUE_VALUES


def _expand(path, env):
    """os.path.expandvars(os.path.expanduser(path)) with the variables of `env`."""

    def value(match):
        name = match.group(1)
        if name.startswith("{") and name.endswith("}"):
            name = name[1:-1]
        return env.get(name, match.group(0))

    return ENV_VARIABLE.sub(value, os.path.expanduser(path))


def hub_cache(env):
    """The hub cache directory huggingface_hub uses under `env`."""
    hf_home = _expand(env.get("HF_HOME", os.path.join(env.get("XDG_CACHE_HOME", os.path.join(
        os.path.expanduser("~"), ".cache")), "huggingface")), env)
    return _expand(env.get("HF_HUB_CACHE", env.get("HUGGINGFACE_HUB_CACHE", os.path.join(hf_home, "hub"))), env)


def repo_folder(repo_id):
    """models--org--name: huggingface_hub's repo_folder_name for a model."""
    return "--".join(["models"] + repo_id.split("/"))


def resolve(model, env, revision=None):
    """The Model that `model` names on this host: an existing directory, else the snapshot of repo id
    `model` at `revision` (a branch or tag in refs/, or a commit hash; default main) in the hub cache.

    Raises RemoteFailure "bad-argument" for a value that is neither, "model-not-found" for an id the
    cache lacks (the message says where it looked, which variables count, and the fix)."""
    directory = os.path.abspath(os.path.expanduser(model))
    if os.path.isdir(directory):
        return Model(directory, None)
    if not is_repo_id(model):
        raise RemoteFailure("bad-argument", "model %r is neither a directory on this host nor a Hugging Face "
                                            "repo id (org/name)" % (model,))
    revision = revision or DEFAULT_REVISION
    cache = hub_cache(env)
    folder = repo_folder(model)
    repo = os.path.join(cache, folder)
    commit = revision if COMMIT_HASH.fullmatch(revision) else _read_ref(repo, revision)
    if commit and os.path.isdir(os.path.join(repo, "snapshots", commit)):
        return Model(os.path.join(repo, "snapshots", commit), model)
    if not os.path.isdir(repo):
        missing = "no %s" % folder
    elif not commit:
        missing = "%s has no refs/%s" % (folder, revision)
    else:
        missing = "%s has no snapshot %r" % (folder, commit)  # %r: a ref's stray line end shows
    raise RemoteFailure("model-not-found", not_found_message(model, cache, missing, env),
                        repo_id=model, cache=cache, offline=is_offline(env))


def _read_ref(repo, revision):
    """The commit refs/<revision> holds, read as huggingface_hub reads it (not stripped), or None."""
    try:
        with open(os.path.join(repo, "refs", revision), encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def not_found_message(model, cache, missing, env):
    """One line: what is missing where, what set the cache, what offline means there, the fix."""
    set_by = ", ".join("%s=%s" % (name, env[name]) for name in CACHE_VARIABLES if name in env)
    legacy = ("; TRANSFORMERS_CACHE=%s does not count (vLLM reads weights through huggingface_hub)"
              % env["TRANSFORMERS_CACHE"] if env.get("TRANSFORMERS_CACHE") else "")
    offline = ("HF_HUB_OFFLINE is set: vLLM would not download it either" if is_offline(env) else
               "HF_HUB_OFFLINE is not set, but specrig runs only what the cache holds, it never downloads")
    return ("model %r is neither a directory on this host nor in its Hugging Face cache: %s in %s (%s; "
            "HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, hosts.yaml env: over the "
            "login environment%s); %s. Fix: `hf download %s` (or `huggingface-cli download %s`) on the host, or "
            "set HF_HOME in hosts.yaml env: to the cache that holds it"
            % (model, missing, cache, set_by or "the default", legacy, offline, model, model))


def describe(model):
    """'org/name → <cache>/models--org--name/snapshots/<commit> (refs/main)', or the directory given."""
    if not model.repo_id:
        return model.path
    refs = refs_naming(model.path)
    return "%s → %s%s" % (model.repo_id, model.path, " (%s)" % ", ".join(refs) if refs else "")


def refs_naming(snapshot):
    """The refs (refs/main, refs/pr/1) of a cached repo that hold the commit of `snapshot`."""
    repo, commit = os.path.dirname(os.path.dirname(snapshot)), os.path.basename(snapshot)
    root = os.path.join(repo, "refs")
    named = []
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            try:
                with open(path, encoding="utf-8") as handle:
                    held = handle.read()
            except OSError:
                continue
            if held == commit:
                named.append("refs/" + os.path.relpath(path, root))
    return sorted(named)


def fingerprint(model_dir):
    """What tells one model from another across hosts, whose paths differ: the snapshot's commit when
    `model_dir` is a hub cache snapshot, and the sha256 of its config.json (first 16 hex digits)."""
    parent = os.path.basename(os.path.dirname(model_dir.rstrip("/")))
    commit = os.path.basename(model_dir.rstrip("/"))
    try:
        with open(os.path.join(model_dir, "config.json"), "rb") as f:
            config = hashlib.sha256(f.read()).hexdigest()[:16]
    except OSError:
        config = None
    return {"snapshot": commit if parent == "snapshots" and COMMIT_HASH.fullmatch(commit) else None,
            "config_sha256": config}
