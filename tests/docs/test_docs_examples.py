"""The examples in the docs and the README run, as printed, on the demo corpus.

A fenced ``bash`` or ``python`` block runs when the line before its fence is ``<!-- test: run -->``
(the marker does not show on the site or on GitHub). A page's blocks run in order in one folder: the
quick start page and README.md in an empty one (they make their own demo data), every other page in a
copy of the folder the quick start's blocks left (``demo/``, ``raw/NAME/``, ``data/train/``).
"""

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


def run_page(page, folder):
    for number, (language, code) in enumerate(runnable_blocks(page), 1):
        if language == "python" and re.search(r"^\s*(import|from) torch", code, re.M):
            pytest.importorskip("torch", reason=f"{page} block {number} needs the torch extra")
        done = run_block(language, code, folder)
        assert done.returncode == 0, (f"{page}, runnable block {number} ({language}) exited {done.returncode}:\n"
                                      f"{code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")


@pytest.fixture(scope="module")
def demo_workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quickstart")
    run_page("docs/quickstart.md", folder)
    return folder


def test_the_quick_starts_are_marked_runnable():
    assert {"docs/quickstart.md", "README.md"} <= set(PAGES)
    assert [language for language, _ in runnable_blocks("docs/quickstart.md")].count("python") >= 1


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_runnable_examples_of_a_page_run(page, demo_workspace, tmp_path):
    if page == "docs/quickstart.md":  # the fixture ran it: its blocks passed and it wrote the training list
        assert (demo_workspace / "data" / "train" / "data.list").read_text().count(".tar\n") >= 4
        return
    if page == "README.md" and runnable_blocks(page) == runnable_blocks("docs/quickstart.md")[:2]:
        return  # the README's quick starts are the quick start page's first two blocks, word for word: run there
    folder = tmp_path / "work"
    if page in SELF_CONTAINED:
        folder.mkdir()
    else:
        shutil.copytree(demo_workspace, folder, symlinks=True)
    run_page(page, folder)
