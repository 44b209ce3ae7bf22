from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json, executor_options, jobs_option, json_option
from shardkit.cli import io_options


@click.command("index", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit index data/aishell/data.list -o aishell.index.jsonl --corpus aishell -j 8
  shardkit balance --corpus aishell=aishell.index.jsonl ... # later steps reuse the index
  shardkit index data.list -o all.jsonl --executor ray        # one Ray task per shard
  shardkit index data.list -o all.jsonl --split 2/3           # writes all.slice-2-of-3.jsonl
  cat all.slice-{{1,2,3}}-of-3.jsonl > all.jsonl                # = the index of one run
  shardkit index data/aishell/data.list -o aishell.parquet    # columnar: ~30 bytes an utterance
  shardkit index old.index.jsonl -o old.index.parquet         # rewrite a JSON lines index, no shard opened""")
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

    SHARDS are shard files, folders, globs or data.list files. Each row holds the shard, key,
    corpus, audio member name and format, bytes, sample_rate, channels, frames, duration, the
    transcript's length in characters and each member's [name, offset, size] (offset in the
    decompressed tar), so `plan` and `balance` need not read the shards again. Memory stays at one
    shard's records. If any shard cannot be read, no index is written and each failure is listed.
    """
    import os

    from tqdm import tqdm

    from shardkit.cli._figures import audio_length
    from shardkit.commands.index import build_index
    from shardkit.errors import UsageError
    from shardkit.io.inputs import expand_shards
    from shardkit.run.split import parse_split, select_slice

    if ray_address and executor != "ray":
        raise UsageError("--ray-address needs --executor ray")
    if len(shards) == 1 and shards[0].endswith(".jsonl") and output.endswith(".parquet"):
        _convert(shards[0], output, as_json, quiet)
    split_slice = parse_split(split) if split else None
    from shardkit.run.lifecycle import claim_output_file
    from shardkit.run.split import slice_path

    folder = os.path.dirname(os.path.abspath(output))
    folder_existed = os.path.isdir(folder)
    # the arguments themselves too: build_index sees only the shards a data.list names, not the list
    claim_output_file(slice_path(output, *split_slice) if split_slice else output, [s for s in shards if s != "-"])
    paths = expand_shards(list(shards))
    total = len(select_slice(paths, *split_slice) if split_slice else paths)
    bar = tqdm(total=total, unit="shard", file=sys.stderr, disable=quiet, dynamic_ncols=True, desc="index")
    state = {"utts": 0}

    def on_shard(shard, count, error):
        state["utts"] += count
        bar.update(1)
        bar.set_postfix_str(f"{state['utts']} utterances", refresh=False)
        if error:
            bar.write(f"failed: {error}", file=sys.stderr)

    report = build_index(paths, output, corpus, jobs=jobs or os.cpu_count() or 1, on_shard=on_shard,
                         executor=executor, ray_address=ray_address, split=split_slice)
    bar.close()
    if report.failures and not folder_existed:  # no empty folder that looks made
        try:
            os.rmdir(folder)
        except OSError:
            pass
    summary = report.summary()
    if as_json:
        emit_json(summary)
    if not quiet:
        if report.failures:
            from shardkit.cli._outcome import failure_line

            click.echo(failure_line("index", failed=[f["shard"] for f in report.failures], total=report.shards,
                                    args=list(shards), written="nothing", not_written=f"the index {output}",
                                    resumes=False),
                       err=True)
        else:
            click.echo(f"indexed {report.utterances} utterances ({audio_length(report.seconds)}) from "
                       f"{report.shards} shards into {report.path}", err=True)
    sys.exit(report.exit_code)


def _convert(src: str, output: str, as_json: bool, quiet: bool) -> None:
    """index IN.jsonl -o OUT.parquet: rewrite an index, no shard opened."""
    from tqdm import tqdm

    from shardkit.commands.index import convert_index_file

    bar = tqdm(unit="utt", unit_scale=True, file=sys.stderr, disable=quiet, dynamic_ncols=True, desc="convert")
    report = convert_index_file(src, output, on_rows=bar.update)
    bar.close()
    if as_json:
        emit_json({**report.summary(), "converted_from": src})
    if not quiet:
        click.echo(f"rewrote {report.utterances} utterances of {src} into {report.path}", err=True)
    sys.exit(0)
