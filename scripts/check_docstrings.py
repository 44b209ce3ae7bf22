"""How much of the package's public surface has a docstring (ast only: nothing is imported).

A public definition is a function or class whose name does not start with ``_``, defined at module
level or as a method of a public module-level class, in a module whose path below the package has no
``_``-prefixed part (``__init__.py`` counts as its package's public module; ``cli/_options.py``
does not). Overloads (``@typing.overload``) and property setters/deleters are not counted: their
documentation lives on the definition they belong to.

Usage: python scripts/check_docstrings.py [--min 0.90] [--exclude PATH ...] [PACKAGE_DIR]
Prints ``covered/total (percent)`` and every undocumented definition as ``path:line name``;
exits 1 when the covered fraction is below ``--min``.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _public_module(relative: str) -> bool:
    parts = relative[:-len(".py")].split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return not any(part.startswith("_") for part in parts)


def _counted(node: ast.AST) -> bool:
    if node.name.startswith("_"):
        return False
    for decorator in getattr(node, "decorator_list", []):
        name = ast.unparse(decorator)
        if name in ("overload", "typing.overload") or name.endswith((".setter", ".deleter")):
            return False
    return True


def public_definitions(tree: ast.Module):
    """``(qualified name, line, has docstring)`` of every public definition of one module."""
    for node in tree.body:
        if not isinstance(node, _DEFINITIONS) or not _counted(node):
            continue
        yield node.name, node.lineno, ast.get_docstring(node) is not None
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, _DEFINITIONS) and _counted(member):
                    yield f"{node.name}.{member.name}", member.lineno, ast.get_docstring(member) is not None


def measure(root: str, exclude: tuple[str, ...] = ()) -> tuple[int, list[str]]:
    """``(covered, undocumented)`` over every public module below ``root``; ``exclude`` holds paths
    relative to ``root``'s parent (``shardkit/training/wds.py``) left out of the count."""
    covered, missing = 0, []
    base = os.path.dirname(os.path.abspath(root))
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.endswith(".py") or not _public_module(os.path.relpath(path, root)):
                continue
            shown = os.path.relpath(path, base)
            if shown in exclude:
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), filename=path)
            for qualname, line, documented in public_definitions(tree):
                if documented:
                    covered += 1
                else:
                    missing.append(f"{shown}:{line} {qualname}")
    return covered, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "shardkit"))
    parser.add_argument("--min", type=float, default=0.90, help="the least covered fraction (default 0.90)")
    parser.add_argument("--exclude", action="append", default=[], help="a module path to leave out, e.g. "
                        "shardkit/training/wds.py (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="print the figure only, not the list")
    args = parser.parse_args(argv)
    covered, missing = measure(os.path.normpath(args.root), tuple(os.path.normpath(p) for p in args.exclude))
    total = covered + len(missing)
    fraction = covered / total if total else 1.0
    if not args.quiet:
        for entry in missing:
            print(f"undocumented: {entry}")
    print(f"docstrings: {covered}/{total} public definitions ({fraction:.1%}), minimum {args.min:.0%}")
    return 0 if fraction >= args.min else 1


if __name__ == "__main__":
    sys.exit(main())
