"""One copy of each atomic-write helper: defined in ``shardkit.io.files`` and imported from there.

``AtomicFile``, ``atomic_write_json`` and ``load_json`` were importable from three modules
(``io.files``, ``run.lifecycle``, ``run.manifest``); code that moves between modules must import them
from the one place they are defined, which this check holds to (a lazy import inside a function
would otherwise fail only when that function first runs)."""

from __future__ import annotations

import ast
import os
from support import REPO

HELPERS = {"AtomicFile", "atomic_write_json", "load_json"}
HOME = "shardkit.io.files"


def package_sources():
    root = os.path.join(REPO, "shardkit")
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, REPO), ast.parse(f.read())


def test_each_helper_is_imported_from_where_it_is_defined():
    elsewhere = [f"{path}:{node.lineno}: from {node.module} import {alias.name}"
                 for path, tree in package_sources() for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.module != HOME
                 for alias in node.names if alias.name in HELPERS]
    assert elsewhere == []


def test_each_helper_is_defined_once():
    defined = sorted((name, path) for path, tree in package_sources() for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in HELPERS
                     for name in [node.name])
    assert defined == sorted((name, os.path.join("shardkit", "io", "files.py")) for name in HELPERS)


def test_the_run_lifecycle_no_longer_re_exports_them():
    from shardkit.run import lifecycle

    assert not [name for name in HELPERS if hasattr(lifecycle, name)]
