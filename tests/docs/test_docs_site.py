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
        return html.unescape(re.sub(r"<[^>]+>", " ", f.read()))


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
