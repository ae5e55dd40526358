"""Find import cycles between the modules of one package, for CI (issue 22, "Circles: 0").

import-linter holds the layers between folders, but no contract of it forbids two modules of one
folder from importing each other, and such a circle is the mark of a module cut along the nearest
seam rather than by idea. This script reads every ``*.py`` file of the package with ``ast`` (nothing
is imported or run), collects each import of a module of the same package — absolute, relative,
``from . import x``, inside functions, and inside ``if TYPE_CHECKING:`` blocks too: an import kept
for type hints only still says the two modules know each other, so it is the same design circle,
only hidden from the interpreter — and prints every strongly connected component of the graph with
one shortest cycle through it, each edge with the file and line that makes it. Exit status 1 when
there is a cycle, 0 when there is none.

Usage: python .ci/import_cycles.py [PACKAGE_DIR]   (default: lmsp_tray next to .ci/)
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Edge:
    """One import of ``target`` by ``source``, where it is written."""

    source: str
    target: str
    path: Path
    line: int


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (a package's ``__init__`` by the package's)."""
    root = package_dir.name
    names: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [root, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute name ``from X import ...`` refers to, resolving leading dots."""
    if node.level == 0:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    if not base:
        return None
    return ".".join(base + ([node.module] if node.module else []))


def _in_package(name: str, modules: dict[str, Path]) -> str | None:
    """The longest module of the package that ``name`` is or lies in (``a.b.func`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_edges(package_dir: Path) -> list[Edge]:
    """Every import between two distinct modules of the package, in file and line order."""
    modules = module_names(package_dir)
    edges: list[Edge] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(module, is_package, node)
                if base is None:
                    continue
                # ``from pkg import name``: name is a submodule, or a name defined in pkg itself.
                targets = [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
                targets = targets or [base]
            for name in targets:
                target = _in_package(name, modules)
                if target is not None and target != module:
                    edges.append(Edge(module, target, path, node.lineno))
    edges.sort(key=lambda e: (e.source, e.line, e.target))
    return edges


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def shortest_cycle(start: str, graph: dict[str, set[str]], within: set[str]) -> list[str]:
    """The shortest path from ``start`` back to itself inside one component (breadth first)."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & within):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is in no cycle")


def find_cycles(package_dir: Path) -> list[tuple[list[str], list[Edge]]]:
    """Each circle of modules (a strongly connected component), with one shortest cycle in it."""
    edges = import_edges(package_dir)
    graph: dict[str, set[str]] = {name: set() for name in module_names(package_dir)}
    first: dict[tuple[str, str], Edge] = {}
    for edge in edges:
        graph[edge.source].add(edge.target)
        first.setdefault((edge.source, edge.target), edge)
    circles = []
    for component in strongly_connected(graph):
        path = shortest_cycle(component[0], graph, set(component))
        circles.append((component, [first[(a, b)] for a, b in itertools.pairwise(path)]))
    return circles


def main(argv: list[str]) -> int:
    package_dir = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent / "lmsp_tray"
    circles = find_cycles(package_dir)
    for members, cycle in circles:
        print(" -> ".join([cycle[0].source, *(edge.target for edge in cycle)]))
        for edge in cycle:
            print(f"    {edge.path}:{edge.line}: {edge.source} imports {edge.target}")
        if len(members) > len(cycle):
            print(f"    (one circle of {len(members)} modules: {', '.join(members)})")
    if circles:
        print(f"import_cycles: {len(circles)} circle(s) of imports inside {package_dir.name}")
        return 1
    print(f"import_cycles: no circle of imports inside {package_dir.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
