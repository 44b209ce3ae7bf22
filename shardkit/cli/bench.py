from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import io_options, jobs_option, json_option, run_options


def _ints(text: str) -> tuple[int, ...]:
    from shardkit.errors import UsageError

    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--workers takes integers separated by commas (got {text!r})") from None


@click.command("bench", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit bench -o bench/                          # generated ~32 MB corpus, every format
  shardkit bench data/data.list -o bench/ --max-bytes 200000000 --gpus-per-node 8
  shardkit bench -o quick/ --formats none,zst:3 --audio wav --workers 0,2 --mp-context fork --repeat 1""")
@click.argument("shards", nargs=-1)
@click.option("-o", "--out-dir", required=True, type=click.Path(file_okay=False),
              help="Folder for bench.json, bench.md and bench.png.")
@click.option("--formats", default=",".join(("none", "gz", "bz2", "xz", "zst:1", "zst:3", "zst:19")),
              show_default=True, help="Shard compressions to compare, comma-separated, each as --codec takes it: "
                                      "none, zst[:LEVEL], bz2, gz, xz (zstd = zst).")
@click.option("--audio", default="wav,flac", show_default=True, help="Audio members to compare: wav, flac.")
@click.option("--decoder", "decoders", default="shardkit,soundfile", show_default=True,
              help="Decoders for read + decode: shardkit (numpy WAV fast path), soundfile, torchaudio.")
@click.option("--reference", default="bz2", show_default=True,
              help="Formats that also get the WeNet-style row (tarfile r:* + torchaudio.load); '' for none.")
@click.option("--workers", default="0,1,2,4", show_default=True, help="DataLoader num_workers values; '' skips.")
@click.option("--mp-context", "mp_contexts", default="fork,spawn,forkserver", show_default=True,
              help="DataLoader start methods to compare.")
@click.option("--loader-format", default="zst:3", show_default=True, help="Format the DataLoader reads.")
@click.option("--loader-batch-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="Utterances per batch, padded in the workers.")
@click.option("--min-seconds", type=float, default=0.5, show_default=True,
              help="Repeat each measurement at least this long ...")
@click.option("--repeat", type=int, default=3, show_default=True, help="... and at least this many times.")
@click.option("--corpus-mb", type=float, default=32.0, show_default=True,
              help="Size of the generated corpus (WAV tar) when no SHARDS are given.")
@click.option("--max-bytes", type=int, default=100_000_000, show_default=True,
              help="Sample at most this much WAV from SHARDS.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="GPUs per training node, for the loader advice [default: the GPUs seen here; with none seen, "
                   "1, and the advice says it is a guess].")
@click.option("--target-hours-per-second", type=float, default=0.42, show_default=True,
              help="Audio one GPU consumes (h/s); the default is assumed: an H100 at WeNet's default batches.")
@click.option("--fbank-hours-per-second", type=float, default=0.25, show_default=True,
              help="Kaldi fbank throughput per core (h/s), counted in the workers needed.")
@jobs_option
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Where the temporary corpus goes [default: the system's temp folder].")
@click.option("--seed", type=int, default=0, show_default=True, help="Corpus generation / sampling seed.")
@click.option("--webdataset/--no-webdataset", default=True, show_default=True,
              help="WebDataset loader rows (soundfile / torchaudio / shardkit handler, shardkit.training.wds.WebDataset) "
                   "next to shardkit's reader, on plain WAV, zstd WAV and FLAC (needs webdataset).")
@click.option("-q", "--quiet", is_flag=True, help="No progress or table on stderr.")
@io_options
@json_option
def command(shards, out_dir, formats, audio, decoders, reference, workers, mp_contexts, loader_format,
            loader_batch_size, min_seconds,
            repeat, corpus_mb, max_bytes, gpus_per_node, target_hours_per_second, fbank_hours_per_second, jobs,
            work_dir, seed, webdataset, quiet, as_json):
    """Measure decode throughput per shard format and loader setting, and recommend one.

    Without SHARDS a deterministic speech-like corpus is generated; with SHARDS (files, folders,
    globs, data.list) up to --max-bytes of them is sampled. The utterances are re-packed into
    every format in a temporary folder, then measured one core at a time: size, write rate,
    decompression, read + group, read + decode per decoder, WeNet's way of reading, and a real
    torch DataLoader per worker count and start method, and the WebDataset pipelines a WebDataset
    user runs (with soundfile, torchaudio or shardkit's handler). Every run must decode every utterance.
    Writes OUT_DIR/bench.json, bench.md and bench.png, and prints the table (stderr).
    """
    from shardkit.cli._progress import ProgressBars
    from shardkit.commands.bench import run_bench
    from shardkit.commands.bench.settings import BenchSettings, parse_list

    settings = BenchSettings(
        formats=parse_list(formats, "--formats"), audio=parse_list(audio, "--audio"),
        decoders=parse_list(decoders, "--decoder"),
        reference=tuple(x.strip() for x in reference.split(",") if x.strip()),
        workers=_ints(workers), mp_contexts=parse_list(mp_contexts, "--mp-context"), loader_format=loader_format,
        loader_batch_size=loader_batch_size, min_seconds=min_seconds, repeat=repeat, corpus_mb=corpus_mb,
        max_bytes=max_bytes, gpus_per_node=gpus_per_node, target_hours_per_second=target_hours_per_second,
        fbank_hours_per_second_per_core=fbank_hours_per_second, seed=seed, webdataset=webdataset)
    with ProgressBars(quiet=quiet) as bars:
        report = run_bench(list(shards), out_dir, settings, run_options(jobs=jobs, on_event=bars), work_dir=work_dir)
    data = report.summary()
    if as_json:
        emit_json(data)
    if not quiet:
        _print_tables(data)
    sys.exit(0)


def _print_tables(data: dict) -> None:
    """bench.md's text and the files written, on stderr."""
    from shardkit.commands.bench.report import format_tables

    paths = data["outputs"]
    click.echo(format_tables(data), err=True)
    click.echo(f"wrote {paths['json']}, {paths['md']}" + (f", {paths['png']}" if paths["png"] else ""), err=True)
