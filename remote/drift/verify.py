"""verify: find where the installed consumer (speculators) drifted from the installed provider (vLLM).

args, for an installed environment (located from package metadata, nothing imported):
    {"consumers": ["speculators"], "provider": "vllm", "model": "/path/to/model-dir" (optional; or a
     Hugging Face repo id, read from its snapshot in this host's cache: remote/base/hfcache.py),
     "storage": the storage type of the server-mode run checked for (optional: contract.STORAGES)}
or, for unpacked wheels (check-compat):
    {"consumer_roots": [{"root": dir, "package": "speculators", "version": "0.3.0"}],
     "provider_root": {"root": dir, "package": "vllm", "version": "0.16.0"},
     "model_config": "/path/to/config.json" (optional)}
A root may also be given as a plain directory string; its package is then the
directory's only top-level package. "provider_root" may also come with installed
"consumers" (speculators in one environment, vLLM unpacked or in another), and
"server_python" (hosts.yaml's interpreter of the vLLM server's environment) names where
the installed provider is read when it is another environment than this one's.

The speculators release picks the analysis (contract.extraction_mode): <= 0.4 the
in-process consumer analysis (drift.analyzer.analyze(); specrig's extraction driver is read
with speculators); 0.5-0.7 one finding saying those releases ship their data generation only
as repository scripts; >= 0.8 the server contract (drift.server.points.analyze_server();
hs-connectors, when installed or given as a consumer root, is read too, and specrig's
vllm_serve.py as a consumer). Returns the report (docs/findings.md).
"""
import json
import os

from base.contract import (
    CACHE_BYPASSED,
    CACHE_HIT,
    CACHE_MISS,
    HS_CONNECTORS,
    IN_PROCESS,
    REPOSITORY_SCRIPTS,
    SERVER,
    extraction_mode,
)
from base.failure import RemoteFailure


def run(args):
    """The report, from the workdir's cache (drift/answers.py) when nothing it depends on changed;
    args "workdir" (where the cache is; without it, none) and "no_cache" (true: analyse anyway, and
    keep nothing). The report's "cache" says which: {"state": hit|miss|bypassed, "why"}."""
    import gc

    # The analysis allocates hundreds of thousands of AST nodes and frees none of them until it ends;
    # the cyclic collector would scan them over and over (a third of the run) to find no garbage, and
    # after it, collect what this process's os._exit (rpc.py) frees at once anyway (10-15 ms). A call
    # is a process of its own: the collector stays off until the process ends.
    gc.disable()
    workdir = args.get("workdir")
    if not workdir or args.get("no_cache"):
        # Without importing answers (json's encoder, zlib, atomic) for a call that keeps none.
        return dict(analysis(args), cache={"state": CACHE_BYPASSED, "why": None})
    from drift import answers

    identity = answers.identity(args)
    report, why = answers.lookup(workdir, identity)
    if report is not None:
        return dict(report, cache={"state": CACHE_HIT, "why": None})
    from drift.reads import Recorder

    with Recorder() as recorder:
        report = analysis(args)
    recorded = recorder.recorded()
    if recorded is not None:
        answers.store(workdir, identity, recorded, report)
    return dict(report, cache={"state": CACHE_MISS, "why": why})


def analysis(args):
    """The report of the analysis itself (docs/findings.md)."""
    from drift.parts import PartUnreadable
    from drift.source import SourceTree

    try:
        return _analysis(args)
    except PartUnreadable:
        SourceTree.parts_enabled = False
        return _analysis(args)


def _analysis(args):
    installed = "consumer_roots" not in args
    if installed:
        consumers = [_installed(name) for name in args.get("consumers") or ["speculators"]]
    else:
        consumers = [_unpacked(entry) for entry in args.get("consumer_roots") or []]
    if "provider_root" in args:
        provider = _unpacked(args["provider_root"])
    elif args.get("server_python"):
        provider = _installed_elsewhere(args.get("provider") or "vllm", args["server_python"])
    else:
        try:
            provider = _installed(args.get("provider") or "vllm")
        except RemoteFailure as failure:
            if _mode(consumers) != SERVER:
                raise
            raise RemoteFailure(failure.kind, "%s; speculators %s talks to a vLLM server, whose environment "
                                "(server_python in hosts.yaml) the call did not name"
                                % (failure.message, _speculators(consumers)["version"]), **failure.details) from None
    if not consumers:
        raise RemoteFailure("bad-argument", "no consumer package given")
    model = None
    if args.get("model"):
        from base import hfcache

        model = _model_directory(hfcache.resolve(args["model"], os.environ))
    elif args.get("model_config"):
        model = _model_config(os.path.expanduser(args["model_config"]))
    mode = _mode(consumers)
    if mode == REPOSITORY_SCRIPTS:
        return _repository_scripts(consumers, provider, model)
    if mode == SERVER:
        from drift.server.points import analyze_server

        for optional in (HS_CONNECTORS, "openai"):  # without them, the file-backend and client-speed checks skip
            if installed and not any(c["package"] == optional.replace("-", "_") for c in consumers):
                try:
                    consumers.append(_installed(optional))
                except RemoteFailure:
                    pass
        return analyze_server(consumers, provider, model, storage=args.get("storage"))
    from drift.analyzer import analyze, own_programs

    return analyze(consumers=consumers + [own_programs(IN_PROCESS)], provider=provider, model=model)


def _speculators(consumers):
    return next((c for c in consumers if c["package"] == "speculators"), None)


def _mode(consumers):
    """The extraction mode of the speculators consumer (in-process when there is none or no version)."""
    speculators = _speculators(consumers)
    if speculators is None:
        return IN_PROCESS
    return extraction_mode(speculators.get("version")) or IN_PROCESS


def _repository_scripts(consumers, provider, model):
    """speculators 0.5-0.7: nothing to check, one finding that says so (docs/findings.md)."""
    import re
    import time

    from drift import findings as F
    from drift.source import SourceTree

    started = time.perf_counter()
    speculators = _speculators(consumers)
    tree = SourceTree(speculators["root"], [speculators["package"]])
    module, line = None, 1
    for name in (speculators["package"] + ".version", speculators["package"]):
        module = tree.module(name)
        if module is None:
            continue
        line = next((n for n, text in enumerate(module.source.split("\n"), 1)
                     if re.match(r"\s*(__version__|version)\s*=", text)), None)
        if line is not None:
            break
    if module is None:
        module = tree.module(speculators["package"])
    found = [] if module is None else [F.UnsupportedRelease(consumer=F.Location(module, line or 1),
                                                            callee="speculators", detail=speculators.get("version"))]
    return F.report(found, started=started, mode=REPOSITORY_SCRIPTS, consumers=consumers, provider=provider,
                    model=model, unchecked=[], calls_checked=0, checked=[], modules_parsed=0)


def _installed(name):
    from base import pkgmeta  # importlib.metadata is slow to import: only installed environments need it

    found = pkgmeta.installed(name)
    if found is None:
        raise RemoteFailure("not-installed", "%s is not installed in this environment" % name, package=name)
    package = _top_level(found, name)
    return {"name": found["name"], "version": found["version"], "root": found["root"], "package": package}


LOCATE_TIMEOUT_S = 60


def _installed_elsewhere(name, python):
    """`name` as installed in the environment of interpreter `python` (hosts.yaml server_python); this
    environment's own when `python` is this interpreter."""
    from base import pkgmeta

    try:
        environment = pkgmeta.other_environment(python, [name], LOCATE_TIMEOUT_S)
    except pkgmeta.EnvironmentUnreadable as exc:
        raise RemoteFailure("not-installed", "server_python %s" % exc, package=name) from None
    if environment is None:
        return _installed(name)
    for directory in environment.get("path") or ():
        if os.path.isdir(directory):
            # Read in another process, that environment's metadata is not among this call's reads; its
            # listings are, so that the cache (drift/answers.py) sees a package installed there.
            os.listdir(directory)
    located = environment["installed"][name]
    if not located:
        raise RemoteFailure("not-installed", "%s is not installed in the server environment (%s)" % (name, python),
                            package=name)
    package = _top_level(located, name)
    return {"name": located["name"], "version": located["version"], "root": located["root"], "package": package}


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
        raise RemoteFailure("bad-argument", "%s is not valid JSON: %s" % (path, exc)) from None


def _model_directory(found):
    """The model of an hfcache.Model: a directory given, or the snapshot a repo id names in the hub cache."""
    from base import hfcache

    config = os.path.join(found.path, "config.json")
    if not os.path.isfile(config):
        raise RemoteFailure("bad-argument", "model %s has no config.json" % hfcache.describe(found))
    return dict(_model_config(config, directory=found.path), repo_id=found.repo_id,
                resolved=hfcache.describe(found))


def _model_config(config, directory=None):
    if not os.path.isfile(config):
        raise RemoteFailure("bad-argument", "model config %r does not exist" % (config,))
    tokenizer = os.path.join(os.path.dirname(config), "tokenizer_config.json")
    return {"path": directory or config, "config": _read_json(config),
            "tokenizer_config": _read_json(tokenizer) if os.path.isfile(tokenizer) else None}
