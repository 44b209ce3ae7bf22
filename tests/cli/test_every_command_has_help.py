"""Every command has help with an example, the README names every top-level command, and a usage error exits 2.

That the built documentation names every command and every long option is checked on the built site
(tests/docs/test_docs_site.py): the CLI reference there is generated from these commands.
"""

import os

import click
import pytest
from click.testing import CliRunner

from shardkit.cli import main
from support import REPO

README = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()


def all_commands():
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                yield [name, sub]
        else:
            yield [name]


COMMANDS = list(all_commands())


def test_the_expected_commands_exist():
    names = {" ".join(c) for c in COMMANDS}
    for expected in ("convert", "validate", "index", "plan", "balance", "bench", "make", "verify", "merge-reports",
                     "wenet enable-zstd", "wenet disable-zstd", "list check", "list rewrite", "list concat"):
        assert expected in names


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_help_ends_with_an_example(path):
    for flag in ("--help", "-h"):
        result = CliRunner().invoke(main, [*path, flag])
        assert result.exit_code == 0, result.output
        assert "Example" in result.output, f"{' '.join(path)} --help has no example"


@pytest.mark.parametrize("name", main.list_commands(click.Context(main)))
def test_readme_names_every_top_level_command(name):
    assert f"`shardkit {name}`" in README, f"README does not show `shardkit {name}`"


@pytest.mark.parametrize("path", [c for c in COMMANDS if c != ["demo"]], ids=lambda c: " ".join(c))
def test_unknown_option_is_a_usage_error(path):
    result = CliRunner().invoke(main, [*path, "--no-such-option"])
    assert result.exit_code == 2


def test_top_level_help_and_version():
    result = CliRunner().invoke(main, ["--help"])
    text = " ".join(result.output.split())  # click wraps the epilog
    assert result.exit_code == 0 and "Exit codes: 0 ok, 1 data problems, failed shards or a full disk, 2 usage " \
        "errors or an unusable output path, 3 the Ray cluster was lost (rerun to resume). Ctrl-C: 130, SIGTERM: " \
        "143 (a rerun resumes)." in text
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("shardkit, version ")
