from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, emit_json
from shardkit.cli._options import io_options, json_option


@click.command("loader-check", context_settings=CONTEXT_SETTINGS, epilog="""Exit codes: 0 every rank reads the same \
number of utterances and batches, 1 they differ, 2 usage errors.

\b
Example:
  shardkit loader-check data/train/data.list --world-size 8 --num-workers 4 --batch-size 16
  shardkit loader-check data/train/data.list --world-size 2 --num-workers 2 --engine shardkit   # no torch""")
@click.argument("data_list", type=click.Path(exists=True, dir_okay=False))
@click.option("--world-size", type=click.IntRange(min=1), required=True, help="Ranks (GPUs) to simulate.")
@click.option("--num-workers", type=click.IntRange(min=0), required=True,
              help="DataLoader worker processes per rank (0: read in the main process).")
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="Utterances per batch (static batching, per worker, as WeNet's 'static' batch type).")
@click.option("--seed", type=int, default=0, show_default=True, help="Shuffle seed of the list.")
@click.option("--epoch", type=click.IntRange(min=0), default=0, show_default=True, help="Epoch whose shuffle to read.")
@click.option("--engine", type=click.Choice(["auto", "torch", "shardkit"]), default="auto", show_default=True,
              help="torch: a DataLoader over shardkit's dataset; shardkit: shardkit's reader in worker processes "
                   "(no torch needed); auto: torch when it is installed.")
@io_options
@json_option
def command(data_list, world_size, num_workers, batch_size, seed, epoch, engine, as_json):
    """Read DATA_LIST once per rank, as the W x K consumers of training would.

    Each rank of the simulated world gets a DataLoader over shardkit's torch dataset with
    --num-workers workers (or, with --engine shardkit or without torch, that many processes
    running shardkit's reader); lines are split by rank and worker as WeNet splits them. Reports utterances, batches and seconds per
    rank, and whether every rank gets the same number of utterances and batches.
    """
    from shardkit.commands.loader_check import LoaderCheckSettings, run_loader_check

    settings = LoaderCheckSettings(world_size=world_size, num_workers=num_workers, batch_size=batch_size, seed=seed,
                                   epoch=epoch, engine=engine)
    # no progress bar: loader-check's stderr is the rank lines and the verdict below
    report = run_loader_check(data_list, settings)
    if as_json:
        emit_json(report)
    _print_ranks(report)
    sys.exit(0 if report["ok"] else 1)


def _print_ranks(report: dict) -> None:
    """Each rank's figures and the verdict, on stderr."""
    for r in report["ranks"]:
        click.echo(f"rank {r['rank']}: {r['utterances']} utterances in {r['batches']} batches, "
                   f"{r['seconds']:.1f} s of audio", err=True)
    verdict = "every rank reads the same number of utterances and batches" if report["ok"] else \
        "ranks differ: a training epoch would end with ranks waiting for the longest"
    spread = report["rank_seconds_spread"]
    click.echo(f"loader check ({report['engine']} engine): {verdict} (seconds of audio, max/min over ranks: "
               f"{'-' if spread is None else f'{spread:.3g}'})", err=True)
