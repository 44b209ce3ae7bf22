"""Helpers the tests share, defined once (fixtures live in the conftest.py files beside the tests).

The tests folder mirrors the package (tests/io, tests/run, tests/commands/balance, ...); the root
conftest.py puts this folder on sys.path, so every test module imports these as ``from support import ...``.
"""

from __future__ import annotations

import os
from http.server import SimpleHTTPRequestHandler

from click.testing import CliRunner, Result

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)


def run_cli(*args) -> Result:
    """``shardkit ARGS...`` in this process (click's runner), every argument turned into a string."""
    from shardkit.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def read_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def folder_bytes(folder, *, skip=lambda relative: False) -> dict[str, bytes]:
    """Every file below ``folder`` by its path relative to it (``skip(relative)``: leave it out)."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder)
            if not skip(relative):
                found[relative] = read_bytes(path)
    return found


class QuietHTTPHandler(SimpleHTTPRequestHandler):
    """A loopback test server's handler that logs nothing to stderr."""

    def log_message(self, *args):
        pass
