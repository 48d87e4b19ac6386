"""The packages of src/gebackend import one way: each imports only the layers below it (read with `ast`).

The order is the path a request travels, lowest first: the shared modules at the top of the package (errors, files,
cache_dir), `control` (the instances' shared state on disk), `config` (config.pbtxt and options into one spec),
`compile` (graph passes, precision lowering), `engines`, `profiling`, `runtime` (the instance, buckets, batching),
`preprocess`, `triton` (the thin adapter), `server`, `modelzoo`, `bench`, `tune`, `cli`. An import at any depth of
a module counts, also one made inside a function: a cycle through a deferred import is still a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "src" / "gebackend"
TOP = "(top)"  # the modules directly in src/gebackend
ORDER = [TOP, "control", "config", "compile", "engines", "profiling", "runtime", "preprocess", "triton", "server",
         "modelzoo", "bench", "tune", "cli"]


def _layer(path: Path) -> str:
    parts = path.relative_to(SOURCE).parts
    return parts[0] if len(parts) > 1 else TOP


def _imported_layer(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "gebackend" or len(parts) < 2:
        return None
    return parts[1] if (SOURCE / parts[1]).is_dir() else TOP


def imports() -> list[tuple[str, str, str]]:
    """(importing layer, imported layer, 'file:line module') for every import of another layer."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        layer = _layer(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                target = _imported_layer(name)
                if target is not None and target != layer:
                    found.append((layer, target, f"{path.relative_to(SOURCE)}:{node.lineno} {name}"))
    return found


def test_every_package_has_a_place_in_the_order():
    packages = {p.name for p in SOURCE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages <= set(ORDER), f"place these packages in ORDER: {sorted(packages - set(ORDER))}"


def test_no_package_imports_a_layer_above_it():
    rank = {layer: number for number, layer in enumerate(ORDER)}
    upward = sorted({(a, b, where) for a, b, where in imports() if rank[b] > rank[a]})
    assert not upward, "imports that climb a layer (move what both need down):\n" + "\n".join(
        f"  {a} -> {b}: {where}" for a, b, where in upward)


def test_no_package_cycles():
    edges: dict[str, set[str]] = {}
    for a, b, _ in imports():
        edges.setdefault(a, set()).add(b)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(edges.get(node, ()))
        return False

    cycles = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if reaches(b, a)})
    assert not cycles, "package cycles: " + ", ".join(f"{a} <-> {b}" for a, b in cycles)


@pytest.mark.parametrize("module", ["gebackend.runtime.loader", "gebackend.triton.model"])
def test_the_checker_sees_imports_made_inside_functions(module):
    # the loader imports compile's modules on use: those count as edges too
    layer = module.split(".")[1]
    assert any(a == layer for a, _, _ in imports())
