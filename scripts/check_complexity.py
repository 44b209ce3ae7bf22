"""The house's measurable rules, checked in CI (scripts/test.sh) so that they hold after every change.

Every rule is measured with radon (cyclomatic complexity, as `radon cc` reports it) or Python's ast:

- no function above complexity 30, outside the tar header parser (a module or package whose path
  says tar), whose fast path stays in one body for speed;
- no function in shardkit/cli/ above 10: the command line parses, calls one library function, formats;
- functions at radon grade C or worse (complexity 11 and up; functions, methods and classes, as
  `radon cc -n C` lists them) at most 3 per 1,000 lines of the package;
- no module above 800 lines, outside the tar parser;
- no function with more than 8 parameters outside cli/ (click options) and training/ (the public
  reader API): more belong in a settings or options value;
- no cli/ command module imports another (shared CLI helpers live in private cli/_*.py modules).

Usage: python scripts/check_complexity.py [--max 30] [PACKAGE_DIR]   (exit 1 naming each offender)
"""

from __future__ import annotations

import argparse
import ast
import os
import sys

from radon.complexity import cc_visit

CLI_MAX = 10
GRADE_C = 11
C_PER_THOUSAND_LINES = 3.0
MAX_MODULE_LINES = 800
MAX_PARAMETERS = 8


def _modules(root: str):
    """(path relative to root, source) of every module below root, in a stable order."""
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, root), f.read()


def _is_tar(relative: str) -> bool:
    return "tar" in relative.removesuffix(".py")


def _blocks(source: str):
    """Every function, method and class radon measures, once each (as `radon cc` lists them)."""
    seen = set()
    for block in cc_visit(source):
        for item in [block, *getattr(block, "methods", [])]:
            if (item.lineno, item.col_offset) not in seen:
                seen.add((item.lineno, item.col_offset))
                yield item


def offenders(root: str, limit: int) -> list[tuple[str, str, int]]:
    """(path, function, complexity) for every function above ``limit`` outside tar modules."""
    found = []
    for relative, source in _modules(root):
        if not _is_tar(relative):
            found += [(os.path.join(root, relative), item.fullname, item.complexity)
                      for item in _blocks(source) if item.complexity > limit]
    return sorted(found)


def cli_offenders(root: str) -> list[str]:
    return [f"{relative}: {item.fullname} has complexity {item.complexity} (> {CLI_MAX} in cli/)"
            for relative, source in _modules(root) if relative.startswith("cli" + os.sep)
            for item in _blocks(source) if item.complexity > CLI_MAX]


def grade_c_density(root: str) -> tuple[int, int]:
    """(functions at grade C or worse, lines) over the whole package."""
    count = lines = 0
    for _, source in _modules(root):
        lines += len(source.splitlines())
        count += sum(item.complexity >= GRADE_C for item in _blocks(source))
    return count, lines


def long_modules(root: str) -> list[str]:
    return [f"{relative}: {n} lines (> {MAX_MODULE_LINES})" for relative, source in _modules(root)
            if not _is_tar(relative) and (n := len(source.splitlines())) > MAX_MODULE_LINES]


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    named = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    return len([a for a in named if a not in ("self", "cls")]) + bool(args.vararg) + bool(args.kwarg)


def wide_functions(root: str) -> list[str]:
    found = []
    for relative, source in _modules(root):
        if relative.split(os.sep)[0] in ("cli", "training"):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _parameters(node) > MAX_PARAMETERS:
                found.append(f"{relative}:{node.lineno}: {node.name} takes {_parameters(node)} parameters "
                             f"(> {MAX_PARAMETERS})")
    return found


def cli_cross_imports(root: str) -> list[str]:
    """cli/ command modules (not cli/_*.py, not the package) that import another cli command module."""
    commands = {name[:-3] for name in os.listdir(os.path.join(root, "cli"))
                if name.endswith(".py") and not name.startswith("_")}
    found = []
    for relative, source in _modules(root):
        parts = relative.split(os.sep)
        if parts[0] != "cli" or len(parts) != 2 or parts[1].startswith("_"):
            continue
        for node in ast.walk(ast.parse(source)):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{relative}: imports {name}" for name in names
                      if name.startswith("shardkit.cli.") and name.split(".")[2] in commands]
            if isinstance(node, ast.ImportFrom) and node.module == "shardkit.cli":
                found += [f"{relative}: imports shardkit.cli.{a.name}" for a in node.names if a.name in commands]
    return found


def house_findings(root: str, limit: int = 30) -> list[str]:
    """Every broken rule of the module docstring, one line each; empty when the house holds."""
    findings = [f"{path}: {function} has cyclomatic complexity {complexity} (> {limit})"
                for path, function, complexity in offenders(root, limit)]
    findings += cli_offenders(root) + long_modules(root) + wide_functions(root) + cli_cross_imports(root)
    count, lines = grade_c_density(root)
    if count * 1000 > C_PER_THOUSAND_LINES * lines:
        findings.append(f"{count} functions at grade C or worse in {lines} lines: {count * 1000 / lines:.2f} per "
                        f"1,000 lines (> {C_PER_THOUSAND_LINES:g})")
    return findings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "shardkit"))
    parser.add_argument("--max", type=int, default=30)
    args = parser.parse_args()
    root = os.path.normpath(args.root)
    findings = house_findings(root, args.max)
    for line in findings:
        print(line, file=sys.stderr)
    if not findings:
        count, lines = grade_c_density(root)
        print(f"house: no function above {args.max} (tar parser aside), cli/ <= {CLI_MAX}, {count} at grade C+ "
              f"({count * 1000 / lines:.2f} per 1,000 lines), modules <= {MAX_MODULE_LINES} lines, "
              f"<= {MAX_PARAMETERS} parameters, no cli/ command imports another", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
