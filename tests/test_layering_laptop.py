"""The laptop side's layers (specrig/), read from the imports themselves with `ast`, as tests/test_layering.py
reads the host's: every package of specrig/ and module at its root stands in one layer, imports only its
own package and the layers below it, and no modules import each other in a loop.

The ground is the shared modules at the top of specrig/, each over those it needs; the stages stand above
the output for people (specrig/ui/), in their order analyze, patch, run; the command line is above all.
docs/ARCHITECTURE.md ("Layers, laptop side") draws the same order.
"""
from support.imports import imports, module_names, strongly_connected
from support.paths import REPO

SPECRIG = REPO / "specrig"

#: Bottom first. Each entry is a package of specrig/ or a module at its root ("__init__": the package's face,
#: its version); a layer imports only those below it (and, inside one package, its own modules), never one
#: beside it.
LAYERS = (
    ("__init__", "exit_status", "paths"),   # the version, the exit codes, where specrig's files are
    ("contract", "errors"),                 # the host's contracts loaded from their files; typed failures
    ("slurm_settings", "yamlfile"),         # hosts.yaml's slurm: checked; YAML read with one-line errors
    ("inventory",),                         # hosts.yaml
    ("group", "transport"),                 # a task over a group of hosts; the one remote primitive
    ("doctor", "lab"),                      # what a host is; the lab host (a clone's alone, never the wheel's)
    ("ui",),                                # output for people: the views of all below, a preflight's checks
    ("dataset", "drift", "slurm"),          # stages over a host's calls alone; Slurm's refusals and views
    ("patching",),                          # the patch stage: the drift left after a patch
    ("run",),                               # the run stage: patches in force, a dataset's verdict, Slurm jobs
    ("train",),                             # from a dataset to a draft: the draft's acceptance, over runs
    ("cli",),                               # the tasks, the `specrig` program
    ("__main__",),                          # python -m specrig
)


def top(module: str) -> str:
    """The package of specrig/ or root module that `module` stands in ("__init__" for specrig itself)."""
    return module.split(".")[1] if "." in module else "__init__"


def layer_of(module: str) -> int:
    """The module's layer; one in no layer is above all (the first test names it)."""
    return next((index for index, layer in enumerate(LAYERS) if top(module) in layer), len(LAYERS))


def test_every_module_stands_in_a_layer():
    tops = {top(name) for name in module_names(SPECRIG, "specrig")}
    placed = {name for layer in LAYERS for name in layer}
    assert not tops - placed, f"specrig/ packages or root modules in no layer of LAYERS (place each): {sorted(tops - placed)}"
    assert not placed - tops, f"LAYERS names what specrig/ no longer holds: {sorted(placed - tops)}"


def test_no_module_imports_a_layer_beside_or_above_its_own():
    wrong = [f"{name} line {line} imports {target}"
             for name, targets in imports(module_names(SPECRIG, "specrig")).items() for target, line in sorted(targets)
             if top(target) != top(name) and layer_of(target) >= layer_of(name)]
    assert not wrong, ("imports beside or up the layers (move what both need down, where both may import it):\n"
                       + "\n".join(wrong))


def test_no_modules_import_each_other_in_a_loop():
    graph = {name: {target for target, _ in targets} for name, targets in imports(module_names(SPECRIG, "specrig")).items()}
    loops = strongly_connected(graph)
    assert not loops, f"modules importing each other in a loop: {loops}"
