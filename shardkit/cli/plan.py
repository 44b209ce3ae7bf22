from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._figures import format_figures
from shardkit.cli._options import io_options, jobs_option, json_option, run_options
from shardkit.cli._wenet_conf import wenet_conf_options


@click.command("plan", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit plan data/data.list --world-size 8 --num-workers 4 --epochs 3
  shardkit plan data/data.list --world-size 8 --num-workers 4 --index data/index.parquet --json
  shardkit plan data/data.list --world-size 8 --num-workers 4 --reader webdataset
  shardkit plan data/data.list --world-size 8 --num-workers 4 --index data/index.jsonl \\
      --wenet-conf conf/train_conformer.yaml --tokenizer data/dict/lang_char.txt
  shardkit plan nemo_ds/tarred_audio_manifest.json --layout nemo --world-size 8 --num-workers 4 --batch-size 32
  shardkit plan shar_ds/shar --layout shar --world-size 8 --num-workers 4""")
@click.argument("shards", nargs=-1, required=True)
@click.option("--world-size", required=True, type=click.IntRange(min=1), help="Number of ranks (GPUs).")
@click.option("--num-workers", required=True, type=click.IntRange(min=1), help="Loader workers per rank.")
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True, help="Shuffled epochs to show.")
@click.option("--seed", type=int, default=0, show_default=True, help="Shuffle seed.")
@click.option("--index", "index_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Take utterances and seconds from these index files (.jsonl or .parquet) instead of reading "
                   "the shards.")
@click.option("--reader", type=click.Choice(["wenet", "webdataset"]), default="wenet", show_default=True,
              help="Whose split to show: WeNet's, or WebDataset's (split_by_node + split_by_worker, and "
                   "resampled) alongside WeNet's.")
@click.option("--draws", type=click.IntRange(min=1), default=None,
              help="--reader webdataset, resampled: shards each worker draws per epoch "
                   "[default: shards / (world_size x num_workers), rounded up].")
@click.option("--layout", type=click.Choice(["wenet", "nemo", "shar"]), default="wenet", show_default=True,
              help="An existing dataset of another trainer: nemo (SHARDS = its manifest; NeMo's scatter and "
                   "replicate) or shar (SHARDS = the Shar folder; Lhotse's split_for_dataloading).")
@click.option("--tars", default=None, metavar="PATTERN",
              help="--layout nemo: its tarred_audio_filepaths (brace or _OP_.._CL_ syntax) [default: audio_K.tar "
                   "beside the manifest, K by shard_id].")
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="--layout nemo|shar: utterances per batch, for steps per rank.")
@wenet_conf_options
@jobs_option
@io_options
@json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or table on stderr.")
def command(shards, world_size, num_workers, epochs, seed, index_files, reader, draws, layout, tars, batch_size,
            wenet_conf, tokenizer, dropped_keys, jobs, as_json, quiet):
    """Show how WeNet would split the list SHARDS across ranks and workers, epoch by epoch.

    The list is shuffled with the same seed on every rank each epoch, then line i goes to
    consumer i mod (world_size x num_workers), consumer = worker x world_size + rank. For each
    epoch: shards, utterances and seconds of audio per rank and per (rank, worker), the spread
    (max/min seconds per rank), and whether the shard count divides. The shuffle is numpy's, not
    WeNet's RNG: the exact split differs, the imbalance it shows is typical. No shard is rewritten.

    With --index, an index cut short or a listed shard changed since it was indexed (its size or mtime:
    plan reads no shard, so a rewrite that keeps both is balance's to catch, by digest) exits 1 naming it
    (an index without completeness marks, from an older shardkit, is used with a note); the JSON
    document records the listed shards' stamps (source_stamps).

    --reader webdataset shows WebDataset's split first: wds.split_by_node then wds.split_by_worker
    give (rank, worker) `lines[rank::world_size][worker::num_workers]` of the unshuffled list, the
    same every epoch; with resampled=True each worker draws shards with replacement. WeNet's
    figures follow. The JSON document holds WebDataset's figures, with "resampled" and "wenet".

    --wenet-conf TRAIN.yaml applies the trainer's filter_conf first (the figures are of the audio
    that survives it) and reports what it drops per corpus, then simulates the trainer's batching
    (batch_conf, shuffle and sort buffers) and reports steps per rank and worker and what
    equal_steps would leave out; JSON: "wenet_conf" and "warnings".

    --layout nemo reads a NeMo tarred dataset's manifest (duration, shard_id) and shows NeMo's
    scatter (rank r: shards [r*(N//W), (r+1)*(N//W)), the last N % W read by no rank: named with
    their seconds) and replicate (every rank all N), workers [w::K]; --layout shar reads a Shar
    folder's cuts files and shows Lhotse's split_for_dataloading (rank r: [r::W], worker w: [w::K]).
    Per rank and worker: shards, utterances, seconds, steps (ceil(utterances / --batch-size) a worker).
    """
    from shardkit.cli._progress import ProgressBars
    from shardkit.commands.plan import PlanSettings, run_plan

    settings = PlanSettings(world_size=world_size, num_workers=num_workers, epochs=epochs, seed=seed, reader=reader,
                            draws=draws, index_files=tuple(index_files), wenet_conf=wenet_conf, tokenizer=tokenizer,
                            dropped_keys=dropped_keys, layout=layout, tars=tars, batch_size=batch_size)
    with ProgressBars(quiet=quiet) as bars:
        result = run_plan(list(shards), settings, run_options(jobs=jobs, on_event=bars))
    if result.failures:
        _fail(result, as_json)
    if as_json:
        emit_json(result.summary())
    if not quiet:
        show = format_figures if layout == "wenet" else _format_trainer
        click.echo("\n\n".join(show(f) for f in result.shown), err=True)
    if result.wenet_conf is not None:
        _print_wenet_conf(result, quiet)


def _fail(result, as_json: bool) -> None:
    """Shards that cannot be read: the JSON document lists them, the error names the first; exit 1."""
    if as_json:
        emit_json(result.summary())
    click.echo(f"Error: {len(result.failures)} of {result.shards} shards cannot be read; first: "
               f"{result.failures[0]['error']}", err=True)
    sys.exit(result.exit_code)


def _print_wenet_conf(result, quiet: bool) -> None:
    """--wenet-conf's report on stderr (quiet: its warnings only)."""
    from shardkit.wenet_conf.report import format_report

    warnings = result.warnings
    click.echo(format_report(result.wenet_conf, warnings) if not quiet else
               "\n".join(f"warning: {w}" for w in warnings), err=True, nl=bool(warnings) or not quiet)


def _format_trainer(figures: dict) -> str:
    """A trainer's dealing (``shardkit.planning.trainers``) as a table: per rank, then what no rank reads."""
    lines = [f"{figures['rule']}: {figures['shards']} shards over {figures['world_size']} ranks x "
             f"{figures['num_workers']} workers (divides: {'yes' if figures['divides'] else 'no'})",
             f"{'rank':>6} {'shards':>7} {'utterances':>11} {'seconds':>12} {'steps':>7}"]
    lines += [f"{r['rank']:>6} {r['shards']:>7} {r['utterances']:>11} {r['seconds']:>12.3f} {r['steps']:>7}"
              for r in figures["ranks"]]
    spread = figures["rank_spread"]
    lines.append(f"rank spread {spread if spread is not None else 'inf'} (max/min seconds), steps differ by "
                 f"{figures['step_spread']}")
    dropped = figures["dropped"]
    if dropped["shards"]:
        lines.append(f"read by no rank: {len(dropped['shards'])} shards, {dropped['utterances']} utterances, "
                     f"{dropped['seconds']:.3f} s: {', '.join(dropped['shards'])}")
    if figures["reads_per_utterance"] > 1:
        lines.append(f"every utterance is read {figures['reads_per_utterance']} times an epoch (one per rank)")
    return "\n".join(lines)
