from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import executor_options, io_options, jobs_option, json_option, run_options
from shardkit.cli._outcome import codec_option

FROM_CHOICES = ["kaldi", "wenet-raw", "nemo", "lhotse", "parquet", "wds", "shar", "nemo-tarred"]


def _allow_pipe_inputs(value: bool) -> bool:
    from shardkit.io.remote import configure_io

    configure_io(allow_pipes=value)  # pipe:CMD inputs (wds tars) follow make's one --allow-pipes
    return value


@click.command("make", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit make --wav-scp data/train/wav.scp --text data/train/text -o shards/train
  shardkit make data/train -o shards/train --audio-format flac        # a Kaldi data directory
  shardkit make --wav-scp d/wav.scp --text d/text --segments d/segments -o out --audio-format flac
  shardkit make --wav-scp d/wav.scp --text d/text -o out --utts-per-shard 1000 --codec zst:3
  shardkit make --wav-scp d/wav.scp --text d/text -o s3://bucket/shards --executor ray
  shardkit make --wav-scp d/wav.scp --text d/text -o /shared/out --split $SLURM_ARRAY_TASK_ID/4
  shardkit merge-reports /shared/out --command make       # after all 4 slices: make.json, data.list
  shardkit make --from wenet-raw data.list -o out
  shardkit make train_manifest.json -o out                              # NeMo, recognised by its fields
  shardkit make --from lhotse cuts_train.jsonl.gz -o out --channel 0
  shardkit make --from lhotse recordings.jsonl.gz supervisions.jsonl.gz -o out
  shardkit make --from parquet data/train/ -o out --text-field sentence
  shardkit make --from wds 'shards/train-000000.tar' shards/train-000001.tar -o out --audio-format keep
  shardkit make shar_ds/shar -o out --audio-format keep               # a Lhotse Shar folder, recognised
  shardkit make nemo_ds/tarred_audio_manifest.json -o out --audio-format keep   # NeMo tarred, audio_K.tar beside""")
@click.argument("source", nargs=-1, type=click.Path())
@click.option("--from", "source_format", type=click.Choice(FROM_CHOICES), default=None,
              help="Format of SOURCE [default: recognised from SOURCE: a folder with wav.scp and text, .parquet, "
                   "tars, or a JSON-lines manifest's fields].")
@click.option("--wav-scp", type=click.Path(dir_okay=False), default=None,
              help="Kaldi wav.scp: 'key path' per line ('key command |' only with --allow-pipes).")
@click.option("--text", type=click.Path(dir_okay=False), default=None, help="Kaldi text: 'key transcript' per line.")
@click.option("--segments", type=click.Path(dir_okay=False), default=None,
              help="Kaldi segments: 'utt recording start end' (seconds; end -1 = to the end).")
@click.option("--key-field", default=None, metavar="NAME",
              help="Field or column holding the key (nemo: none, the key is the audio file's stem; parquet: id; "
                   "wenet-raw: key).")
@click.option("--text-field", default=None, metavar="NAME",
              help="Field or column holding the transcript (wds .json and parquet: text; nemo: text; wenet-raw: txt).")
@click.option("--audio-field", default=None, metavar="NAME",
              help="Field or column naming the audio (parquet: audio; nemo: audio_filepath; wenet-raw: wav).")
@click.option("--channel", type=click.IntRange(min=0), default=None,
              help="Take this channel of multi-channel audio (cut out and re-encoded) [default: lhotse: the "
                   "supervision's channel; others: every channel].")
@click.option("-o", "--out-dir", required=True, type=click.Path(file_okay=False),
              help="Output folder, or a URL (s3://, gs://, ...: any fsspec store).")
@click.option("--shard-duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds of audio per shard: shards of about equal duration, cut in transcript order "
                   "[default: 3600].")
@click.option("--utts-per-shard", type=click.IntRange(min=1), default=None,
              help="Utterances per shard instead (WeNet's rule: fixed count, the last shard shorter).")
@codec_option("none", "Shard compression")
@click.option("--audio-format", type=click.Choice(["keep", "wav", "flac"]), default=None,
              help="keep: source bytes untouched; wav/flac: decode and re-encode as 16-bit PCM, clipping at full "
                   "scale [default: keep, or wav with segments, a channel choice or --resample].")
@click.option("--resample", type=click.IntRange(min=1), default=None, metavar="HZ",
              help="Convert every utterance to this sample rate (soxr, high quality).")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Read every written shard back (names, sizes and the sha256 of its tar stream) before naming it.")
@click.option("--allow-pipes", is_flag=True, callback=lambda ctx, param, value: _allow_pipe_inputs(value),
              help="Run 'command |' entries of wav.scp (and Lhotse command sources) with sh and read their output; "
                   "also `pipe:CMD` inputs (or SHARDKIT_ALLOW_PIPES=1).")
@jobs_option
@executor_options("Write only slice I of N of the planned shards (job arrays; every slice plans the same shards); "
                  "writes make.slice-I-of-N.json and data.slice-I-of-N.list; join with `shardkit merge-reports`.")
@click.option("--overwrite", is_flag=True, help="Redo every shard, even those a previous run finished.")
@io_options(pipes=False)
@json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary on stderr.")
def command(source, source_format, wav_scp, text, segments, key_field, text_field, audio_field, channel, out_dir,
            shard_duration, utts_per_shard, codec, audio_format, resample, verify, allow_pipes, jobs, executor, ray_address,
            split, overwrite, as_json, quiet):
    """Pack speech data into WeNet-style shards: a Kaldi data directory, a WeNet raw data.list, a NeMo
    or Lhotse manifest, Parquet files, WebDataset tars, a Lhotse Shar folder or a NeMo tarred dataset's
    manifest (SOURCE, format by --from or recognised).

    Each utterance becomes <key>.txt then <key>.<wav|flac|...>, adjacent, in source order.
    Shards hold about --shard-duration seconds each (durations from the manifest or the audio
    headers, never a full decode), or --utts-per-shard utterances. Writes
    OUT_DIR/shards_NNNNNNNNN.tar[.zst], OUT_DIR/data.list (data.partial.list when a shard failed) and
    OUT_DIR/make.json. Entries without
    audio or transcript, with missing, unreadable or too short audio, or a repeated key are
    skipped, named in make.json, and make the exit code 1. Keys keep '/'; a '.' (which
    WebDataset and WeNet split at differently) becomes '_', recorded in make.json's key_map.
    Writes go to a temporary name, are fsynced, read back and renamed; a rerun skips finished
    shards, and a second run into the same OUT_DIR while one runs is refused.
    """

    from shardkit.cli._progress import ProgressBars
    from shardkit.commands.make.settings import MakeSettings
    from shardkit.commands.make.source import check_field_options, resolve_source, run_make_source
    from shardkit.commands.make.sources import SourceOptions
    from shardkit.io.codecs import parse_codec_spec

    _, shard_duration = _check_run_options(ray_address, executor, split, shard_duration, utts_per_shard)
    codec_name, level = parse_codec_spec(codec)
    src = resolve_source(source, source_format, wav_scp, text, segments)
    fields = SourceOptions(key_field=key_field, text_field=text_field, audio_field=audio_field, channel=channel,
                           allow_pipes=allow_pipes)
    audio_format = check_field_options(src, fields, audio_format, resample)
    settings = MakeSettings(codec=codec_name, level=level, audio_format=audio_format, resample=resample,
                            shard_duration=shard_duration, utts_per_shard=utts_per_shard, allow_pipes=allow_pipes,
                            verify=verify)
    with ProgressBars(quiet=quiet) as bars:
        options = run_options(jobs=jobs, executor=executor, ray_address=ray_address, split=split,
                              overwrite=overwrite, on_event=bars)
        report = run_make_source(src, out_dir, settings, options, source_options=fields)
    _print_summary(report.summary(), as_json=as_json, quiet=quiet, codec=codec_name, args=list(source))
    sys.exit(report.exit_code)


def _check_run_options(ray_address: str | None, executor: str, split: str | None, shard_duration: float | None,
                       utts_per_shard: int | None) -> tuple[tuple[int, int] | None, float | None]:
    """Options that must agree before anything is read: the executor, the slice and one shard size
    rule; returns the parsed slice and the shard duration (the default when neither rule is given)."""
    from shardkit.commands.make.settings import DEFAULT_SHARD_SECONDS
    from shardkit.errors import UsageError
    from shardkit.run.split import parse_split

    if ray_address and executor != "ray":
        raise UsageError("--ray-address needs --executor ray")
    split_slice = parse_split(split) if split else None
    if shard_duration is not None and utts_per_shard is not None:
        raise UsageError("give --shard-duration or --utts-per-shard, not both")
    if shard_duration is None and utts_per_shard is None:
        shard_duration = DEFAULT_SHARD_SECONDS
    return split_slice, shard_duration


def _print_summary(summary: dict, *, as_json: bool, quiet: bool, codec: str = "none",
                   args: list[str] = ()) -> None:
    """The summary: JSON on stdout with --json; unless --quiet, the first 20 skipped utterances and
    one line of totals on stderr (make.json names them all); after a failed shard, the last line says
    what was and was not written and what to run next."""
    from shardkit.cli._outcome import failure_line, shards, zstd_note

    note = zstd_note(codec)
    if note:
        summary["zstd"] = note
    if as_json:
        emit_json(summary)
    if not quiet:
        for item in summary["findings"][:20]:
            click.echo(f"skipped {item['key']}: {item['reason']} [{item['check']}]", err=True)
        if len(summary["findings"]) > 20:
            click.echo(f"... and {len(summary['findings']) - 20} more (all in {summary['manifest']})", err=True)
        click.echo(f"made {summary['shards']} shards ({summary['shard_status']['skipped']} already done): "
                   f"{summary['utterances']} utterances, {summary['audio_seconds'] / 3600:.2f} h of audio, "
                   f"{summary['bytes_out'] / 1e6:.1f} MB; skipped {summary['skipped_utterances']} utterances; "
                   f"list: {summary['data_list']}", err=True)
        if note:
            click.echo(f"note: {note['text']}", err=True)
        failed = summary["shard_status"]["failed"]
        if failed:
            click.echo(failure_line("make", failed=[f["shard"] for f in summary["failures"]],
                                    total=summary["shards"] + failed, args=list(args),
                                    written=f"{shards(summary['shards'])}, {summary['data_list']} (the list without "
                                            f"the failed shards), {summary['manifest']}",
                                    not_written=f"{shards(failed)}, and no data.list"), err=True)
