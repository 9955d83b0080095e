"""The patch engine: status, apply (or dry-run) and revert a patchset in this Python's environment.

    patch.status / patch.apply / patch.revert, each taking
    args: {"patchset": NAME | null,      # default: the one whose applies-to matches
           "dry_run": bool,              # apply: print diffs, change nothing
           "patch": ID | null,           # revert: only this patch
           "force": bool,                # revert: even if the file changed since we patched it
           "specrig_version": str,
           "facts": {PACKAGE: VERSION | null} | null}   # versions read in another environment

`facts` is for a host with two environments (hosts.yaml `python` and `server_python`): the
engine runs in the environment it patches (the server's, for vLLM patches) and takes the
speculators version from the caller, who read it in `python`'s. A given fact replaces what this
environment holds of that package (a copy installed here too is only reported); a patchset
that would touch a given package's files, or read its source in a condition, is refused
(other-environment): those files are not here.

Apply is all or nothing per run: every patch is planned on the current files
first, and one conflict anywhere stops the run before a byte is written.
Failures come back as RemoteFailure kinds: bad-argument, bad-patchset,
no-patchset, not-a-bundle, not-writable, conflict, locked, revert-refused,
not-applied, other-environment.
"""
import difflib
import os
import pwd
import sys

from base import atomic
from base.failure import RemoteFailure
from patching import patchlib
from patching import patchset as patchsets
from patching import store as patchstore
from patching.store import file_sha256, sha256


def status(args):
    """The `patch.status` command: each patch's state and what specrig recorded."""
    return _engine(args).status(args.get("patchset"))


def apply(args):
    """The `patch.apply` command: plan every patch, then write all or nothing (`dry_run`: nothing)."""
    return _engine(args).apply(args.get("patchset"), dry_run=args.get("dry_run", False))


def revert(args):
    """The `patch.revert` command: put back the original bytes (`patch`: of that patch only)."""
    return _engine(args).revert(args.get("patch"), force=args.get("force", False))


def _engine(args):
    for flag in ("dry_run", "force"):
        if not isinstance(args.get(flag, False), bool):
            raise RemoteFailure("bad-argument", "%s must be true or false, got %r" % (flag, args.get(flag)))
    try:
        given = patchsets.check_given(args.get("facts"))
    except patchsets.InvalidFacts as exc:
        raise RemoteFailure("bad-argument", str(exc)) from None
    return Engine(specrig_version=str(args.get("specrig_version") or "unknown"), facts=given)


class FilePlan:
    """One target file: its bytes now, the patches on it in order with their states, and the bytes after."""

    def __init__(self, key, package, path, file):
        self.key, self.package, self.path, self.file = key, package, path, file
        self.patches = []
        self.before = None
        self.after = None

    @property
    def changes(self):
        return self.before is not None and self.after != self.before


class Engine:
    def __init__(self, *, specrig_version, facts=None):
        self.specrig_version = specrig_version
        self.store = patchstore.Store()
        self.facts = patchsets.Facts(facts)

    # ---- what is there ----------------------------------------------------------------------

    def _load(self, name):
        try:
            found = patchsets.load_all()
            chosen = patchsets.pick(found, self.facts, name)
        except patchsets.InvalidPatchset as exc:
            raise RemoteFailure("bad-patchset", str(exc)) from None
        except patchsets.NoPatchset as exc:
            raise RemoteFailure("no-patchset", str(exc), facts=self.facts.as_dict()) from None
        except patchsets.NotABundle as exc:
            raise RemoteFailure("not-a-bundle", str(exc)) from None
        elsewhere = _in_other_environment(chosen, self.facts)
        if elsewhere:
            raise RemoteFailure("other-environment", "nothing was changed: patchset %s %s, but this environment "
                                "(%s) was given that package's version from another one: its files are not here"
                                % (chosen.name, "; ".join(elsewhere), sys.prefix),
                                packages=sorted(self.facts.given), facts=self.facts.as_dict())
        return chosen

    def _plan(self, chosen, manifest):
        plans = {}
        for patch in chosen.patches:
            dist = self.facts.distributions[patch.package]
            plan = plans.get(patch.key())
            if plan is None:
                plan = plans[patch.key()] = FilePlan(patch.key(), patch.package, patch.path,
                                                     os.path.join(dist["root"], patch.path))
                try:
                    with open(plan.file, "rb") as handle:
                        plan.before = plan.after = handle.read()
                except FileNotFoundError:
                    pass
            plan.patches.append(self._patch_state(patch, plan, manifest))
        return list(plans.values())

    def _patch_state(self, patch, plan, manifest):
        record = dict(patch.as_dict(), file=plan.file, state=None, reason="", by=None)
        if plan.before is None:
            record.update(state=patchlib.State.CONFLICT, reason="the file does not exist (moved upstream?)")
            return record
        try:
            unmet = patchsets.unmet_conditions(patch.when, self.facts)
        except patchsets.ConditionUndecidable as exc:
            record.update(state=patchlib.State.CONFLICT, reason="condition cannot be decided: %s" % exc)
            return record
        if unmet:
            record.update(state="not-applicable", reason="; ".join(unmet))
            return record
        try:
            source = patchlib.parse(plan.after.decode("utf-8"))
        except (UnicodeDecodeError, SyntaxError) as exc:
            record.update(state=patchlib.State.CONFLICT, reason="the file is not parseable Python: %s" % exc)
            return record
        state = patch.edit.state(source)
        record.update(state=state.name, reason=state.reason)
        entry = manifest["files"].get(plan.key)
        ours = entry is not None and any(p["id"] == patch.id for p in entry["patches"])
        intact = entry is not None and entry["patched_sha256"] == sha256(plan.before)
        if state.name == patchlib.State.APPLIED:
            if ours and intact:
                applied = next(p for p in entry["patches"] if p["id"] == patch.id)
                record.update(by="specrig", applied_at=applied["applied_at"],
                              specrig_version=applied["specrig_version"])
            else:
                record["by"] = "already fixed (not by specrig)"
        elif state.name == patchlib.State.PENDING:
            if ours and not intact:
                replaced = sha256(plan.before) == entry["original_sha256"]
                record.update(state="missing", reason=(
                    "the file was replaced by its original since specrig patched it (package reinstalled?)"
                    if replaced else "the file changed since specrig patched it (package upgraded or edited?)"))
            new_text = patch.edit.apply(source)
            problem = _check_edit(patch, new_text)
            if problem:
                record.update(state=patchlib.State.CONFLICT, reason=problem)
                return record
            record["sha256_before"] = sha256(plan.after)
            plan.after = new_text.encode("utf-8")
            record["sha256_after"] = sha256(plan.after)
        return record

    def _recorded(self, manifest):
        """What the manifest says we patched, checked against the files."""
        recorded = []
        for key, entry in sorted(manifest["files"].items()):
            current = file_sha256(entry["file"])
            if current == entry["patched_sha256"]:
                state = "intact"
            elif current == entry["original_sha256"]:
                state = "missing: file replaced by its original (reinstalled?)"
            elif current is None:
                state = "missing: file deleted"
            else:
                state = "changed since patched"
            recorded.append({"key": key, "file": entry["file"], "state": state,
                             "patches": [p["id"] for p in entry["patches"]],
                             "original_sha256": entry["original_sha256"], "patched_sha256": entry["patched_sha256"],
                             "current_sha256": current})
        return recorded

    def _result(self, action, chosen, plans, manifest, **extra):
        order = [patch.id for patch in chosen.patches] if chosen else []
        result = {
            "action": action,
            "environment": {"prefix": sys.prefix, "python": sys.executable, "state_dir": self.store.directory},
            "facts": self.facts.as_dict(),
            "patchset": chosen.as_dict() if chosen else None,
            "patches": sorted((record for plan in plans for record in plan.patches),
                              key=lambda record: order.index(record["id"])),
            "recorded": self._recorded(manifest),
            "bytes_written": 0,
        }
        result.update(extra)
        return result

    # ---- actions ----------------------------------------------------------------------------

    def status(self, name):
        manifest = self.store.read()
        try:
            chosen = self._load(name)
        except RemoteFailure as failure:
            if failure.kind != "no-patchset" or name is not None:
                raise
            return self._result("status", None, [], manifest, patchset_problem=failure.message)
        return self._result("status", chosen, self._plan(chosen, manifest), manifest, patchset_problem=None)

    def apply(self, name, *, dry_run):
        chosen = self._load(name)
        manifest = self.store.read_raw()
        plans = self._plan(chosen, patchstore.resolve_intent(manifest)[0])
        conflicts = _conflicts(plans)
        if dry_run:
            return self._result("apply", chosen, plans, manifest, dry_run=True, conflicts=conflicts,
                                files=[_file_report(plan, diff=True) for plan in plans])
        if not conflicts and not manifest.get("intent") and not any(plan.changes for plan in plans):
            # Nothing to do: not a byte is written, not even the lock's holder record.
            files = [dict(_file_report(plan, diff=False), bytes_written=0) for plan in plans]
            return self._result("apply", chosen, plans, manifest, dry_run=False, recovered=[], files=files)
        self.store.lock("apply")
        try:
            recovered = self.store.recover()
            self._remove_temporaries(chosen)
            manifest = self.store.read_raw()
            plans = self._plan(chosen, manifest)
            conflicts = _conflicts(plans)
            if conflicts:
                raise RemoteFailure("conflict", "nothing was changed: %s" % "; ".join(
                    "patch %s (%s): %s" % (c["id"], c["path"], c["reason"]) for c in conflicts),
                    conflicts=conflicts, result=self._result("apply", chosen, plans, manifest))
            written = self._write(plans, manifest, chosen)
            self.store.drop_unreferenced_backups(self.store.read_raw())
        finally:
            self.store.unlock()
        for record in (record for plan in plans for record in plan.patches if "sha256_after" in record):
            record.update(state=patchlib.State.APPLIED, reason="", by="specrig", applied_now=True)
        files = [_file_report(plan, diff=False) for plan in plans]
        for report in files:
            report["bytes_written"] = written.get(report["file"], 0)
        return self._result("apply", chosen, plans, self.store.read_raw(), dry_run=False, recovered=recovered,
                            files=files, bytes_written=sum(written.values()))

    def _remove_temporaries(self, chosen):
        directories = {self.store.directory, self.store.backups}
        for patch in chosen.patches:
            directories.add(os.path.dirname(os.path.join(self.facts.distributions[patch.package]["root"],
                                                         patch.path)))
        for directory in directories:
            atomic.remove_stale_temporaries(directory)

    def _write(self, plans, manifest, chosen):
        """Announce, write, commit. Returns {file: bytes written}; nothing when nothing is pending."""
        changing = [plan for plan in plans if plan.changes]
        if not changing:
            return {}
        read_only = sorted({os.path.dirname(plan.file) for plan in changing
                            if not os.access(os.path.dirname(plan.file), os.W_OK)})
        if read_only:
            raise RemoteFailure("not-writable", "nothing was changed: %s cannot write to %s; run as the owner of "
                                "the environment (hosts.yaml `user`/`python`)" % (
                                    pwd.getpwuid(os.getuid()).pw_name, ", ".join(read_only)), directories=read_only)
        intent = {"action": "apply", "pid": os.getpid(), "started_at": patchstore.now(), "files": {}}
        for plan in changing:
            entry = manifest["files"].get(plan.key)
            if entry is None or entry["patched_sha256"] != sha256(plan.before):
                # No record, or a stale one (file replaced since): the bytes now are the original.
                entry = {"package": plan.package, "path": plan.path, "file": plan.file,
                         "original_sha256": sha256(plan.before), "backup": self.store.keep_original(plan.before),
                         "patches": []}
            entry = dict(entry, patched_sha256=sha256(plan.after), patches=entry["patches"] + [
                {"id": record["id"], "patchset": chosen.name, "fixes": record["fixes"],
                 "sha256_before": record["sha256_before"], "sha256_after": record["sha256_after"],
                 "applied_at": patchstore.now(), "specrig_version": self.specrig_version}
                for record in plan.patches if "sha256_after" in record])
            intent["files"][plan.key] = {"file": plan.file, "from_sha256": sha256(plan.before),
                                         "to_sha256": sha256(plan.after), "entry": entry}
        return self._carry_out(manifest, intent, {plan.file: plan.after for plan in changing})

    def _carry_out(self, manifest, intent, contents):
        self.store.write(dict(manifest, intent=intent))
        written = {}
        for file, data in contents.items():
            written[file] = atomic.write_bytes(file, data)
        self.store.write(patchstore.resolve_intent(dict(manifest, intent=intent))[0])
        return written

    def revert(self, patch_id, *, force):
        if patch_id is None and not self.store.read()["files"]:
            return {"action": "revert", "environment": {"prefix": sys.prefix, "state_dir": self.store.directory},
                    "files": [], "recovered": [], "bytes_written": 0, "recorded": []}
        self.store.lock("revert")
        try:
            recovered = self.store.recover()
            manifest = self.store.read_raw()
            entries = {key: entry for key, entry in manifest["files"].items()
                       if patch_id is None or any(p["id"] == patch_id for p in entry["patches"])}
            if not entries:
                raise RemoteFailure("not-applied", "no patch%s recorded as applied by specrig in %s" % (
                    " %r is" % patch_id if patch_id else "es are", sys.prefix))
            intent = {"action": "revert", "pid": os.getpid(), "started_at": patchstore.now(), "files": {}}
            contents, refused, reports = {}, [], []
            for key, entry in sorted(entries.items()):
                current = file_sha256(entry["file"])
                reverting = [p["id"] for p in entry["patches"] if patch_id is None or p["id"] == patch_id]
                report = {"file": entry["file"], "path": entry["path"], "patches": reverting}
                reports.append(report)
                if current == entry["original_sha256"]:
                    report["outcome"] = "already original (replaced since patched); record dropped"
                    manifest["files"].pop(key)
                    continue
                if current != entry["patched_sha256"] and not force:
                    refused.append("%s changed since specrig patched it (sha256 now %s, patched %s): reverting "
                                   "would discard that change" % (entry["file"], (current or "none")[:12],
                                                                   entry["patched_sha256"][:12]))
                    continue
                original = self.store.original(entry)
                remaining = [p for p in entry["patches"] if p["id"] != patch_id] if patch_id else []
                data, new_entry = original, None
                if remaining:
                    data = self._reapply(original, remaining, entry)
                    new_entry = dict(entry, patches=remaining, patched_sha256=sha256(data))
                contents[entry["file"]] = data
                intent["files"][key] = {"file": entry["file"], "from_sha256": current, "to_sha256": sha256(data),
                                        "entry": new_entry}
                report["outcome"] = "restored original" if new_entry is None else "reverted; %s kept" % ", ".join(
                    p["id"] for p in remaining)
            if refused:
                raise RemoteFailure("revert-refused", "nothing was reverted: %s (use --force to revert anyway)"
                                    % "; ".join(refused), refused=refused)
            written = self._carry_out(manifest, intent, contents) if contents else {}
            if not contents:
                self.store.write(manifest)
            self.store.drop_unreferenced_backups(self.store.read_raw())
        finally:
            self.store.unlock()
        for report in reports:
            report["sha256_now"] = file_sha256(report["file"])
            report["bytes_written"] = written.get(report["file"], 0)
        return {"action": "revert", "environment": {"prefix": sys.prefix, "state_dir": self.store.directory},
                "files": reports, "recovered": recovered, "bytes_written": sum(written.values()),
                "recorded": self._recorded(self.store.read_raw())}

    def _reapply(self, original, remaining, entry):
        """The original with the patches we keep applied again, in their order."""
        try:
            found = patchsets.load_all()
        except patchsets.InvalidPatchset as exc:
            raise RemoteFailure("bad-patchset", str(exc)) from None
        text = original.decode("utf-8")
        for record in remaining:
            patch = found.get(record["patchset"]) and found[record["patchset"]].patch(record["id"])
            if patch is None:
                raise RemoteFailure("revert-refused", "cannot keep patch %s on %s: patchset %s no longer defines "
                                    "it; revert all patches of the file instead" % (
                                        record["id"], entry["file"], record["patchset"]))
            source = patchlib.parse(text)
            state = patch.edit.state(source)
            if state.name != patchlib.State.PENDING:
                raise RemoteFailure("revert-refused", "cannot keep patch %s on %s: on the original it is %s %s"
                                    % (record["id"], entry["file"], state.name, state.reason))
            text = patch.edit.apply(source)
        return text.encode("utf-8")


def _in_other_environment(chosen, facts):
    """What of the patchset would touch or read files of a package given as a fact (not here)."""
    found = []
    for patch in chosen.patches:
        if facts.is_given(patch.package):
            found.append("patch %s targets %s" % (patch.id, patch.package))
        for key in ("parameter-absent", "parameter-present"):
            condition = patch.when.get(key)
            if condition and facts.is_given(condition["package"]):
                found.append("patch %s's condition %s reads %s's source" % (patch.id, key, condition["package"]))
    return found


def _check_edit(patch, new_text):
    """Why the edited text is unacceptable, or None: it must parse and the edit must then read as applied."""
    try:
        source = patchlib.parse(new_text)
    except SyntaxError as exc:
        return "the edit would produce invalid Python (%s, line %s)" % (exc.msg, exc.lineno)
    after = patch.edit.state(source)
    if after.name != patchlib.State.APPLIED:
        return "after the edit the patch still reads as %s %s" % (after.name, after.reason)
    return None


def _conflicts(plans):
    return [{"id": r["id"], "path": r["path"], "file": r["file"], "reason": r["reason"]}
            for plan in plans for r in plan.patches if r["state"] == patchlib.State.CONFLICT]


def _file_report(plan, *, diff):
    report = {"file": plan.file, "package": plan.package, "path": plan.path, "changes": plan.changes,
              "sha256_before": sha256(plan.before) if plan.before is not None else None,
              "sha256_after": sha256(plan.after) if plan.after is not None else None}
    if diff:
        report["diff"] = "".join(difflib.unified_diff(
            (plan.before or b"").decode("utf-8", "replace").splitlines(keepends=True),
            (plan.after or b"").decode("utf-8", "replace").splitlines(keepends=True),
            "a/" + plan.path, "b/" + plan.path)) if plan.changes else ""
    return report
