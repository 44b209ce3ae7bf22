"""The documentation site builds with warnings as errors, and it names every command and option.

The CLI reference is generated from the click commands (mkdocs-click) and the API page from
``shardkit._PUBLIC`` (docs/hooks.py), so these tests check the generated site, not the sources.
"""

import html
import importlib.util
import os
import re
import subprocess
import sys

import click
import pytest

from shardkit.cli import main
from support import REPO

DOCS_PACKAGES = ("mkdocs", "material", "mkdocs_click", "mkdocstrings", "mkdocstrings_handlers.python")
MISSING = [name for name in DOCS_PACKAGES if importlib.util.find_spec(name.split(".")[0]) is None
           or importlib.util.find_spec(name) is None]
needs_mkdocs = pytest.mark.skipif(bool(MISSING), reason=f"the docs extra is not installed (no {', '.join(MISSING)}): "
                                                        "pip install -e '.[docs]'; scripts/test.sh installs it")


def page_text(site, page):
    """The words of a built page, tags and entities gone (what a reader of the site sees)."""
    with open(os.path.join(site, page, "index.html"), encoding="utf-8") as f:
        inline_gone = re.sub(r"</?(?:code|em|strong|a|span)\b[^>]*>", "", f.read())
    return html.unescape(re.sub(r"<[^>]+>", " ", inline_gone))


def command_tree(command=main, path=("shardkit",)):
    """Every command and subcommand of the CLI, as (path, click command), the group itself first."""
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from command_tree(command.get_command(ctx, name), (*path, name))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f",
                            os.path.join(REPO, "mkdocs.yml"), "-d", str(out)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout}\n{build.stderr}"
    return str(out)


@needs_mkdocs
def test_the_site_builds_strictly_with_every_page_of_the_nav(site):
    for page in ("index.html", "quickstart/index.html", "reference/cli/index.html", "reference/api/index.html",
                 "guides/wenet/index.html", "guides/troubleshooting/index.html"):
        assert os.path.getsize(os.path.join(site, page)) > 0


@needs_mkdocs
def test_the_cli_reference_names_every_command_and_every_long_option(site):
    text = page_text(site, "reference/cli")
    missing = []
    for path, command in command_tree():
        if " ".join(path) not in text:
            missing.append(" ".join(path))
        for param in command.params:
            missing += [f"{' '.join(path)} {opt}" for opt in (*param.opts, *param.secondary_opts)
                        if opt.startswith("--") and opt not in text]
    assert len(list(command_tree())) > 15  # the walk reached the subcommands of list and wenet
    assert not missing, f"the built CLI reference does not name: {missing}"


@needs_mkdocs
def test_the_cli_reference_says_what_help_says(site):
    """Each paragraph of every command's help is on the page word for word (Markdown took nothing for a tag or
    emphasis); code marks aside, which the page renders as code."""
    text = " ".join(page_text(site, "reference/cli").split())
    differ = []
    for path, command in command_tree():
        for paragraph in (command.help or "").split("\n\n"):
            words = " ".join(paragraph.replace("\b", "").replace("`", "").split())
            if words not in text:
                differ.append(f"{' '.join(path)}: {words[:80]}")
    assert not differ, "the built CLI reference differs from --help in:\n" + "\n".join(differ)


@needs_mkdocs
def test_the_api_reference_documents_exactly_the_public_api(site):
    import shardkit

    with open(os.path.join(site, "reference", "api", "index.html"), encoding="utf-8") as f:
        page = f.read()
    documented = set(re.findall(r'<h2 id="([\w.]+)"', page))
    public = {f"{module}.{name}" for name, module in shardkit._PUBLIC.items()}
    assert public <= documented, f"not on the API page: {sorted(public - documented)}"
    assert documented == public, f"the API page documents more than shardkit._PUBLIC: {sorted(documented - public)}"
    for name in ("tarfile_to_samples", "WebDataset", "decode_audio", "audio_handler"):
        assert f'id="shardkit.training.wds.{name}"' in page


def manual_pages():
    """README.md and every Markdown page of docs/, as (path relative to the repository, text)."""
    paths = ["README.md"]
    for folder, _, names in os.walk(os.path.join(REPO, "docs")):
        paths += [os.path.relpath(os.path.join(folder, n), REPO) for n in names if n.endswith(".md")]
    for path in sorted(paths):
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            yield path, f.read()


def test_readme_is_a_front_door_of_at_most_300_lines():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move the detail to a page of docs/"
    assert "mkdocs serve" in "\n".join(lines)


# a repository path in a code span: `scripts/run.sh`, `benchmarks/results/`, `tests/io/test_x.py`
REPO_PATH = re.compile(r"`((?:scripts|benchmarks|tests|shardkit|docs|\.ci)/[\w./-]*)`")
GENERATED = {os.path.join("docs", "reference", "api.md")}  # made at build time by docs/hooks.py
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_manual_names_only_files_the_repository_holds():
    for page, text in manual_pages():
        for gone in ("PERFORMANCE.md", "WENET_FORMAT.md", "../shared"):
            assert gone not in text, f"{page} cites {gone}, which the repository does not hold"
        for path in REPO_PATH.findall(text):
            assert os.path.exists(os.path.join(REPO, path)), f"{page} names `{path}`, which the repository does not hold"
        for link in MARKDOWN_LINK.findall(text):
            if "://" in link or link.startswith("mailto:"):
                continue
            target = os.path.normpath(os.path.join(REPO, os.path.dirname(page), link))
            assert os.path.exists(target) or os.path.relpath(target, REPO) in GENERATED, f"{page} links {link}, which the repository does not hold"


def test_troubleshooting_names_every_error_family():
    """Each exception class of shardkit.errors appears on the troubleshooting page, by name or by its check."""
    import inspect

    from shardkit import errors

    with open(os.path.join(REPO, "docs", "guides", "troubleshooting.md"), encoding="utf-8") as f:
        page = f.read()
    families = [c for _, c in inspect.getmembers(errors, inspect.isclass)
                if issubclass(c, errors.ShardkitError) and c.__module__ == errors.__name__]
    assert len(families) > 10
    missing = [c.__name__ for c in families if f"`{c.__name__}`" not in page and f"`{c.check}`" not in page]
    assert not missing, f"docs/guides/troubleshooting.md says nothing of {missing}"
