from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import jobs_option, json_option, layout_codec, layout_option, run_options
from shardkit.cli._outcome import balanced_layout_options


def format_summary(summary: dict) -> str:
    """prep's summary for a person: what was read, accepted and rejected (by check), the shards and their
    balance, and the rank balance before and after the plan."""
    s = summary
    checks = (": " + ", ".join(f"{k} {n}" for k, n in s["by_check"].items())) if s["by_check"] else ""
    read = (f"{s['sources']} sources, {s['utterances_read']} utterances read, {s['accepted']} accepted, "
            f"{s['rejected_utterances']} rejected ({s['findings']} findings{checks})")
    plan = (f"{s['num_shards']} shards x {s['utterances_per_shard']} utterances (world_size {s['world_size']} x "
            f"num_workers {s['num_workers']}); shard seconds {s['min_shard_seconds']:.2f}.."
            f"{s['max_shard_seconds']:.2f}, mean {s['mean_shard_seconds']:.2f}, worst deviation "
            f"{s['max_deviation_seconds']:.3f} s (tolerance {s['tolerance_seconds']:.3f} s): "
            f"{'balanced' if s['balanced'] else 'NOT balanced'}; repeated {s['repeated']}, dropped {s['dropped']}")
    lines = [read, plan]
    before, after = s.get("plan_before"), s.get("plan_after")
    if before and after:
        lines.append(f"rank balance (max/min seconds per rank, worst of {after['epochs']} shuffled epochs): "
                     f"{before['worst_rank_spread']} as the sources were, {after['worst_rank_spread']} after")
    lines.extend(f"note: {n}" for n in s.get("notes", []))
    return "\n".join(lines)


@click.command("prep", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit prep --corpus aishell=raw/aishell/data.list --corpus libri=raw/libri/ \\
      --world-size 8 --num-workers 4 --sample-rate 16000 --channels 1 -o data/train
  shardkit prep --corpus zh=zh/ --index zh.index.jsonl --world-size 2 --num-workers 2 \\
      --codec none -o data/train -j 16 --json
  shardkit prep --corpus zh=raw/zh/ --corpus en=raw/en/ --world-size 4 --num-workers 2 --layout nemo -o nemo_ds
  shardkit prep --corpus zh=raw/zh/ --corpus en=raw/en/ --world-size 4 --num-workers 2 --layout shar -o shar_ds
  shardkit prep --corpus nemo=/data/nemo/tarred_audio_manifest.json --corpus lh=/data/shar \\
      --world-size 4 --num-workers 2 -o data/train""")
@click.option("--corpus", "corpus_specs", multiple=True, required=True, metavar="NAME=SOURCES[:WEIGHT]",
              help="A corpus: comma-separated shards (bz2, gz, xz, zst or plain tar), folders or data.list files, "
                   "a NeMo tarred dataset's manifest (its audio_K.tar beside it) or a Lhotse Shar folder, "
                   "and its weight as balance takes it (2: every utterance twice; 0.5: a seeded half, drawn per "
                   "key) [default weight: 1]. Repeat per corpus.")
@click.option("--index", "index_files", multiple=True, metavar="INDEX.jsonl",
              help="Index files (`shardkit index`) of the sources: the exact total fixes the shard count before "
                   "reading [default: estimated while reading]. Repeatable.")
@balanced_layout_options
@layout_option
@click.option("--audio", type=click.Choice(["keep", "flac", "wav"]), default="keep", show_default=True,
              help="Audio members as convert --audio writes them: kept, or losslessly re-encoded (verified) "
                   "before the checks.")
@click.option("--flac-level", type=click.IntRange(0, 8), default=None, help="FLAC compression level (--audio flac).")
@click.option("--remainder", type=click.Choice(["pad", "drop"]), default="pad", show_default=True,
              help="Keep counts equal by repeating utterances (pad) or leaving some out (drop).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the pad/drop choices.")
@click.option("--sample-rate", type=int, default=None, help="Reject audio at another rate (Hz).")
@click.option("--channels", type=int, default=None, help="Reject audio with another channel count.")
@click.option("--min-duration", type=float, default=None, help="Reject utterances shorter than this (s).")
@click.option("--max-duration", type=float, default=None, help="Reject utterances longer than this (s).")
@click.option("--backend", type=click.Choice(["soundfile", "torchaudio"]), default="soundfile", show_default=True,
              help="Audio decoder of the checks (as validate).")
@click.option("--pool-mb", type=click.IntRange(min=1), default=256, show_default=True,
              help="Memory for utterances held back for the final balancing (at least one per shard is held).")
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Shuffled epochs in the before/after rank figures.")
@click.option("--verify/--no-verify", default=True, show_default=True, help="Read every written shard back.")
@click.option("--checkpoint-mb", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Plain tar output: save a resume point after about this many MB written (and 8x the held-back "
                   "pool), so that a killed run's rerun goes on from there. Never changes the output bytes.")
@click.option("--overwrite", is_flag=True, help="Redo the run even if an identical finished one is there.")
@jobs_option
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: processes here; ray: sources read and checked as Ray tasks (the cluster must see them "
                   "at the same paths), planned and written here.")
@click.option("--ray-address", default=None, help="Ray cluster [default: auto].")
@json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or summary on stderr.")
def command(corpus_specs, index_files, world_size, num_workers, out_dir, shard_duration, num_shards, codec, level,
            layout, audio, flac_level, remainder, seed, sample_rate, channels, min_duration, max_duration, backend, pool_mb,
            epochs, verify, checkpoint_mb, overwrite, jobs, executor, ray_address, as_json, quiet):
    """Turn raw source shards into balanced, validated training shards in one read.

    Each source shard is decompressed once and each audio member decoded once for validate's checks;
    an utterance with a finding is left out and listed in OUT_DIR/rejects.jsonl (shard, member, key,
    checks, reasons); the others are copied byte for byte into N output shards (N a multiple of
    world_size x num_workers), each with the same utterance count and seconds within max(0.5% of the
    mean shard, one median utterance), as balance guarantees. Writes OUT_DIR/data.list and
    OUT_DIR/prep.json (per shard: utterances, seconds, corpora; the repeats and drops; rank balance
    figures of the sources as they were and of the new list). Same inputs and options give the same
    bytes for any -j. A killed run's rerun goes on from its last resume point (plain tar output; see
    --checkpoint-mb), other codecs start again; a rerun of a finished one does nothing.

    --layout nemo writes OUT_DIR/audio_K.tar, one OUT_DIR/tarred_audio_manifest.json and
    OUT_DIR/nemo_config.yaml (printed: the train_ds keys to paste); --layout shar writes the Shar
    folder OUT_DIR/shar (CutSet.from_shar(in_dir=OUT_DIR/shar, split_for_dataloading=True)), the
    reports and list beside it. Both are plain tars, resumed after a kill like plain tar output.
    """
    import os

    _start_workers_early(executor, jobs)
    from shardkit.cli._progress import ProgressBars
    from shardkit.commands.prep import PrepSettings, run_prep
    from shardkit.commands.validate.options import ValidateOptions
    from shardkit.io.mix import parse_corpus_spec

    bars = ProgressBars(quiet=quiet, notes_end_bars=True, line_for=_unreadable_source)
    options = run_options(jobs=jobs or os.cpu_count(), executor=executor, ray_address=ray_address, overwrite=overwrite,
                          on_event=bars)
    codec_name, level = layout_codec(layout, codec, level)
    corpora = [parse_corpus_spec(spec) for spec in corpus_specs]
    settings = PrepSettings(world_size=world_size, num_workers=num_workers, shard_duration=shard_duration,
                            num_shards=num_shards, codec=codec_name, level=level, remainder=remainder, seed=seed,
                            pool_bytes=pool_mb << 20, audio=audio, flac_level=flac_level, verify=verify,
                            epochs=epochs, checkpoint_bytes=checkpoint_mb << 20, layout=layout)
    checks = ValidateOptions(backend=backend, sample_rate=sample_rate, channels=channels, min_duration=min_duration,
                             max_duration=max_duration)
    with bars:
        report = run_prep(corpora, out_dir, settings, checks, options, index_files=list(index_files))
    _show(report, out_dir, quiet=quiet, as_json=as_json)
    sys.exit(report.exit_code)


def _start_workers_early(executor: str, jobs: int | None) -> None:
    """The reading's forkserver, started before the imports of the command (its start-up overlaps them)."""
    import os

    if executor == "local" and (jobs or os.cpu_count() or 1) > 1:
        from shardkit.run.executor import start_forkserver

        start_forkserver(["shardkit.commands.prep.read"])


def _unreadable_source(event) -> str | None:
    """A source that could not be read (missing, or a scan error that ended it early): its line above the
    read+check bar."""
    result = event.result
    if result.get("scan_error") or any(f["check"] == "missing_file" for f in result["findings"]):
        return f"{result['shard']}: {result['findings'][-1]['message']}"
    return None


def _show(report, out_dir: str, *, quiet: bool, as_json: bool) -> None:
    """The JSON report on stdout (--json); the summary and where the list and rejects went on stderr; a
    trainer's layout: the piece to paste into its config on stdout (as balance prints it)."""
    summary = report.summary()
    if as_json:
        emit_json(summary)
    if not quiet:
        if summary["this_run"] == "skipped":
            click.echo(f"nothing to do: {out_dir} holds a finished run of these sources and options", err=True)
        click.echo(format_summary(summary), err=True)
        click.echo(f"list: {summary['data_list']}; rejects: {summary['rejects']}", err=True)
    layout = summary.get("layout")
    if layout is not None and not as_json:
        click.echo(layout.get("config_fragment") or f"read it with: {layout['reader']}")
