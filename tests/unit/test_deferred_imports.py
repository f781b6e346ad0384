"""Imports sit at the top of a module unless deferring one buys something (mpi4py initialises
MPI on import; torch, transformers or wandb cost seconds on a path that may not need them).
Each import inside a function says why in a `# deferred: <reason>` comment right above it, so
the next reader does not hoist it (or defer another) by guess."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "neoxlab"
MARK = "# deferred:"


def function_level_imports(path: Path) -> list[int]:
    """Line numbers of the imports inside functions, the first of each run of adjacent ones."""
    tree = ast.parse(path.read_text())
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    lines.add(inner.lineno)
    text = path.read_text().splitlines()
    # a run of adjacent imports shares the one comment above its first
    firsts = [n for n in sorted(lines)
              if not text[n - 2].strip().startswith(("import ", "from "))]
    return firsts


def has_reason(text: list[str], lineno: int) -> bool:
    """The import's own line or the comment lines right above it carry the mark."""
    if MARK in text[lineno - 1]:
        return True
    i = lineno - 2
    while i >= 0 and text[i].strip().startswith("#"):
        if MARK in text[i]:
            return True
        i -= 1
    return False


def test_every_function_level_import_says_why() -> None:
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text().splitlines()
        for lineno in function_level_imports(path):
            if not has_reason(text, lineno):
                where = path.relative_to(SRC.parent)
                missing.append(f"{where}:{lineno}: {text[lineno - 1].strip()}")
    assert not missing, (
        "imports inside functions without a `# deferred: <reason>` comment above them; move "
        "them to the top of the module, or say why they wait:\n" + "\n".join(missing))


def test_the_check_finds_an_unmarked_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import json\n    return json\n\n"
                      "def g():\n    # deferred: mpi4py initialises MPI on import\n"
                      "    from mpi4py import MPI\n    import os\n    return MPI, os\n")
    text = module.read_text().splitlines()
    verdicts = {n: has_reason(text, n) for n in function_level_imports(module)}
    assert verdicts == {2: False, 7: True}
