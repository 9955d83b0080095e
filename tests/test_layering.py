"""The host side's layers (remote/), read from the imports themselves with `ast`: every module stands in one
layer, imports only its own package and the layers below it, and no modules import each other in a loop.

remote/ is sys.path[0] on a host, so a module imports another by its top-level name (`from base import
contract`, `from run import storage`); an import inside a function counts as much as one at the top.
docs/ARCHITECTURE.md ("Layers, host side") draws the same order; tests/test_layering_laptop.py holds
specrig/ to its own.
"""
from support.imports import imports, module_names, strongly_connected
from support.paths import REPO

REMOTE = REPO / "remote"

#: Bottom first. Each entry is a package of remote/ or a module at its root; a layer imports only those
#: below it (and, inside one package, its own modules). The ground is what two stages or more need; the
#: stages of one layer never import each other; the entry is above all.
LAYERS = (
    ("base",),                        # the shared ground
    ("drift", "gpus", "patching", "slurm"),  # stages that need only the ground (gpus: topology, the probe)
    ("dataset",),                     # is a run's output trainable: reads the records in the ground
    ("run",),                         # preflight, smoke, supervised runs: the supervisor verifies the dataset
    ("doctor",),                      # what is on the host: the run's model checks, Slurm's cluster
    ("probe", "rpc"),                 # the primitive: its diagnostics, the call and its dispatch table
    ("entry",),                       # every call starts here
)
#: The root of remote/ holds the entry and nothing else loose.
MAX_ROOT_MODULES = 4


def layer_of(module: str) -> int:
    """The module's layer; one in no layer is above all (the first test names it)."""
    top = module.split(".")[0]
    return next((index for index, layer in enumerate(LAYERS) if top in layer), len(LAYERS))


def test_every_module_stands_in_a_layer():
    tops = {name.split(".")[0] for name in module_names(REMOTE)}
    placed = {top for layer in LAYERS for top in layer}
    assert not tops - placed, f"remote/ packages or root modules in no layer of LAYERS (place each): {sorted(tops - placed)}"
    assert not placed - tops, f"LAYERS names what remote/ no longer holds: {sorted(placed - tops)}"


def test_no_module_imports_a_layer_beside_or_above_its_own():
    wrong = [f"remote/{name.replace('.', '/')} line {line} imports {target}"
             for name, targets in imports(module_names(REMOTE)).items() for target, line in sorted(targets)
             if target.split(".")[0] != name.split(".")[0] and layer_of(target) >= layer_of(name)]
    assert not wrong, "imports beside or up the layers (move what both need down, into base/):\n" + "\n".join(wrong)


def test_no_modules_import_each_other_in_a_loop():
    graph = {name: {target for target, _ in targets} for name, targets in imports(module_names(REMOTE)).items()}
    loops = strongly_connected(graph)
    assert not loops, f"modules importing each other in a loop: {loops}"


def test_the_root_holds_the_entry_alone():
    loose = sorted(path.name for path in REMOTE.glob("*.py"))
    assert len(loose) <= MAX_ROOT_MODULES, f"loose modules at the root of remote/: {loose}"
