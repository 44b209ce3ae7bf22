"""Fail when a function in shardkit is above cyclomatic complexity 30 (radon), except in the tar
header parser, whose fast path stays in one body for speed (a module or package whose path says tar).

Usage: python scripts/check_complexity.py [--max 30] [PACKAGE_DIR]   (exit 1 naming each offender)
"""

from __future__ import annotations

import argparse
import os
import sys

from radon.complexity import cc_visit


def offenders(root: str, limit: int) -> list[tuple[str, str, int]]:
    """(path, function, complexity) for every function above ``limit`` outside tar modules."""
    found = []
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.endswith(".py") or "tar" in os.path.relpath(path, root).removesuffix(".py"):
                continue  # the tar parser (io/tar.py) may keep its fast path in one body
            with open(path, encoding="utf-8") as f:
                blocks = cc_visit(f.read())
            for block in blocks:
                for item in [block, *getattr(block, "methods", [])]:
                    if item.complexity > limit:
                        found.append((path, item.fullname, item.complexity))
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "shardkit"))
    parser.add_argument("--max", type=int, default=30)
    args = parser.parse_args()
    bad = offenders(os.path.normpath(args.root), args.max)
    for path, function, complexity in bad:
        print(f"{path}: {function} has cyclomatic complexity {complexity} (> {args.max})", file=sys.stderr)
    if not bad:
        print(f"complexity: no function above {args.max} outside the tar parser", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
