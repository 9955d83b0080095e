"""How people see a host's patches: the patches and their states, diffs, what was written; and the
patch tasks' views (specrig/ui/task.py)."""
from __future__ import annotations

from rich.syntax import Syntax
from rich.table import Table

from specrig.errors import Findings
from specrig.exit_status import ExitStatus
from specrig.inventory import Host
from specrig.ui import console, print_indented, print_json
from specrig.ui.task import TaskView
from specrig.ui.terminal import markup, visible

STATE_STYLE = {"applied": "green", "pending": "yellow", "missing": "yellow", "not-applicable": "dim",
               "conflict": "red"}


def show(result: dict, *, host: Host) -> None:
    if result["action"] == "revert":
        _show_revert(result, host)
        return
    env = result["environment"]
    packages = ", ".join(_package(name, p) for name, p in result["facts"]["packages"].items())
    where = f"{env['role']} " if host.two_environments and env.get("role") else ""
    console.print(f"[bold]{markup(host.name)}[/]: {markup(where + env['prefix'])} ({markup(packages)}, "
                  f"platform {result['facts']['platform']})")
    if result.get("patchset"):
        console.print(f"patchset [bold]{markup(result['patchset']['name'])}[/]: "
                      f"{markup(result['patchset']['description'])}")
    elif result.get("patchset_problem"):
        console.print(f"[yellow]{markup(result['patchset_problem'])}[/]")
    other = result.get("other_patchset")
    if other:  # a host with two environments: the client's patchset, applied in `python`'s
        console.print(f"and in {markup(result['other_environment']['prefix'])}, patchset [bold]"
                      f"{markup(other['name'])}[/]: {markup(other['description'])}")
    if result.get("patches"):
        _show_patches(result["patches"], host)
    for recorded in result.get("recorded", []):
        if recorded["state"] != "intact" or recorded.get("environment") not in (None, env.get("role")):
            console.print(f"[yellow]{markup(recorded['file'])}: {markup(recorded['state'])} "
                          f"(patched by specrig: {markup(', '.join(recorded['patches']))})[/]")
    if result.get("dry_run"):
        for file in result["files"]:
            if file["diff"]:
                console.print(Syntax(visible(file["diff"]), "diff", word_wrap=True))
        console.print("dry run: nothing was changed")
    elif result["action"] == "apply" and "files" in result:  # absent when the run was refused
        _show_applied(result)


#: Below this width the table squeezes descriptions to a word a line: one block per patch instead.
TABLE_MIN_WIDTH = 110


def _show_patches(patches: list[dict], host: Host) -> None:
    rows = [(patch["id"], patch["state"], patch["description"], _where(patch, host)) for patch in patches]
    if console.width < TABLE_MIN_WIDTH:
        # As findings are shown when narrow: the id and state on a line of their own, never cut.
        for patch_id, state, description, where in rows:
            console.print(f"{markup(patch_id)}  [{STATE_STYLE.get(state, '')}]{state}[/]", soft_wrap=True)
            print_indented(markup(description))
            print_indented(f"[dim]{markup(where)}[/]")
        return
    table = Table(expand=True)
    table.add_column("patch", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("what", ratio=1, overflow="fold")
    for patch_id, state, description, where in rows:
        table.add_row(markup(patch_id), f"[{STATE_STYLE.get(state, '')}]{state}[/]",
                      f"{markup(description)}\n[dim]{markup(where)}[/]")
    console.print(table)


def _where(patch: dict, host: Host) -> str:
    """The patched file's name and how the patch came to be in its state."""
    state = patch["state"]
    note = patch["reason"] or ("applied now" if patch.get("applied_now") else
                               f"by specrig {patch['specrig_version']} at {patch['applied_at']}"
                               if patch.get("applied_at") else patch["by"] if state == "applied" else "")
    where = patch["path"].rpartition("/")[2] + (f": {note}" if note else "")
    if host.two_environments and patch.get("environment"):
        where = f"{patch['environment']}: {where}"
    return where


def _package(name: str, found: dict | None) -> str:
    """"vllm 0.32.0", "speculators 0.9.0 (python's environment; 0.4.0.1 here)"."""
    text = f"{name} {found['version']}" if found and found.get("version") else f"{name} (not installed)"
    if found and found.get("given"):
        here = found.get("installed_here")
        text += " (python's environment" + (f"; {here} here, not used" if here else "") + ")"
    return text


def _show_applied(result: dict) -> None:
    written = result["bytes_written"]
    changed = [f for f in result["files"] if f["bytes_written"]]
    console.print(f"wrote {written} bytes to {len(changed)} file(s)" if written else "nothing to do: every "
                  "applicable patch is already applied")
    verification = result.get("verification")
    if verification:
        other = verification["other_drift"]
        console.print("[green]verified[/]: verify-signatures reports none of the drift the patchset fixes"
                      + (f"; {len(other)} other drift finding(s) remain (inv verify-signatures lists them)"
                         if other else ""))


def _show_revert(result: dict, host: Host) -> None:
    if not result["files"]:
        console.print(f"{host.name}: nothing to revert: no patch is recorded as applied by specrig")
        return
    for file in result["files"]:
        where = f"{file['environment']}: " if host.two_environments and file.get("environment") else ""
        console.print(f"{markup(where + file['path'])}: {markup(file['outcome'])} "
                      f"({markup(', '.join(file['patches']))})")
    console.print(f"{host.name}: wrote {result['bytes_written']} bytes")


# ---- the tasks' views ---------------------------------------------------------------------------

def show_patches(result: dict, *, host: Host, as_json: bool) -> None:
    if as_json:
        print_json(result)
    else:
        show(result, host=host)


def show_refused(found: Findings, *, host: Host, as_json: bool) -> ExitStatus | None:
    """A conflict, a refused revert, drift left after applying: --json prints the engine's result with
    the error and ends there; people see the patches, then the error."""
    if as_json:
        print_json({**found.payload, "error": found.message})
        return found.exit_status
    if found.payload.get("patches"):
        show(found.payload, host=host)
    return None


def patches_figures(result: dict) -> str:
    """apply-patches and patch-status: the patchset and its patches by state; what applying wrote."""
    if result["action"] == "revert":
        return revert_figures(result)
    if not result.get("patchset"):
        return result.get("patchset_problem") or "no patchset"
    states: dict[str, int] = {}
    for patch in result["patches"]:
        states[patch["state"]] = states.get(patch["state"], 0) + 1
    text = f"patchset {result['patchset']['name']}: " + ", ".join(f"{n} {state}" for state, n in states.items())
    if result.get("dry_run"):
        return text + f"; dry run: {sum(bool(f['diff']) for f in result['files'])} file(s) would change"
    if result["action"] == "apply" and "files" in result:
        written = result["bytes_written"]
        text += (f"; wrote {written} bytes to {sum(bool(f['bytes_written']) for f in result['files'])} file(s)"
                 if written else "; nothing to do")
        if result.get("verification") is not None:
            other = len(result["verification"]["other_drift"])
            text += "; verified" + (f", {other} other drift finding(s)" if other else "")
    return text


def revert_figures(result: dict) -> str:
    if not result["files"]:
        return "nothing to revert"
    return f"{len(result['files'])} file(s) reverted, {result['bytes_written']} bytes written"


def patches_view(title: str) -> TaskView:
    """apply-patches, patch-status, revert-patches."""
    return TaskView(title, show=show_patches, figures=patches_figures, show_findings=show_refused)
