"""Patchsets as the host receives them (<bundle>/patchsets/<name>/patchset.json): load, validate, pick.

The format is documented in patchsets/README.md. Everything here reads files
and metadata only; nothing is imported from the packages being patched.
"""
import ast
import json
import os
import re

from base import pkgmeta, versions
from patching import edits

#: patchsets/ beside remote/ in the bundle (this file is remote/patching/patchset.py).
PATCHSETS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "patchsets")
#: The packages a patchset may target (pkgmeta knows which distributions provide them).
PACKAGES = tuple(pkgmeta.DISTRIBUTIONS)
PLATFORMS = ("cpu", "cuda")
PATCH_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")
FINDING_ID = re.compile(r"^[a-z][a-z0-9-]*:\S+$")
CONDITION_KEYS = ("speculators", "vllm", "platform", "parameter-absent", "parameter-present")


class InvalidPatchset(ValueError):
    """A patchset.json is malformed; the message names the file, the field and the bad value."""


class InvalidFacts(ValueError):
    """Facts given by the caller that are not {package: version or null}."""


def check_given(given):
    """Validate facts given by the caller: {package: PEP 440 version, or None for "not installed"}."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise InvalidFacts("facts must be a mapping of package to version, got %r" % (given,))
    for name, version in given.items():
        if name not in PACKAGES:
            raise InvalidFacts("facts: %r is not one of %s" % (name, ", ".join(PACKAGES)))
        if version is not None:
            if not isinstance(version, str):
                raise InvalidFacts("facts.%s: expected a version string or null, got %r" % (name, version))
            try:
                versions.Version(version)
            except versions.InvalidVersion as exc:
                raise InvalidFacts("facts.%s: %s" % (name, exc)) from None
    return dict(given)


class Facts:
    """What the environment holds: the two distributions and the platform, read from metadata.

    `given` ({package: version or None}) are facts about another environment of the host, which
    the caller read there (hosts.yaml `python`, when the engine runs in `server_python`'s): they
    replace what this environment holds of that package, for versions and conditions. A package
    given so has no files here (root None): a patch may not target it, nor a condition read its
    source (the engine refuses such a patchset: other-environment). A copy installed here
    anyway (the server's venv may hold an older speculators for another use) is only reported,
    as `installed_here`.
    """

    def __init__(self, given=None):
        self.given = check_given(given)
        self.distributions = {name: pkgmeta.installed(name) for name in PACKAGES}
        self.shadowed = {}
        for name, version in self.given.items():
            self.shadowed[name] = self.distributions[name]
            self.distributions[name] = None if version is None else {
                "name": name, "version": version, "root": None, "files": []}
        self.platform, self.platform_reason = _detect_platform(self.distributions["vllm"])
        self._trees = {}

    def is_given(self, package):
        return package in self.given

    def tree(self, path):
        """The parsed module at `path` (cached for the run), or None when it cannot be read or parsed."""
        if path not in self._trees:
            try:
                with open(path, "rb") as handle:
                    self._trees[path] = ast.parse(handle.read())
            except (OSError, SyntaxError, ValueError):
                self._trees[path] = None
        return self._trees[path]

    def version(self, package):
        found = self.distributions.get(package)
        return found["version"] if found else None

    def as_dict(self):
        packages = {}
        for name, d in self.distributions.items():
            packages[name] = {"name": d["name"], "version": d["version"], "root": d["root"]} if d else None
            if name in self.given:
                here = self.shadowed.get(name)
                packages[name] = dict(packages[name] or {"name": name, "version": None, "root": None},
                                      given=True, installed_here=here["version"] if here else None)
        return {"packages": packages, "platform": self.platform, "platform_reason": self.platform_reason,
                "given": self.given}


def _local_label(version):
    return version.partition("+")[2].lower()


def _detect_platform(vllm):
    if vllm and ("cpu" in vllm["name"].lower() or "cpu" in _local_label(vllm["version"])):
        return "cpu", "vLLM distribution %s %s is a CPU build" % (vllm["name"], vllm["version"])
    torch = pkgmeta.distribution("torch")
    if torch and _local_label(torch["version"]) == "cpu":
        return "cpu", "torch %s is a CPU build" % torch["version"]
    return "cuda", "no CPU build of vLLM or torch installed"


class Patch:
    def __init__(self, spec, *, where, folder):
        def bad(field, message):
            return InvalidPatchset("%s.%s: %s" % (where, field, message))

        if not isinstance(spec, dict):
            raise InvalidPatchset("%s: expected a mapping with id, target, fixes, description, edit; got %r"
                                  % (where, spec))
        unknown = sorted(set(spec) - {"id", "target", "fixes", "description", "when", "edit"})
        if unknown:
            raise bad(unknown[0], "unknown field (allowed: id, target, fixes, description, when, edit)")
        self.id = spec.get("id")
        if not isinstance(self.id, str) or not PATCH_ID.match(self.id):
            raise bad("id", "%r is not a patch id (lowercase letters, digits and '-')" % (self.id,))
        target = spec.get("target")
        if not isinstance(target, dict) or set(target) != {"package", "path"}:
            raise bad("target", "expected {package: NAME, path: PATH-IN-SITE-PACKAGES}, got %r" % (target,))
        if target["package"] not in PACKAGES:
            raise bad("target.package", "%r is not one of %s" % (target["package"], ", ".join(PACKAGES)))
        path = target["path"]
        if not isinstance(path, str) or os.path.isabs(path) or ".." in path.split("/") or not path.endswith(".py"):
            raise bad("target.path", "%r must be a relative path to a .py file inside the package" % (path,))
        self.package, self.path = target["package"], path
        fixes = spec.get("fixes")
        # Empty only for what no static finding names (a failure that only running shows).
        if not isinstance(fixes, list) or not all(isinstance(f, str) and FINDING_ID.match(f) for f in fixes):
            raise bad("fixes", "expected a list of finding ids (docs/findings.md), got %r" % (fixes,))
        self.fixes = fixes
        self.description = spec.get("description")
        if not isinstance(self.description, str) or not self.description.strip():
            raise bad("description", "expected a one-line description, got %r" % (self.description,))
        self.when = spec.get("when") or {}
        try:
            check_conditions(self.when)
        except InvalidPatchset as exc:
            raise bad("when", str(exc)) from None
        try:
            self.edit = edits.build(spec.get("edit"), folder)
        except edits.InvalidEdit as exc:
            raise bad("edit", str(exc)) from None

    def key(self):
        return "%s:%s" % (self.package, self.path)

    def as_dict(self):
        return {"id": self.id, "package": self.package, "path": self.path, "fixes": self.fixes,
                "description": self.description, "edit": self.edit.describe(), "when": self.when}


class Patchset:
    def __init__(self, data, *, folder):
        self.folder = folder
        where = os.path.join(os.path.basename(folder), "patchset")
        if not isinstance(data, dict):
            raise InvalidPatchset("%s: expected a mapping, got %r" % (where, data))
        unknown = sorted(set(data) - {"name", "description", "applies-to", "patches"})
        if unknown:
            raise InvalidPatchset("%s: unknown field %r (allowed: name, description, applies-to, patches)"
                                  % (where, unknown[0]))
        self.name = data.get("name")
        if self.name != os.path.basename(folder):
            raise InvalidPatchset("%s: name %r must equal the folder name %r"
                                  % (where, self.name, os.path.basename(folder)))
        self.description = data.get("description") or ""
        self.applies_to = data.get("applies-to")
        if not isinstance(self.applies_to, dict) or not {"speculators", "vllm"} <= set(self.applies_to):
            raise InvalidPatchset("%s: applies-to: expected speculators and vllm version ranges, got %r"
                                  % (where, self.applies_to))
        try:
            check_conditions(self.applies_to, allowed=("speculators", "vllm", "platform"))
        except InvalidPatchset as exc:
            raise InvalidPatchset("%s: applies-to: %s" % (where, exc)) from None
        patches = data.get("patches")
        if not isinstance(patches, list) or not patches:
            raise InvalidPatchset("%s: patches: expected a non-empty list, got %r" % (where, patches))
        self.patches = [Patch(spec, where="%s: patches[%d]" % (where, i), folder=folder)
                        for i, spec in enumerate(patches)]
        seen = set()
        for patch in self.patches:
            if patch.id in seen:
                raise InvalidPatchset("%s: patch id %r is used twice" % (where, patch.id))
            seen.add(patch.id)

    def patch(self, patch_id):
        return next((p for p in self.patches if p.id == patch_id), None)

    def patches_elsewhere(self, facts):
        """Whether every target of this patchset is a package given as a fact: its files are in another
        environment of the host."""
        return all(facts.is_given(patch.package) for patch in self.patches)

    def mismatches(self, facts):
        """Why this patchset does not apply to the environment (empty when it does)."""
        return unmet_conditions(self.applies_to, facts)

    def as_dict(self):
        return {"name": self.name, "description": self.description, "applies_to": self.applies_to}


def check_conditions(conditions, allowed=CONDITION_KEYS):
    if not isinstance(conditions, dict):
        raise InvalidPatchset("expected a mapping of conditions, got %r" % (conditions,))
    for key, value in conditions.items():
        if key not in allowed:
            raise InvalidPatchset("unknown condition %r (allowed: %s)" % (key, ", ".join(allowed)))
        if key in PACKAGES:
            try:
                versions.check_range(value)
            except versions.InvalidRange as exc:
                raise InvalidPatchset("%s: %s" % (key, exc)) from None
        elif key == "platform":
            values = value if isinstance(value, list) else [value]
            bad = [v for v in values if v not in PLATFORMS]
            if bad or not values:
                raise InvalidPatchset("platform: %r is not one of %s" % (bad[0] if bad else value,
                                                                        ", ".join(PLATFORMS)))
        else:
            if not isinstance(value, dict) or set(value) != {"package", "path", "function", "parameter"}:
                raise InvalidPatchset("%s: expected {package, path, function, parameter}, got %r" % (key, value))
            if value["package"] not in PACKAGES:
                raise InvalidPatchset("%s.package: %r is not one of %s"
                                      % (key, value["package"], ", ".join(PACKAGES)))


class ConditionUndecidable(Exception):
    """A source condition's function is gone: upstream changed more than the patch expects."""


def unmet_conditions(conditions, facts):
    """One sentence per condition the environment does not meet."""
    unmet = []
    for key, value in conditions.items():
        if key in PACKAGES:
            version = facts.version(key)
            if version is None:
                unmet.append("%s is not installed" % key)
            elif not versions.in_range(version, value):
                unmet.append("%s %s is not in %s" % (key, version, versions.describe_range(value)))
        elif key == "platform":
            wanted = value if isinstance(value, list) else [value]
            if facts.platform not in wanted:
                unmet.append("platform is %s (%s), not %s" % (facts.platform, facts.platform_reason,
                                                              " or ".join(wanted)))
        else:
            present = _has_parameter(value, facts)
            if present is None:
                raise ConditionUndecidable("%s: %s() not found in %s:%s" % (
                    key, value["function"], value["package"], value["path"]))
            if present != (key == "parameter-present"):
                unmet.append("%s() %s parameter %r" % (value["function"], "has" if present else "lacks",
                                                        value["parameter"]))
    return unmet


def _has_parameter(condition, facts):
    """Whether the function (or dataclass) takes the parameter; None when it cannot be found."""
    dist = facts.distributions.get(condition["package"])
    if not dist or not dist.get("root"):  # not installed, or a fact about another environment
        return None
    node = facts.tree(os.path.join(dist["root"], condition["path"]))
    if node is None:
        return None
    for part in condition["function"].split("."):
        node = next((child for child in getattr(node, "body", [])
                     if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and child.name == part), None)
        if node is None:
            return None
    if isinstance(node, ast.ClassDef):
        init = next((c for c in node.body if isinstance(c, ast.FunctionDef) and c.name == "__init__"), None)
        if init is None:
            # A dataclass: its annotated fields are the parameters of the synthesized __init__.
            return any(isinstance(c, ast.AnnAssign) and isinstance(c.target, ast.Name)
                       and c.target.id == condition["parameter"] for c in node.body)
        node = init
    arguments = node.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    return condition["parameter"] in names


class NotABundle(Exception):
    """The engine was started from the source tree, whose patchsets are YAML the host cannot read."""


def load_all(directory=PATCHSETS_DIR):
    """Every patchset of the bundle, validated, by name."""
    found = {}
    if not os.path.isdir(directory):
        return found
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name, "patchset.json")
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except ValueError as exc:
            raise InvalidPatchset("%s/patchset: not valid JSON: %s" % (name, exc)) from None
        found[name] = Patchset(data, folder=os.path.join(directory, name))
    if not found and any(os.path.isfile(os.path.join(directory, name, "patchset.yaml"))
                         for name in os.listdir(directory)):
        # A source tree, not a bundle: only specrig/transport/bundle.py turns the YAML into the JSON read here.
        raise NotABundle("%s holds patchset.yaml files but no patchset.json: the engine runs from a bundle "
                         "(specrig/transport/bundle.py converts them), not from the source tree" % directory)
    return found


class NoPatchset(Exception):
    """No (or more than one) patchset fits; the message says which ones were considered and why not."""


def pick(patchsets, facts, name=None):
    """The patchset named `name`, or the one whose applies-to matches; NoPatchset explains otherwise."""
    installed = ", ".join("%s %s%s" % (package, facts.version(package) or "(not installed)",
                                       " (given: another environment)" if facts.is_given(package) else "")
                          for package in PACKAGES) + ", platform %s" % facts.platform
    if name is not None:
        if name not in patchsets:
            raise NoPatchset("no patchset named %r (known: %s)" % (name, ", ".join(sorted(patchsets)) or "none"))
        reasons = patchsets[name].mismatches(facts)
        if reasons:
            raise NoPatchset("patchset %r does not apply to %s: %s" % (name, installed, "; ".join(reasons)))
        return patchsets[name]
    matching = [p for p in patchsets.values() if not p.mismatches(facts)]
    # A patchset all of whose targets are packages given as facts patches the environment those facts came
    # from, which the caller asks too (a host with two environments: the client's speculators, the server's
    # vLLM). It is picked here only when nothing else fits, and then refused by name (other-environment).
    matching = [p for p in matching if not p.patches_elsewhere(facts)] or matching
    if len(matching) == 1:
        return matching[0]
    if not matching:
        why = "; ".join("%s: %s" % (p.name, ", ".join(p.mismatches(facts))) for p in patchsets.values())
        raise NoPatchset("no patchset applies to %s (%s)" % (installed, why or "there are no patchsets"))
    raise NoPatchset("several patchsets apply to %s: %s; choose one with --patchset"
                     % (installed, ", ".join(p.name for p in matching)))
