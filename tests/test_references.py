"""Nothing in the repository cites a file the repository does not hold.

A reader who clones the repository must be able to follow every reference in it: no documents that
lived beside a developer's checkout (the shared notes, machine paths), no markdown link to a missing
page, no repository path (``benchmarks/results/x.md``, ``scripts/y.sh``, ``shardkit/z.py``) that is
not there. Scanned: every tracked text file. This file is the one place that names the forbidden
documents, to forbid them.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the checks themselves name what they forbid: this file, and the docs tests' check of the manual
CHECKERS = {os.path.relpath(os.path.abspath(__file__), ROOT), "tests/docs/test_docs_site.py"}

# documents and places outside the repository that code, tests and notes used to cite
FORBIDDEN = (
    (re.compile(r"PERFORMANCE\.md"), "the shared PERFORMANCE.md (the figures are in docs/performance.md)"),
    (re.compile(r"WENET_FORMAT\.md"), "the shared WENET_FORMAT.md (now docs/reference/wenet-format.md)"),
    (re.compile(r"\.\./shared\b"), "the ../shared folder beside a developer's checkout"),
    (re.compile(r"(?<![\w.~$])/work/"), "a path on a developer's machine"),
)
MARKDOWN_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTENSIONS = "py|md|sh|json|yml|yaml|toml|txt|cfg|ini|png|svg"


def tracked_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [name for name in listed.decode().split("\0") if name and os.path.isfile(os.path.join(ROOT, name))]


def read_text(name: str) -> str | None:
    with open(os.path.join(ROOT, name), "rb") as handle:
        data = handle.read()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def repo_path_patterns(files: list[str]) -> tuple[re.Pattern, re.Pattern]:
    """(a path with an extension under a top-level folder, anywhere in text; a code span that is a
    path under a top-level folder, with or without an extension). Only paths that start with one of
    the repository's own top-level folders count, so output names (``data.list``, ``out/bench.md``)
    and other projects' paths (``wenet/dataset/processor.py``) are not taken for references."""
    folders = sorted({name.split("/", 1)[0] for name in files if "/" in name})
    alternatives = "|".join(re.escape(folder) for folder in folders)
    bare = re.compile(rf"(?<![\w./$~-])((?:{alternatives})/[\w./-]*?\w\.(?:{EXTENSIONS}))(?![\w/-])")
    spans = re.compile(rf"(?<![\w`])`((?:{alternatives})(?:/[\w.-]+)+)/?`")
    return bare, spans


def is_placeholder(path: str) -> bool:
    """``shardkit/commands/NAME.py``, ``tests/commands/<cmd>``: a pattern for many files, not a file."""
    return any(re.fullmatch(r"[A-Z][A-Z0-9_]*|<\w+>", part.split(".")[0]) for part in path.split("/"))


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def problems_in(name: str, text: str, bare: re.Pattern, spans: re.Pattern, exists) -> list[str]:
    found = []
    for pattern, why in FORBIDDEN:
        for match in pattern.finditer(text):
            found.append(f"{name}:{line_of(text, match.start())}: {match.group(0)!r}: {why}")
    missing = set()
    for pattern in (bare, spans):
        for match in pattern.finditer(text):
            path = match.group(1).rstrip(".")
            if not exists(path) and not is_placeholder(path):
                missing.add((line_of(text, match.start()), path))
    found += [f"{name}:{line}: {path} is not in the repository" for line, path in sorted(missing)]
    if name.endswith(".md"):
        found += link_problems(name, text, exists)
    return found


def link_problems(name: str, text: str, exists) -> list[str]:
    found = []
    here = os.path.dirname(name)
    for match in MARKDOWN_LINK.finditer(text):
        target = match.group(1).split("#", 1)[0].split("?", 1)[0]
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("/"):
            continue  # an anchor on the same page, a URL, or a site-absolute path
        resolved = os.path.normpath(os.path.join(here, target))
        where = f"{name}:{line_of(text, match.start())}"
        if resolved.startswith(".."):
            found.append(f"{where}: link {target} leaves the repository")
        elif not exists(resolved):
            found.append(f"{where}: link {target} -> {resolved} is not in the repository")
        elif name.startswith("docs/") and not resolved.startswith("docs/"):
            found.append(f"{where}: link {target} leaves docs/ (the site cannot follow it; use a code span)")
    return found


def site_pages() -> set[str]:
    """The pages of the documentation site (mkdocs.yml's nav), generated ones included: a link to
    one is followed by the site's strict build, which makes the generated pages."""
    path = os.path.join(ROOT, "mkdocs.yml")
    if not os.path.exists(path):
        return set()
    import yaml

    with open(path, encoding="utf-8") as handle:
        nav = (yaml.safe_load(handle) or {}).get("nav") or []
    pages, todo = set(), [nav]
    while todo:
        item = todo.pop()
        if isinstance(item, str) and item.endswith(".md"):
            pages.add("docs/" + item)
        elif isinstance(item, dict):
            todo += list(item.values())
        elif isinstance(item, list):
            todo += item
    return pages


def make_exists(files: list[str], pages: frozenset[str] = frozenset()):
    held = set(files) | set(pages)
    folders = {os.path.dirname(name) for name in files}
    folders |= {"/".join(folder.split("/")[:i]) for folder in list(folders) for i in range(1, folder.count("/") + 1)}
    return lambda path: path.rstrip("/") in held or path.rstrip("/") in folders


def test_no_tracked_file_cites_what_the_repository_does_not_hold():
    files = tracked_files()
    exists = make_exists(files, frozenset(site_pages()))
    bare, spans = repo_path_patterns(files)
    problems = []
    for name in files:
        if name in CHECKERS:
            continue
        text = read_text(name)
        if text is not None:
            problems += problems_in(name, text, bare, spans, exists)
    assert not problems, "references to files the repository does not hold:\n" + "\n".join(problems)


def test_the_check_finds_each_kind_and_passes_what_is_there():
    files = ["benchmarks/results/convert.md", "scripts/run.sh", "shardkit/io/tar.py", "docs/performance.md",
             "docs/reference/wenet-format.md", "README.md"]
    exists = make_exists(files)
    bare, spans = repo_path_patterns(files)
    forbidden = "see ../shared/" + "WENET_FORMAT.md and " + "PERFORMANCE.md, or /work/" + "main/.venv\n"
    missing = ("as `benchmarks/results/gone.md` says; scripts/old.sh runs it; shardkit/io/gone.py\n"
               "[page](missing.md) [up](../../outside.md) [perf](../README.md)\n")
    fine = ("`benchmarks/results/convert.md`, scripts/run.sh, `shardkit/io/tar.py`, `benchmarks/results/`, "
            "`data.list`, out/bench.md, `wenet/dataset/processor.py`, /tmp/x/scripts/y.sh, "
            "`benchmarks/results/*.md`, `shardkit/commands/NAME.py`, [perf](performance.md), "
            "[site](https://example.org/x.md), [top](#perf)\n")
    assert problems_in("docs/reference/x.md", fine.replace("performance.md)", "../performance.md)"), bare, spans,
                       exists) == []
    found = problems_in("docs/x.md", forbidden + missing, bare, spans, exists)
    assert len([p for p in found if "../shared" in p]) == 1
    assert len([p for p in found if "WENET_FORMAT" in p]) == 1 and len([p for p in found if "PERFORMANCE" in p]) == 1
    assert len([p for p in found if "developer's machine" in p]) == 1
    for path in ("benchmarks/results/gone.md", "scripts/old.sh", "shardkit/io/gone.py", "-> docs/missing.md"):
        assert any(path in p for p in found), (path, found)
    assert any("../../outside.md" in p and "leaves the repository" in p for p in found)
    assert any("../README.md" in p and "leaves docs/" in p for p in found)
    assert len(found) == 10, found
