"""The pure modules of ``shardkit.wenet_conf`` (the conf, tokens, filter, frames, order, batches and
the simulation) do no I/O: they import only numpy, the standard library's pure modules, the two
pure planners they share (partition, radix) and one another, and never name ``open``."""

from __future__ import annotations

import ast
import os

import pytest

import shardkit.wenet_conf

PACKAGE = os.path.dirname(shardkit.wenet_conf.__file__)
PURE = ("conf", "tokens", "dtypes", "filter", "frames", "order", "batches", "simulation")
ALLOWED = {"__future__", "dataclasses", "typing", "math", "re", "numpy", "shardkit.planning.partition",
           "shardkit.planning.radix", *(f"shardkit.wenet_conf.{name}" for name in PURE)}


def _tree(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read())


def _imported(tree: ast.Module) -> set[str]:
    return {node.module if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


@pytest.mark.parametrize("name", PURE)
def test_a_pure_module_imports_nothing_that_reads_or_writes(name):
    tree = _tree(os.path.join(PACKAGE, f"{name}.py"))
    assert _imported(tree) <= ALLOWED, _imported(tree) - ALLOWED
    assert "open" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


@pytest.mark.parametrize("planner", ["partition", "radix"])
def test_the_planners_they_share_are_pure_too(planner):
    tree = _tree(os.path.join(os.path.dirname(PACKAGE), "planning", f"{planner}.py"))
    assert _imported(tree) <= {"__future__", "dataclasses", "typing", "math", "numpy", "shardkit.planning.radix"}
    assert "open" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}

