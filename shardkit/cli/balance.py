from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import one_blas_thread as _one_blas_thread  # a name the start-up tests replace
from shardkit.cli._options import (
    executor_options,
    io_options,
    jobs_option,
    json_option,
    layout_codec,
    layout_option,
    run_options,
)
from shardkit.cli._outcome import balanced_layout_options
from shardkit.cli._wenet_conf import trainer_spec, wenet_conf_options


def format_plan(summary: dict) -> str:
    """The plan for a person: shards, topology, the spread of shard seconds against the tolerance, and one
    row per corpus (weight, utterances kept, repeated, dropped, padded, copies out)."""
    lines = [f"{summary['num_shards']} shards x {summary['utterances_per_shard']} utterances "
             f"(world_size {summary['world_size']} x num_workers {summary['num_workers']}); shard seconds "
             f"{summary['min_shard_seconds']:.2f}..{summary['max_shard_seconds']:.2f}, mean "
             f"{summary['mean_shard_seconds']:.2f}, worst deviation {summary['max_deviation_seconds']:.3f} s "
             f"(tolerance {summary['tolerance_seconds']:.3f} s): "
             f"{'balanced' if summary['balanced'] else 'NOT balanced'}"]
    lines.append(f"  {'corpus':<16} {'weight':>6} {'utts':>9} {'kept':>9} {'repeated':>9} {'dropped':>9} "
                 f"{'padded':>7} {'rem.drop':>8} {'out':>9}")
    for c in summary["corpora"]:
        lines.append(f"  {c['name']:<16} {c['weight']:>6g} {c['utterances']:>9} {c['kept']:>9} {c['repeated']:>9} "
                     f"{c['dropped']:>9} {c['padded']:>7} {c['remainder_dropped']:>8} {c['copies_out']:>9}")
    lines.extend(f"note: {n}" for n in summary["notes"])
    return "\n".join(lines)


@click.command("balance", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit balance --corpus aishell=aishell.index.jsonl --corpus libri=libri/data.list:0.5 \\
      --corpus accented=accented/:2 --world-size 8 --num-workers 4 -o balanced --dry-run
  shardkit balance --corpus zh=zh/ --corpus en=en/ --world-size 8 --num-workers 4 \\
      --shard-duration 1800 -o balanced -j 8
  shardkit balance --corpus zh=zh.index.jsonl --corpus en=en.index.jsonl --world-size 8 --num-workers 4 \
      -o /shared/balanced --split $SLURM_ARRAY_TASK_ID/4   # job array; then:
  shardkit merge-reports /shared/balanced --command balance
  shardkit balance --corpus zh=zh.index.jsonl --corpus en=en.index.jsonl --world-size 8 --num-workers 4 \\
      --wenet-conf conf/train.yaml --dropped-keys dropped.txt -o balanced --dry-run
  for i in 1 2 3 4; do shardkit balance --corpus zh=zh.index.parquet --corpus en=en.index.parquet \
      --world-size 64 --num-workers 4 --part $i/4 -o /shared/balanced/part-$i; done   # 1/4 of the memory
  shardkit balance --corpus zh=zh/ --corpus en=en/ --world-size 4 --num-workers 2 --layout nemo -o nemo_ds
  shardkit balance --corpus zh=zh/ --corpus en=en/ --world-size 4 --num-workers 2 --layout shar -o shar_ds""")
@click.option("--corpus", "corpus_specs", multiple=True, required=True, metavar="NAME=SOURCES[:WEIGHT]",
              help="A corpus: comma-separated shards, folders, data.list files or index files (.jsonl, .parquet); "
                   "WEIGHT 1 keeps each utterance once, 2 twice, 0.5 a seeded half. Repeat per corpus.")
@balanced_layout_options
@click.option("--remainder", type=click.Choice(["pad", "drop"]), default="pad", show_default=True,
              help="Keep counts equal by repeating utterances (pad) or leaving some out (drop).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random choice.")
@click.option("--plan-version", type=click.Choice(["1", "2", "3"]), default="3", show_default=True,
              help="How the plan is drawn: 3 deals every copy straight to its place (less CPU and memory at tens "
                   "of millions of utterances); 2 and 1 give back the plans of earlier shardkit versions (same "
                   "mix and seed: the same shards).")
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Shuffled epochs in the plan figures of the new list.")
@click.option("--dry-run", is_flag=True, help="Print the plan; write no shard.")
@click.option("--verify/--no-verify", default=True, show_default=True, help="Read every written shard back.")
@click.option("--overwrite", is_flag=True, help="Rewrite shards a previous run already finished.")
@layout_option
@click.option("--part", "part", metavar="I/P", default=None,
              help="Plan and write only part I of P of every corpus (the utterances whose index row is I-1 "
                   "modulo P), at 1/P of the memory: P runs, each into its own OUT_DIR, balance a mix "
                   "above one node's memory.")
@wenet_conf_options
@jobs_option
@executor_options("Plan every shard, write only slice I of N of them (job arrays); join with "
                  "`shardkit merge-reports OUT_DIR --command balance`.")
@io_options
@json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or summary on stderr.")
def command(corpus_specs, world_size, num_workers, out_dir, shard_duration, num_shards, codec, level, remainder,
            seed, plan_version, epochs, dry_run, verify, overwrite, layout, part, wenet_conf, tokenizer, dropped_keys, jobs,
            executor, ray_address, split, as_json, quiet):
    """Rewrite a multi-corpus mix into shards that each carry the same seconds and utterance count.

    Writes N shards (N a multiple of world_size x num_workers, nearest to --shard-duration), each
    with the same number of utterances, durations within 0.5% of the mean (or one median
    utterance), and the corpora in the mix's proportions; plus OUT_DIR/data.list and
    OUT_DIR/balance.json (per shard: utterances, seconds, per-corpus counts; per corpus: kept,
    repeated, dropped, padded; the `plan` figures of the new list) and OUT_DIR/balance.repeats.jsonl
    (every repeated key, [original, output] a line: the report stays small at any scale). Members are
    copied byte for byte; a repeated utterance's key gets the suffix -rep<N>. Compressed sources
    are decompressed once into OUT_DIR/.balance (free disk for their uncompressed size is needed).
    A rerun resumes, skipping shards already written.

    --layout nemo writes OUT_DIR/audio_K.tar, one OUT_DIR/tarred_audio_manifest.json and
    OUT_DIR/nemo_config.yaml (printed: is_tarred, tarred_audio_filepaths, manifest_filepath,
    tarred_shard_strategy: scatter, shuffle_n); --layout shar writes the Shar folder OUT_DIR/shar
    (CutSet.from_shar(in_dir=OUT_DIR/shar, split_for_dataloading=True)), reports beside it.

    An index given as a source must be whole and describe its shards as they are now: one cut short
    (a copy that stopped early) or one whose shard changed since it was indexed (size, mtime or
    digest; `shardkit index` records them) exits 1 naming the file or the shard and what changed,
    before anything is written; index it again. Shards given as sources are indexed again when they
    change. An index without these marks (an older shardkit's) is used, with a note that it cannot
    be checked. balance.json records the stamps it used per corpus (source_stamps).

    With --split I/N every job computes the same plan (pass indexes from `shardkit index` so that
    the jobs do not each index the shards) and writes only its block of output shards, with
    OUT_DIR/balance.slice-I-of-N.json and data.slice-I-of-N.list; each job decompresses the
    compressed sources its block needs into its own OUT_DIR/.balance/spool.slice-I-of-N.

    --wenet-conf TRAIN.yaml balances only the audio the trainer's filter_conf keeps, reports what
    it drops per corpus (--dropped-keys FILE lists the keys) and simulates the trainer's batching
    of the balanced list (steps per rank and worker, what equal_steps would leave out).
    """
    import os

    _one_blas_thread()
    from shardkit.cli._progress import ProgressBars
    from shardkit.commands.balance import BalanceSettings
    from shardkit.io.mix import parse_corpus_spec
    from shardkit.errors import UsageError

    bars = ProgressBars(quiet=quiet, notes_end_bars=True)
    options = run_options(jobs=jobs or os.cpu_count() or 1, executor=executor, ray_address=ray_address, split=split,
                          overwrite=overwrite, on_event=bars)
    part_of = _part(part)
    if shard_duration is not None and num_shards is not None:
        raise UsageError("give --shard-duration or --num-shards, not both")
    codec_name, level = layout_codec(layout, codec, level)
    corpora = [parse_corpus_spec(spec) for spec in corpus_specs]
    settings = BalanceSettings(world_size=world_size, num_workers=num_workers, shard_duration=shard_duration,
                               num_shards=num_shards, codec=codec_name, level=level, remainder=remainder, seed=seed,
                               plan_version=int(plan_version), epochs=epochs, verify=verify, dry_run=dry_run,
                               part=part_of, wenet=trainer_spec(wenet_conf, tokenizer, dropped_keys),
                               dropped_keys=dropped_keys, layout=layout)
    report = _run(corpora, out_dir, settings, options, bars, as_json)
    _show(report, settings, corpora, quiet=quiet, as_json=as_json)
    sys.exit(report.exit_code)


def _part(part: str | None) -> tuple[int, int] | None:
    """--part I/P, read as --split is (its errors worded for --part)."""
    if not part:
        return None
    from shardkit.errors import UsageError
    from shardkit.run.split import parse_split

    try:
        return parse_split(part)
    except UsageError as err:
        raise UsageError(str(err).replace("--split", "--part").replace("slice", "part")) from None


def _run(corpora, out_dir: str, settings, options, bars, as_json: bool):
    """``run_balance``'s report; a writing run that stops before writing (an unreadable source, say) ends
    with the failure's last line (``stopped``), exit 1."""
    from shardkit.cli._outcome import stopped
    from shardkit.commands.balance import run_balance
    from shardkit.errors import ShardkitError, UsageError

    try:
        with bars:
            return run_balance(corpora, out_dir, settings, options)
    except ShardkitError as err:
        if isinstance(err, UsageError) or settings.dry_run:
            raise
        stopped("balance", err, failed=[r["shard"] for r in bars.failed_results("index ")], args=[s for c in corpora for s in c.sources], as_json=as_json)


def _show(report, settings, corpora, *, quiet: bool, as_json: bool) -> None:
    """The JSON report on stdout (--json); the plan, its figures, the --wenet-conf report and the closing lines
    on stderr (the conf's warnings even with -q)."""
    from shardkit.cli._figures import format_figures
    from shardkit.cli._outcome import zstd_note

    summary = report.summary()
    note = None if settings.dry_run else zstd_note(settings.codec)
    if note:
        summary["zstd"] = note
    if as_json:
        emit_json(summary)
    if not quiet:
        click.echo(format_plan(summary), err=True)
        click.echo(format_figures(report.figures), err=True)
    if settings.wenet is not None:
        _show_wenet_conf(report.wenet_conf, settings.wenet.warnings, quiet)
    if not quiet:
        _print_outcome(summary, note, settings.dry_run, corpora)
    if report.layout is not None and not as_json:  # the piece to paste into the trainer's config
        click.echo(report.layout.get("config_fragment") or f"read it with: {report.layout['reader']}")


def _show_wenet_conf(wenet_conf: dict, warnings: list[str], quiet: bool) -> None:
    from shardkit.wenet_conf.report import format_report

    click.echo(format_report(wenet_conf, warnings) if not quiet else "\n".join(f"warning: {w}" for w in warnings),
               err=True, nl=bool(warnings) or not quiet)


def _print_outcome(summary: dict, note: dict | None, dry_run: bool, corpora) -> None:
    """The closing lines on stderr: what was written, the zstd note, and after a failed shard what was not."""
    from shardkit.cli._outcome import failure_line
    from shardkit.cli._outcome import shards as shards_text

    if dry_run:
        click.echo("dry run: no shard written", err=True)
    else:
        written = summary["written"]
        part = summary.get("slice")
        of = (f"{part['stop'] - part['start']} shards (slice {part['index']} of {part['count']} of "
              f"{summary['num_shards']})") if part else f"{summary['num_shards']} shards"
        click.echo(f"wrote {written['ok']}, skipped {written['skipped']} (already done), failed "
                   f"{written['failed']} of {of}; list: {summary['data_list']}", err=True)
        if note:
            click.echo(f"note: {note['text']}", err=True)
        if summary["failures"]:
            done = written["ok"] + written["skipped"]
            click.echo(failure_line(
                "balance", failed=[f["shard"] for f in summary["failures"]], total=done + written["failed"],
                args=[s for c in corpora for s in c.sources],
                written=f"{shards_text(done)}, {summary['data_list']} (the list without the failed shards), "
                        f"{summary['manifest']}",
                not_written=f"{shards_text(written['failed'])}, and no data.list"), err=True)
