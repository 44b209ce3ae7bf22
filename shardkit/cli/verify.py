from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import io_options, json_option


@click.command("verify", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit verify data/flac                      # against the sources recorded in convert.json
  shardkit verify data/flac --against old/bz2/   # sources moved: match them by shard name""")
@click.argument("out_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--against", "against", multiple=True, help="Source shards, folders or lists (repeatable).")
@io_options
@json_option
def command(out_dir, against, as_json):
    """Prove that a convert OUT_DIR still holds exactly what its sources hold.

    Members kept byte for byte must be equal; audio transcoded to FLAC/WAV must decode to the
    source's samples and to the digests recorded in OUT_DIR/convert.json.
    """
    from shardkit.commands.verify import run_verify

    report = run_verify(out_dir, list(against) or None)
    if as_json:
        emit_json(report)
    for problem in report["problems"]:
        key = f"key {problem['key']!r}: " if problem.get("key") is not None else ""
        click.echo(f"{problem['shard']}: {key}{problem['reason']}", err=True)
    click.echo(f"verified {report['shards']} shards, {report['members']} members: "
               f"{'all match' if report['ok'] else str(len(report['problems'])) + ' problems'}", err=True)
    sys.exit(0 if report["ok"] else 1)
