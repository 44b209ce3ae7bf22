from __future__ import annotations

import click

from shardkit.cli import CONTEXT_SETTINGS, emit_json
from shardkit.cli._options import json_option


@click.command("demo", context_settings=CONTEXT_SETTINGS, epilog="""Exit codes: 0 ok, 2 usage errors.

\b
Examples:
  shardkit demo -o exp/demo/kaldi                  # ~15 minutes of audio in three corpora
  shardkit demo -o /tmp/tiny --minutes 0.3 --faults
  shardkit demo -o d > corpora.txt && shardkit make --wav-scp d/aishell/wav.scp --text d/aishell/text -o s""")
@click.option("-o", "--out-dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=15.0, show_default=True,
              help="Minutes of audio in all three corpora together (each gets at least 2 utterances).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic audio and text.")
@click.option("--faults", is_flag=True, help="Plant one 8 kHz and one stereo utterance in the first corpus.")
@json_option
def command(out_dir, minutes, seed, faults, as_json):
    """Write a demo mix of three synthetic corpora as Kaldi data directories under OUT_DIR.

    aishell: short Mandarin-like utterances, WAV files; librispeech: long English-like
    utterances, FLAC files; accented: mixed lengths and languages, long WAV recordings cut by a
    segments file. Each OUT_DIR/NAME holds wav.scp, text (and segments) with absolute paths.
    Prints NAME=DIR per corpus on stdout (or one JSON report with --json).
    """
    from shardkit.commands.demo import run_demo

    report = run_demo(out_dir, minutes=minutes, seed=seed, faults=faults)
    if as_json:
        emit_json(report)
        return
    for c in report["corpora"]:
        click.echo(f"{c['name']}={c['dir']}")
        click.echo(f"{c['name']}: {c['utterances']} utterances, {c['seconds'] / 60:.1f} min of "
                   f"{c['audio_format'].upper()}{' recordings with segments' if c['segments'] else ''}", err=True)
