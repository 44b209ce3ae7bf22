from __future__ import annotations

import sys

import click

from . import CONTEXT_SETTINGS, EXIT_CODES_HELP, ShardProgress, emit_json, executor_options, jobs_option, json_option


@click.command("make", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit make --wav-scp data/train/wav.scp --text data/train/text -o shards/train
  shardkit make --wav-scp d/wav.scp --text d/text --segments d/segments -o out --audio-format flac
  shardkit make --wav-scp d/wav.scp --text d/text -o out --utts-per-shard 1000 --codec none
  shardkit make --wav-scp d/wav.scp --text d/text -o s3://bucket/shards --executor ray
  shardkit make --wav-scp d/wav.scp --text d/text -o /shared/out --split $SLURM_ARRAY_TASK_ID/4
  shardkit merge-reports /shared/out --command make       # after all 4 slices: make.json, data.list""")
@click.option("--wav-scp", required=True, type=click.Path(dir_okay=False),
              help="Kaldi wav.scp: 'key path' per line ('key command |' only with --allow-pipes).")
@click.option("--text", required=True, type=click.Path(dir_okay=False), help="Kaldi text: 'key transcript' per line.")
@click.option("--segments", type=click.Path(dir_okay=False), default=None,
              help="Kaldi segments: 'utt recording start end' (seconds; end -1 = to the end).")
@click.option("-o", "--out-dir", required=True, type=click.Path(file_okay=False),
              help="Output folder, or a URL (s3://, gs://, ...: any fsspec store).")
@click.option("--shard-duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds of audio per shard: shards of about equal duration, cut in transcript order "
                   "[default: 3600].")
@click.option("--utts-per-shard", type=click.IntRange(min=1), default=None,
              help="Utterances per shard instead (WeNet's rule: fixed count, the last shard shorter).")
@click.option("--codec", default="zst", show_default=True, metavar="CODEC[:LEVEL]",
              help="Shard compression: none (plain .tar, what WeNet reads), zst, bz2, gz or xz; 'zst:19' sets a level.")
@click.option("--audio-format", type=click.Choice(["keep", "wav", "flac"]), default=None,
              help="keep: source bytes untouched; wav/flac: decode and re-encode as 16-bit PCM, clipping at full "
                   "scale [default: keep, or wav with --segments or --resample].")
@click.option("--resample", type=click.IntRange(min=1), default=None, metavar="HZ",
              help="Convert every utterance to this sample rate (soxr, high quality).")
@click.option("--allow-pipes", is_flag=True, help="Run 'command |' entries of wav.scp with sh and read their output.")
@jobs_option
@executor_options("Write only slice I of N of the planned shards (job arrays; every slice plans the same shards); "
                  "writes make.slice-I-of-N.json and data.slice-I-of-N.list; join with `shardkit merge-reports`.")
@click.option("--overwrite", is_flag=True, help="Redo every shard, even those a previous run finished.")
@json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary on stderr.")
def command(wav_scp, text, segments, out_dir, shard_duration, utts_per_shard, codec, audio_format, resample,
            allow_pipes, jobs, executor, ray_address, split, overwrite, as_json, quiet):
    """Pack a Kaldi data directory (wav.scp, text, optional segments) into WeNet-style shards.

    Each utterance becomes <key>.txt then <key>.<wav|flac|...>, adjacent, in transcript order.
    Shards hold about --shard-duration seconds each (durations come from audio headers or
    segments), or --utts-per-shard utterances. Writes OUT_DIR/shards_NNNNNNNNN.tar[.zst],
    OUT_DIR/data.list and OUT_DIR/make.json. Keys in text without audio (or the reverse), empty
    transcripts and unreadable audio are skipped, named in make.json, and make the exit code 1.
    Writes go to a temporary name, are fsynced, read back and renamed; a rerun skips finished
    shards, and a second run into the same OUT_DIR while one runs is refused.
    """

    from ..codecs import parse_codec_spec
    from ..errors import UsageError
    from ..make import DEFAULT_SHARD_SECONDS, MakeSettings, run_make

    from ..split import parse_split

    if ray_address and executor != "ray":
        raise UsageError("--ray-address needs --executor ray")
    split_slice = parse_split(split) if split else None
    if shard_duration is not None and utts_per_shard is not None:
        raise UsageError("give --shard-duration or --utts-per-shard, not both")
    if shard_duration is None and utts_per_shard is None:
        shard_duration = DEFAULT_SHARD_SECONDS
    codec_name, level = parse_codec_spec(codec)
    if audio_format is None:
        audio_format = "wav" if segments or resample else "keep"
    settings = MakeSettings(codec=codec_name, level=level, audio_format=audio_format, resample=resample,
                            shard_duration=shard_duration, utts_per_shard=utts_per_shard, allow_pipes=allow_pipes)
    progress = ShardProgress("make", quiet=quiet)
    report = run_make(wav_scp, text, out_dir, settings, segments=segments, jobs=jobs, overwrite=overwrite,
                      on_plan=progress.on_plan, on_result=progress.on_result, executor=executor,
                      ray_address=ray_address, split=split_slice)
    progress.close()
    summary = report.summary()
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
    sys.exit(report.exit_code)
