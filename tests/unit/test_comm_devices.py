"""Static net for device mistakes: every tensor factory in the collective code names its
device, since an NCCL group rejects the CPU tensors an unnamed device would give."""

from __future__ import annotations

import ast

from tests.conftest import REPO_ROOT

FACTORIES = {"tensor", "empty", "zeros", "ones", "full", "arange", "rand", "randn",
             "randint", "empty_strided", "as_tensor", "linspace"}
CHECKED = [*sorted((REPO_ROOT / "src/neoxlab/comm").glob("*.py")),
           REPO_ROOT / "src/neoxlab/omb/compressed.py"]


def unnamed_device_calls(path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        base = node.func.value
        if not (isinstance(base, ast.Name) and base.id == "torch"):
            continue
        if node.func.attr in FACTORIES and not any(k.arg == "device" for k in node.keywords):
            found.append(f"{path.name}:{node.lineno}: torch.{node.func.attr}(...) without device=")
    return found


def test_every_tensor_factory_in_the_collective_code_names_its_device():
    problems = [p for path in CHECKED for p in unnamed_device_calls(path)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_an_unnamed_device(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.empty(3)\ny = torch.zeros(2, device='cpu')\n")
    assert unnamed_device_calls(bad) == ["bad.py:2: torch.empty(...) without device="]
