from __future__ import annotations

import sys

import click

from . import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json, jobs_option, json_option


@click.command("index", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit index data/aishell/data.list -o aishell.index.jsonl --corpus aishell -j 8
  shardkit balance --corpus aishell=aishell.index.jsonl ... # later steps reuse the index""")
@click.argument("shards", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Index file to write (.jsonl).")
@click.option("--corpus", default=None, help="Corpus name for every utterance [default: each shard's folder name].")
@jobs_option
@json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary on stderr.")
def command(shards, output, corpus, jobs, as_json, quiet):
    """Index the utterances of SHARDS: one JSON line per utterance, from audio headers only.

    SHARDS are shard files, folders, globs or data.list files. Each line holds the shard, key,
    corpus, audio member name and format, bytes, sample_rate, channels, frames, duration, the
    transcript's length in characters and each member's [name, offset, size] (offset in the
    decompressed tar), so `plan` and `balance` need not read the shards again. Memory stays at one
    shard's records. If any shard cannot be read, no index is written and each failure is listed.
    """
    import os

    from tqdm import tqdm

    from ..index import build_index
    from ..inputs import expand_shards
    from .plan import audio_length

    paths = expand_shards(list(shards))
    bar = tqdm(total=len(paths), unit="shard", file=sys.stderr, disable=quiet, dynamic_ncols=True, desc="index")
    state = {"utts": 0}

    def on_shard(shard, count, error):
        state["utts"] += count
        bar.update(1)
        bar.set_postfix_str(f"{state['utts']} utterances", refresh=False)
        if error:
            bar.write(f"failed: {error}", file=sys.stderr)

    report = build_index(paths, output, corpus, jobs=jobs or os.cpu_count() or 1, on_shard=on_shard)
    bar.close()
    summary = report.summary()
    if as_json:
        emit_json(summary)
    if not quiet:
        if report.failures:
            click.echo(f"{len(report.failures)} of {report.shards} shards failed; no index written", err=True)
        else:
            click.echo(f"indexed {report.utterances} utterances ({audio_length(report.seconds)}) from "
                       f"{report.shards} shards into {report.path}", err=True)
    sys.exit(report.exit_code)
