"""The examples in the docs and the README run, as printed, on the demo corpus.

A fenced ``bash`` or ``python`` block runs when the line before its fence is ``<!-- test: run -->``
(the marker does not show on the site or on GitHub). A page's blocks run in order in one folder: the
quick start page and README.md in an empty one (they make their own demo data), every other page in a
copy of the folder the quick start's blocks left (``demo/``, ``raw/NAME/``, ``data/train/``).
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from support import REPO

MARKER = "<!-- test: run -->"
BLOCK = re.compile(r"^" + re.escape(MARKER) + r"\n```(bash|python)\n(.*?)^```$", re.M | re.S)
SELF_CONTAINED = ("docs/quickstart.md", "README.md")  # start in an empty folder


def pages():
    found = ["README.md"]
    for folder, _, names in os.walk(os.path.join(REPO, "docs")):
        found += [os.path.relpath(os.path.join(folder, n), REPO) for n in sorted(names) if n.endswith(".md")]
    return sorted(found)


def runnable_blocks(page):
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        text = f.read()
    markers = len(re.findall("^" + re.escape(MARKER) + "$", text, re.M))
    assert markers == len(BLOCK.findall(text)), f"{page}: a {MARKER} line that is not right before a fence"
    return BLOCK.findall(text)


PAGES = [p for p in pages() if runnable_blocks(p)]


def run_block(language, code, folder):
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def missing_extra(code):
    """The first module a Python block imports that is not installed (an extra: torch, webdataset, ...)."""
    for module in sorted(set(re.findall(r"^\s*(?:import|from)\s+(\w+)", code, re.M)) - {"shardkit"}):
        if importlib.util.find_spec(module) is None:
            return module
    return None


def run_page(page, folder):
    """Run the page's blocks in order; returns what was left out for want of an extra."""
    left_out = []
    for number, (language, code) in enumerate(runnable_blocks(page), 1):
        module = missing_extra(code) if language == "python" else None
        if module:
            left_out.append(f"{page} block {number} imports {module}, which is not installed")
            continue
        done = run_block(language, code, folder)
        assert done.returncode == 0, (f"{page}, runnable block {number} ({language}) exited {done.returncode}:\n"
                                      f"{code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")
    return left_out


@pytest.fixture(scope="module")
def demo_workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quickstart")
    return folder, run_page("docs/quickstart.md", folder)


def test_the_quick_starts_are_marked_runnable():
    assert {"docs/quickstart.md", "README.md"} <= set(PAGES)
    assert [language for language, _ in runnable_blocks("docs/quickstart.md")].count("python") >= 1


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_runnable_examples_of_a_page_run(page, demo_workspace, tmp_path):
    demo_folder, quickstart_left_out = demo_workspace
    # the fixture ran the quick start page; the README's quick starts are its first two blocks, word for word
    if page == "docs/quickstart.md" or (page == "README.md"
                                        and runnable_blocks(page) == runnable_blocks("docs/quickstart.md")[:2]):
        assert (demo_folder / "data" / "train" / "data.list").read_text().count(".tar\n") >= 4
        if quickstart_left_out:
            pytest.skip("; ".join(quickstart_left_out))
        return
    folder = tmp_path / "work"
    if page in SELF_CONTAINED:
        folder.mkdir()
    else:
        shutil.copytree(demo_folder, folder, symlinks=True)
    left_out = run_page(page, folder)
    if left_out:
        pytest.skip("; ".join(left_out))
