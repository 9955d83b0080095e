"""A tree's imports read with `ast`, for the layering tests of both sides (tests/test_layering.py for
remote/, tests/test_layering_laptop.py for specrig/): every module by its dotted name, what each imports,
and the loops among them. An import inside a function counts as much as one at the top.
"""
import ast
from pathlib import Path


def module_names(root: Path, package: str = "") -> dict:
    """{dotted name as imported: path} of every module under `root` (a package as its __init__); `package`
    is the name `root` is imported by ("" where root is sys.path[0], as remote/ is on a host)."""
    found = {}
    for path in root.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(([package] if package else []) + list(parts[:-1] if parts[-1] == "__init__" else parts))] = path
    return found


def imports(modules: dict) -> dict:
    """{module: {(imported module, line)}}: each import statement resolved to the longest module of
    `modules` it names; imports of anything else (the standard library, rich) are left out."""

    def resolve(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = {}
    for name, path in modules.items():
        targets = found.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}:{node.lineno}: a relative import; both sides import by full name"
                named = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            targets.update((target, node.lineno) for target in map(resolve, named) if target not in (None, name))
    return found


def strongly_connected(graph: dict) -> list:
    """The loops of `graph` (Tarjan's components of more than one module, or one that imports itself)."""
    index, low, on_stack, stack, loops = {}, {}, set(), [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                loops.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return loops
