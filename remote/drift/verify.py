"""verify: find where the installed consumer (speculators) drifted from the installed provider (vLLM).

args, for an installed environment (located from package metadata, nothing imported):
    {"consumers": ["speculators"], "provider": "vllm", "model": "/path/to/model-dir" (optional)}
or, for unpacked wheels (check-compat):
    {"consumer_roots": [{"root": dir, "package": "speculators", "version": "0.3.0"}],
     "provider_root": {"root": dir, "package": "vllm", "version": "0.16.0"},
     "model_config": "/path/to/config.json" (optional)}
A root may also be given as a plain directory string; its package is then the
directory's only top-level package. Returns drift.analyzer.analyze()'s report
(docs/findings.md).
"""
import gc
import json
import os

from drift.analyzer import analyze
from rpc import RemoteFailure


def run(args):
    if "provider_root" in args:
        consumers = [_unpacked(entry) for entry in args.get("consumer_roots") or []]
        provider = _unpacked(args["provider_root"])
    else:
        consumers = [_installed(name) for name in args.get("consumers") or ["speculators"]]
        provider = _installed(args.get("provider") or "vllm")
    if not consumers:
        raise RemoteFailure("bad-argument", "no consumer package given")
    model = None
    if args.get("model"):
        model = _model_directory(os.path.expanduser(args["model"]))
    elif args.get("model_config"):
        model = _model_config(os.path.expanduser(args["model_config"]))
    # The analysis allocates hundreds of thousands of AST nodes and frees none of them until it ends;
    # the cyclic collector would scan them over and over (a third of the run) to find no garbage.
    gc.disable()
    try:
        return analyze(consumers=consumers, provider=provider, model=model)
    finally:
        gc.enable()


def _installed(name):
    import pkgmeta  # importlib.metadata is slow to import: only installed environments need it

    found = pkgmeta.installed(name)
    if found is None:
        raise RemoteFailure("not-installed", "%s is not installed in this environment" % name, package=name)
    package = _top_level(found, name)
    return {"name": found["name"], "version": found["version"], "root": found["root"], "package": package}


def _top_level(found, name):
    """The import name of a distribution: its name when that directory exists, else from RECORD."""
    candidate = name.replace("-", "_").lower()
    if os.path.isfile(os.path.join(found["root"], candidate, "__init__.py")):
        return candidate
    tops = sorted({f.split("/")[0] for f in found["files"]
                   if f.endswith("/__init__.py") and ".dist-info" not in f.split("/")[0]})
    if not tops:
        raise RemoteFailure("not-installed", "%s %s has no importable package" % (name, found["version"]))
    return tops[0]


def _unpacked(entry):
    if isinstance(entry, str):
        entry = {"root": entry}
    root = entry.get("root")
    if not root or not os.path.isdir(root):
        raise RemoteFailure("bad-argument", "package root %r is not a directory" % (root,))
    package = entry.get("package")
    if not package:
        tops = [d for d in sorted(os.listdir(root)) if os.path.isfile(os.path.join(root, d, "__init__.py"))]
        if len(tops) != 1:
            raise RemoteFailure("bad-argument", "cannot tell the package under %r (found %r); name it" % (root, tops))
        package = tops[0]
    return dict(entry, root=os.path.abspath(root), package=package)


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except ValueError as exc:
        raise RemoteFailure("bad-argument", "%s is not valid JSON: %s" % (path, exc))


def _model_directory(path):
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise RemoteFailure("bad-argument", "model directory %r has no config.json" % (path,))
    return _model_config(config, directory=path)


def _model_config(config, directory=None):
    if not os.path.isfile(config):
        raise RemoteFailure("bad-argument", "model config %r does not exist" % (config,))
    tokenizer = os.path.join(os.path.dirname(config), "tokenizer_config.json")
    return {"path": directory or config, "config": _read_json(config),
            "tokenizer_config": _read_json(tokenizer) if os.path.isfile(tokenizer) else None}
