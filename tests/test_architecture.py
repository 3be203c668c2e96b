"""The module map of docs/architecture.md, checked: layers import only downwards, and no two
modules import each other, directly or round a loop (lazy imports inside functions included:
a loop through one is still a loop a reader has to untangle)."""

from __future__ import annotations

import ast
from pathlib import Path

import grader

PACKAGE = Path(grader.__file__).parent

# Each layer may import its own and the layers before it.
LAYERS = ["errors", "status", "records", "config", "io", "judge", "backends", "analysis", "run",
          "label", "inspect_log", "cli", "api", "inspect_scorer", "_registry"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The grader modules ``path`` imports anywhere but under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "grader":
                found.update(f"grader.{alias.name}" for alias in node.names)
            elif node.module.startswith("grader."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("grader."))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        # "from grader.io import results" names a module; "from grader.x import y" names x
        graph[name] = {i for i in _imports(path) if i in modules} - {name}
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_layers_import_only_downwards():
    upward = []
    for module, imported in _graph().items():
        if _layer(module) not in LAYERS:
            continue
        for other in imported:
            if _layer(other) in LAYERS and LAYERS.index(_layer(other)) > LAYERS.index(_layer(module)):
                upward.append(f"{module} -> {other}")
    assert not upward, "imports against the layers of docs/architecture.md:\n" + "\n".join(sorted(upward))


def test_no_import_cycle():
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in sorted(graph[module]):
            if state.get(other) == 1:
                cycles.append(" -> ".join(path[path.index(other):] + [other]))
            elif other not in state:
                visit(other, [*path, other])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_map_covers_every_module():
    # a new top-level module or folder must find its place in the map (and in the docs)
    layers = {_layer(m) for m in _graph()} - {"__init__", "__main__"}
    assert layers <= set(LAYERS)
