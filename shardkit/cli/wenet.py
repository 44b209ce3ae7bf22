from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import json_option

_TARGET_HELP = ("site-packages folder to write the hook into [default: the running interpreter's, i.e. the "
                "active environment's].")


@click.group("wenet", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Example (in the training environment, once):
  pip install backports.zstd && shardkit wenet enable-zstd""")
def command():
    """Make WeNet's training environment read shardkit's .tar.zst shards (Python 3.10-3.13).

    WeNet opens every shard with tarfile.open(fileobj=f, mode="r:*"), which reads zstd only
    from Python 3.14 on; before that a .tar.zst shard is logged and skipped whole. Plain .tar
    shards need nothing.
    """


def _line(text: str) -> None:
    click.echo(text, err=True)


@command.command("enable-zstd", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit wenet enable-zstd                      # the active environment (run with its python)
  shardkit wenet enable-zstd --target /opt/conda/envs/wenet/lib/python3.11/site-packages""")
@click.option("--target", type=click.Path(file_okay=False), default=None, help=_TARGET_HELP)
@json_option
def enable_zstd(target, as_json):
    """Install a .pth hook so that tarfile (modes r:*, r|*, r:zst, r|zst) reads zstd tar.

    Writes TARGET/shardkit_zstd_tarfile.pth, whose one import line runs at interpreter start and
    adds Python 3.14's zstd support to tarfile when tarfile is imported (through backports.zstd,
    which must be installed). Nothing else about tarfile changes. Then checks, in a fresh
    interpreter, that tarfile.open(fileobj=..., mode="r:*") opens a .tar.zst. On Python 3.14+
    nothing is written. Running it again changes nothing.
    """
    from shardkit.training.zstd_hook import enable_zstd as run

    result = run(target)
    if as_json:
        emit_json(result)
    if result["action"] == "native":
        _line(f"Python {result['python']} reads .tar.zst natively (tarfile mode r:*); nothing to install.")
        sys.exit(0)
    verb = "wrote" if result["action"] == "written" else "already present, unchanged:"
    _line(f"{verb} {result['pth']} (backports.zstd {result['backports_zstd']}, Python {result['python']})")
    probe = result["probe"]
    if probe["reads_zstd"]:
        where = "at every start of" if probe["target_is_site_dir"] else "where the folder is a site dir of"
        _line(f"checked: tarfile.open(fileobj=..., mode='r:*') reads .tar.zst {where} {result['executable']}")
        sys.exit(0)
    _line(f"Error: the hook is written but a fresh interpreter still cannot read .tar.zst ({probe['error']})")
    sys.exit(1)


@command.command("disable-zstd", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Example:
  shardkit wenet disable-zstd""")
@click.option("--target", type=click.Path(file_okay=False), default=None, help=_TARGET_HELP)
@json_option
def disable_zstd(target, as_json):
    """Remove the hook that enable-zstd installed (a file not written by shardkit is left alone)."""
    from shardkit.training.zstd_hook import disable_zstd as run

    result = run(target)
    if as_json:
        emit_json(result)
    _line(f"removed {result['pth']}" if result["action"] == "removed" else f"no hook installed ({result['pth']})")


@command.command("status", context_settings=CONTEXT_SETTINGS, epilog="""Exit codes: 0 tarfile reads zstd in this \
environment, 1 it does not, 2 usage errors.

\b
Example:
  shardkit wenet status || shardkit wenet enable-zstd""")
@click.option("--target", type=click.Path(file_okay=False), default=None, help=_TARGET_HELP)
@json_option
def status(target, as_json):
    """Say whether WeNet's tarfile call reads .tar.zst here (asks a fresh interpreter)."""
    from shardkit.training.zstd_hook import zstd_status

    result = zstd_status(target)
    if as_json:
        emit_json(result)
    else:
        hook = ("installed" if result["current"] else "installed, but not the current version (rerun enable-zstd)") \
            if result["installed"] else "not installed"
        _line(f"python:          {result['python']} ({result['executable']})")
        _line(f"native zstd:     {'yes (3.14+)' if result['native'] else 'no (tarfile reads zstd from 3.14 on)'}")
        _line(f"hook:            {result['pth']}: {hook}")
        _line(f"backports.zstd:  {result['backports_zstd'] or 'not installed'}")
        probe = result["probe"]
        verdict = "yes" if probe["reads_zstd"] else f"no ({probe['error']})"
        if probe["reads_zstd"] and not probe["target_is_site_dir"]:
            verdict += " (when the folder is processed as a site dir)"
        _line(f"reads .tar.zst:  {verdict}")
    sys.exit(0 if result["reads_zstd"] else 1)
