from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import executor_options, io_options, jobs_option, json_option, run_options
from shardkit.cli._options import one_blas_thread as _one_blas_thread  # a name the start-up tests replace
from shardkit.cli._outcome import codec_option


@click.command("convert", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit convert data/bz2/data.list -o data/plain          # bz2 -> plain .tar (WeNet reads it as installed)
  shardkit convert 'raw/*.tar.gz' -o zst --codec zst:3 -j 8   # gz -> .tar.zst (needs `shardkit wenet enable-zstd`)
  shardkit convert shards/ -o flac --codec none --audio flac  # WAV members -> FLAC, plain tar
  shardkit convert data.list -o plain --executor ray           # one Ray task per shard
  shardkit convert data.list -o plain --split 2/3              # job array slice 2 of 3; then merge-reports
  shardkit convert data.list -o s3://bucket/corpus/plain       # any fsspec URL: upload, then move into place
  curl -s https://host/shards_000000007.tar.bz2 | shardkit convert - -o plain --stdin-name shards_000000007""")
@click.argument("shards", nargs=-1, required=True)
@click.option("-o", "--out-dir", required=True, type=click.Path(file_okay=False),
              help="Output folder, or an fsspec URL (s3://bucket/prefix, gs://..., hdfs://...).")
@codec_option("none")
@click.option("--level", type=int, default=None,
              help="Compression level [default: the codec's, zst 3]; or --codec zst:19.")
@jobs_option
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Decompressor threads per task for bz2/gz [default: cores // jobs, and more for the "
                   "last shards of a run, when fewer shards remain than jobs, or by size when every shard "
                   "starts at once; without -j, local bz2 files holding under 32 MiB / (1 - 1/cores) together "
                   "run in one process, each shard on every core in turn].")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Read every written shard back and compare member names and digests; with --audio, also "
                   "prove every transcoded member decodes to the source's samples (libFLAC's verify mode, or a "
                   "second decode).")
@click.option("--keep-tree/--flat", "keep_tree", default=None,
              help="Outputs mirror the input folders below their common parent (--keep-tree), or all go "
                   "directly in OUT_DIR (--flat; two inputs with one file name are then an error) "
                   "[default: mirror only when input file names repeat].")
@click.option("--stdin-name", metavar="NAME", default=None,
              help="Output name of SOURCE - (one shard on standard input): OUT_DIR/NAME.tar[.zst]; a shard suffix "
                   "in NAME is dropped [default: stdin].")
@click.option("--overwrite", is_flag=True, help="Redo every shard, even those a previous run finished.")
@click.option("--salvage", is_flag=True,
              help="For a damaged source, keep every complete utterance before the damage.")
@click.option("--max-member-bytes", type=click.IntRange(min=1), default=2 << 30, show_default=True,
              help="Refuse members larger than this (memory stays bounded).")
@click.option("--audio", type=click.Choice(["keep", "flac", "wav"]), default="keep", show_default=True,
              help="keep: members byte for byte; flac: PCM WAV -> FLAC (lossless, verified); wav: FLAC -> WAV.")
@click.option("--flac-level", type=click.IntRange(0, 8), default=None,
              help="FLAC compression level 0-8 [default: libsndfile's].")
@click.option("--max-decoded-seconds", type=click.FloatRange(min=0, min_open=True), default=3600.0, show_default=True,
              metavar="S", help="With --audio, keep a member that decodes to more than S seconds as it is "
                                "(problem decoded_too_long): a tiny member can decode to hours.")
@executor_options("Convert only slice I of N of the shard list (job arrays); join with `shardkit merge-reports`.")
@io_options
@json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary on stderr.")
def command(shards, out_dir, codec, level, jobs, threads, verify, keep_tree, stdin_name, overwrite, salvage,
            max_member_bytes, audio, flac_level, max_decoded_seconds, executor, ray_address, split, as_json, quiet):
    """Re-pack SHARDS (bz2/gz/xz/zst/plain tar) into plain tar (default) or another codec, member for member.

    SHARDS are shard files, folders of shards, glob patterns or WeNet data.list files (one shard
    path per line); `-` reads one shard from standard input. Outputs are OUT_DIR/<stem>.tar[.zst]
    (standard input's: OUT_DIR/stdin.tar[.zst], or the --stdin-name), plus OUT_DIR/data.list
    (absolute paths, input order; named data.partial.list when a shard failed) and
    OUT_DIR/convert.json (per shard: source, output sha256, digests, status). Writes go to a
    temporary name, are fsynced and renamed; a rerun skips finished shards, except standard input's, which it converts again (a stream cannot be
    compared with what an earlier run read).
    With a URL OUT_DIR each shard is written and verified in a local temporary file ($TMPDIR),
    uploaded to a temporary key and moved onto its name (no partial object under a final name); the
    data.list and convert.json are published the same way. A rerun checks each finished output's
    size and sha256 (reading the object back) against convert.json.
    """
    _one_blas_thread()
    _start_workers_early(executor, jobs, shards, audio)
    from shardkit.cli._outcome import zstd_note
    from shardkit.cli._progress import ProgressBars
    from shardkit.commands.convert import ConvertSettings, run_convert
    from shardkit.io.codecs import parse_codec_spec

    if "-" in shards and sys.stdin is not None and sys.stdin.isatty():
        from shardkit.errors import UsageError

        raise UsageError("SOURCE - reads a shard from standard input, which is a terminal here; pipe one in: "
                         "curl -s URL | shardkit convert - -o OUT_DIR")
    name, default_level = parse_codec_spec(codec, level)
    settings = ConvertSettings(codec=name, level=default_level, verify=verify, salvage=salvage,
                               max_member_bytes=max_member_bytes, threads=_threads(threads, executor),
                               audio=audio, flac_level=flac_level,
                               max_decoded_seconds=max_decoded_seconds)
    if audio == "flac" and name != "none" and not quiet:
        click.echo("note: FLAC members gain ~1% from further compression; --codec none keeps shards plain "
                   "and fastest to read.", err=True)
    with ProgressBars(quiet=quiet) as bars:
        options = run_options(jobs=jobs, executor=executor, ray_address=ray_address, split=split,
                              overwrite=overwrite, on_event=bars)
        report = run_convert(list(shards), out_dir, settings, options, keep_tree=keep_tree, stdin_name=stdin_name)
    summary = report.summary()
    note = zstd_note(name)
    if note:
        summary["zstd"] = note
    if as_json:
        emit_json(summary)
    if not quiet:
        _print_summary(summary, list(shards), audio)
    sys.exit(report.exit_code)


def _threads(threads: int | None, executor: str) -> int | None:
    """--threads, else None (cores // min(jobs, shards not yet started), chosen as each task starts) or, on
    Ray, 1 (one CPU per task)."""
    return threads or (1 if executor == "ray" else None)


def _print_summary(summary: dict, args: list[str], audio: str) -> None:
    """The closing lines on stderr: counts, the audio transcoding, the zstd note, and after a failure what was not written."""
    from shardkit.cli._outcome import failure_line
    from shardkit.cli._outcome import shards as shards_text

    converted = (f"{summary['tar_bytes_converted'] / 1e6:.1f} MB of tar in {summary['seconds']:.1f} s; "
                 if summary["ok"] or summary["salvaged"] else "")
    click.echo(f"converted {summary['ok']}, skipped {summary['skipped']} (already done), "
               f"salvaged {summary['salvaged']}, failed {summary['failed']} of {summary['shards']} shards; "
               f"{converted}list: {summary['data_list']}", err=True)
    if "audio" in summary:
        _print_audio(summary["audio"], audio)
    if "zstd" in summary:
        click.echo(f"note: {summary['zstd']['text']}", err=True)
    if summary["failed"]:
        done = summary["shards"] - summary["failed"]
        click.echo(failure_line("convert", failed=[f["shard"] for f in summary["failures"]],
                                total=summary["shards"], args=args,
                                written=f"{shards_text(done)}, {summary['data_list']} (the list without the failed "
                                        f"shards), {summary['manifest']}",
                                not_written=f"{shards_text(summary['failed'])}, and no data.list"), err=True)


def _print_audio(audio_summary: dict, audio: str) -> None:
    reasons = ", ".join(f"{n} {why}" for why, n in sorted(audio_summary["kept_by_reason"].items()))
    click.echo(f"audio: {audio_summary['transcoded']} members transcoded to {audio}, "
               f"{audio_summary['kept']} kept as they were{f' ({reasons})' if reasons else ''}", err=True)
    for problem in audio_summary["undecodable_kept"]:
        click.echo(f"kept undecodable: {problem['shard']}: key {problem['key']!r}: {problem['check']}: "
                   f"{problem['reason']}", err=True)


# shardkit.commands.convert.WORKER_MODULES and AUDIO_WORKER_MODULES, named here so that the server starts before this
# process imports them itself (a test checks that the lists agree)
_WORKER_MODULES = ["shardkit.commands.convert", "indexed_bzip2", "pyzstd"]
_AUDIO_WORKER_MODULES = ["shardkit.io.transcode"]


def _start_workers_early(executor: str, jobs: int | None, shards=(), audio: str = "keep") -> None:
    """The pool's forkserver, started before the imports of the command: its imports overlap this process's.
    Not for a run that will have no pool (one job, one shard file, or bz2 files few enough for one process)."""
    import os

    from shardkit.io.codecs import bz2_fits_one_process
    from shardkit.run.executor import usable_cores

    if executor != "local" or (jobs or usable_cores()) <= 1 or (len(shards) == 1 and os.path.isfile(shards[0])):
        return
    if jobs is None and bz2_fits_one_process(list(shards), usable_cores()):
        return
    from shardkit.run.executor import start_forkserver

    start_forkserver(_WORKER_MODULES + (_AUDIO_WORKER_MODULES if audio != "keep" else []))
