"""The import layers of ARCHITECTURE.md, enforced over the source's `ast`: every neoxlab import
(module level or inside a function) points to the same or a lower layer, and no import cycle
exists between modules (package __init__ files count: importing a module runs them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# (module prefix, layer); the longest matching prefix decides. A module may import modules
# of its own layer or below. Keep in step with ARCHITECTURE.md's layer table.
LAYERS: dict[str, int] = {
    # 0: the bottom: schema, pure arithmetic, file helpers
    "neoxlab.files": 0, "neoxlab.comm_scratch": 0, "neoxlab.config": 0, "neoxlab.layout": 0,
    "neoxlab.metrics": 0, "neoxlab.registry": 0, "neoxlab.messages": 0,
    # 1: a run dir and the per-rank frame; rank start-up (standard library only)
    "neoxlab.run": 1, "neoxlab.forkserver": 1,
    # 2: libraries
    "neoxlab.compress": 2, "neoxlab.comm": 2, "neoxlab.omb": 2,
    # 3: the engines' own code
    "neoxlab.engines.builtin": 3, "neoxlab.engines.neox": 3,
    # 4: the engine registry (the engines package is the registry over its engines)
    "neoxlab.engines": 4,
    # 5: task programs, results and the performance model (they ask the engine registry)
    "neoxlab.serve": 5, "neoxlab.results": 5, "neoxlab.perfmodel": 5, "neoxlab.tune": 5,
    # 6: the task registry and the programs of tasks that launch nothing of their own
    "neoxlab.tasks": 6,
    # 7: launching and scheduling (the emulated cluster's network and launch among them)
    "neoxlab.launch": 7,
    # 8: the commands and entry points
    "neoxlab.commands": 8, "neoxlab.__main__": 8,
}


def layer_of(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise KeyError(f"{module} has no layer: add its package to LAYERS and ARCHITECTURE.md")


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(src: Path) -> dict[str, Path]:
    return {module_name(p, src): p for p in sorted((src / "neoxlab").rglob("*.py"))}


def absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name a (possibly relative) `from ... import` names."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = parts[:len(parts) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports(path: Path, known: set[str], module: str = "") -> set[str]:
    """neoxlab modules `path` imports anywhere in it (relative imports too), with the packages
    that run on the way."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = absolute(node, module, path.name == "__init__.py")
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known
                       else source for a in node.names]
        for target in targets:
            parts = target.split(".")
            for n in range(2, len(parts) + 1):  # the module and the packages above it
                name = ".".join(parts[:n])
                if name in known:
                    found.add(name)
    return found


def graph(src: Path) -> dict[str, set[str]]:
    mods = modules(src)
    # a module's own parent packages are already running when it runs: not an edge
    return {m: {t for t in imports(p, set(mods), m) if not m.startswith(t + ".") and t != m}
            for m, p in mods.items()}


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
                  for m, targets in edges.items() for t in targets
                  if layer_of(t) > layer_of(m) and not t.startswith(m + "."))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    for module in modules(SRC):
        if module != "neoxlab":
            layer_of(module)


def test_no_module_imports_a_higher_layer():
    assert upward_imports(graph(SRC)) == []


def test_no_import_cycles():
    assert cycles(graph(SRC)) == []


def test_the_check_catches_an_upward_import_and_a_cycle(tmp_path):
    """A copy of the source with one library importing the launcher fails both checks."""
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(SRC / "neoxlab", copy / "neoxlab")
    target = copy / "neoxlab" / "compress" / "base.py"
    target.write_text(target.read_text() + "\nfrom neoxlab.launch import local  # noqa\n")
    edges = graph(copy)
    assert "neoxlab.compress.base (layer 2) imports neoxlab.launch.local (layer 7)" in (
        upward_imports(edges))
    assert any("neoxlab.compress.base" in c for c in cycles(edges))


@pytest.mark.parametrize("module", ["neoxlab.layout", "neoxlab.config.schema"])
def test_the_bottom_imports_only_the_bottom(module):
    edges = graph(SRC)
    assert all(layer_of(t) == 0 for t in edges[module]), edges[module]


def test_the_fork_server_imports_the_standard_library_only():
    """It starts before anything else and forks every local rank: no third-party import (and
    of neoxlab only its own package) may run in it before the task names its modules."""
    import sys

    for path in sorted((SRC / "neoxlab" / "forkserver").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                top = name.split(".")[0]
                assert (top in sys.stdlib_module_names or top == "__future__"
                        or name.startswith("neoxlab.forkserver")), f"{path.name} imports {name}"


def test_relative_imports_are_followed(tmp_path):
    """A relative import reaches the graph like an absolute one: `from ..launch import local`
    in a library is an upward import too."""
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(SRC / "neoxlab", copy / "neoxlab")
    target = copy / "neoxlab" / "compress" / "base.py"
    target.write_text(target.read_text() + "\nfrom ..launch import local  # noqa\n")
    assert "neoxlab.compress.base (layer 2) imports neoxlab.launch.local (layer 7)" in (
        upward_imports(graph(copy)))


def test_every_import_of_neoxlab_names_a_module_that_exists():
    """A module moved without its importers updated shows here, before any test imports it."""
    mods = modules(SRC)
    missing = []
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                source = absolute(node, m, path.name == "__init__.py")
                if source.startswith("neoxlab") and source not in mods:
                    missing.append(f"{m} imports {source}")
            elif isinstance(node, ast.Import):
                missing += [f"{m} imports {a.name}" for a in node.names
                            if a.name.startswith("neoxlab.") and a.name not in mods]
    assert missing == []
