"""Every module of shardkit/planning/ is pure: numbers in, numbers out, nothing read or written.

A planner imports only computation (numpy, math, hashing, typing, threads that run the same
arithmetic) and other planners or the error family; it never names ``open``. So a plan is a function
of its arguments, and a grid test can hold it.
"""

from __future__ import annotations

import ast
import os

import pytest
from support import REPO

PLANNING = os.path.join(REPO, "shardkit", "planning")
COMPUTATION = {"__future__", "bisect", "collections", "concurrent.futures", "dataclasses", "enum", "functools",
               "hashlib", "heapq", "itertools", "math", "numpy", "operator", "re", "statistics", "typing",
               "shardkit.errors"}


def _modules() -> list[str]:
    return sorted(os.path.relpath(os.path.join(folder, name), PLANNING) for folder, _, names in os.walk(PLANNING)
                  for name in names if name.endswith(".py"))


def _imports(tree: ast.AST) -> set[str]:
    return {alias.name if isinstance(node, ast.Import) else node.module
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


@pytest.mark.parametrize("name", _modules())
def test_a_planner_imports_only_computation_and_never_opens_a_file(name):
    with open(os.path.join(PLANNING, name), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    foreign = {m for m in _imports(tree) if m not in COMPUTATION and not m.startswith("shardkit.planning")}
    assert foreign == set(), f"planning/{name} imports {sorted(foreign)}"
    assert "open" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def test_the_purity_check_catches_a_planner_that_reads(tmp_path):
    tree = ast.parse("import os\nfrom shardkit.io.tar import iter_tar_members\n\ndef plan(p):\n    return open(p)\n")
    assert _imports(tree) - COMPUTATION == {"os", "shardkit.io.tar"}
    assert "open" in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
