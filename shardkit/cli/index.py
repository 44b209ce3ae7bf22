from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import executor_options, io_options, jobs_option, json_option, run_options
from shardkit.cli._progress import ProgressBars


@click.command("index", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit index data/aishell/data.list -o aishell.index.jsonl --corpus aishell -j 8
  shardkit balance --corpus aishell=aishell.index.jsonl ... # later steps reuse the index
  shardkit index data.list -o all.jsonl --executor ray        # one Ray task per shard
  shardkit index data.list -o all.jsonl --split 2/3           # writes all.slice-2-of-3.jsonl
  cat all.slice-{{1,2,3}}-of-3.jsonl > all.jsonl                # = the index of one run
  shardkit index data/aishell/data.list -o aishell.parquet    # columnar: ~30 bytes an utterance
  shardkit index old.index.jsonl -o old.index.parquet         # rewrite a JSON lines index, no shard opened
  shardkit index nemo/tarred_audio_manifest.json -o nemo.parquet   # a NeMo tarred dataset, text inline
  shardkit index shar_ds/shar -o shar.parquet                 # a Lhotse Shar folder""")
@click.argument("shards", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Index file to write: .parquet (columnar, needs pyarrow) or .jsonl (JSON lines).")
@click.option("--corpus", default=None, help="Corpus name for every utterance [default: each shard's folder name].")
@jobs_option
@executor_options("Index only slice I of N of the shard list (job arrays) into OUTPUT's slice, " "<stem>.slice-I-of-N.jsonl; the slices concatenated in order are the whole index.")
@io_options
@json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary on stderr.")
def command(shards, output, corpus, jobs, executor, ray_address, split, as_json, quiet):
    """Index the utterances of SHARDS: one row per utterance, from audio headers only.

    OUTPUT's suffix chooses the format: .parquet (typed columns, corpus and shard
    dictionary-encoded; what balance and plan read fastest) or .jsonl (one JSON line per
    utterance). Given one .jsonl index as SHARDS and a .parquet OUTPUT, the index is rewritten
    as Parquet, streaming, without opening a shard.

    SHARDS are shard files, folders, globs or data.list files; or NeMo tarred datasets (their
    manifest, audio_K.tar beside it) and Lhotse Shar folders, whose rows carry the transcript
    inline (text) and only the audio member in members; a manifest line no tar holds, a member
    no line names or a segment (offset) line is a failure. Each row holds the shard, key,
    corpus, audio member name and format, bytes, sample_rate, channels, frames, duration, the
    transcript's length in characters and each member's [name, offset, size] (offset in the
    decompressed tar), so `plan` and `balance` need not read the shards again. Memory stays at one
    shard's records. If any shard cannot be read, no index is written and each failure is listed.
    """
    from shardkit.commands.index import is_index_rewrite, run_index

    rewrite = is_index_rewrite(list(shards), output)  # (a rewrite reads no --split)
    with ProgressBars(quiet=quiet, min_total=0, running_total="utterances", scale_counters=True) as bars:
        options = run_options(jobs=jobs, executor=executor, ray_address=ray_address,
                              split=None if rewrite else split, on_event=bars)
        report = run_index(list(shards), output, corpus, options)
    if as_json:
        emit_json(report.summary())
    if not quiet:
        _print_outcome(report, list(shards), output)
    sys.exit(report.exit_code)


def _print_outcome(report, args: list[str], output: str) -> None:
    """The closing line on stderr: what was indexed (or rewritten), or what failed and was not written."""
    from shardkit.cli._figures import audio_length
    from shardkit.cli._outcome import failure_line

    if report.converted_from is not None:
        click.echo(f"rewrote {report.utterances} utterances of {report.converted_from} into {report.path}", err=True)
    elif report.failures:
        click.echo(failure_line("index", failed=[f["shard"] for f in report.failures], total=report.shards,
                                args=args, written="nothing", not_written=f"the index {output}", resumes=False),
                   err=True)
    else:
        click.echo(f"indexed {report.utterances} utterances ({audio_length(report.seconds)}) from "
                   f"{report.shards} shards into {report.path}", err=True)
