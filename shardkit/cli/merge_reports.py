from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import json_option


@click.command("merge-reports", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}
Missing slices, slices of different lists or settings, or a slice list that no longer matches its
report (a line dropped, repeated, moved or edited, a listed shard rewritten since) exit 1 and write nothing.

\b
Examples (a Slurm job array of 3, then the merge):
  sbatch --array=1-3 --wrap 'shardkit convert data.list -o /shared/zst --split $SLURM_ARRAY_TASK_ID/3'
  shardkit merge-reports /shared/zst --command convert
  sbatch --array=1-3 --wrap 'shardkit validate data.list --report /shared/v/validate.json \\
      --quarantine /shared/q --split $SLURM_ARRAY_TASK_ID/3'
  shardkit merge-reports /shared/v --command validate     # also rebuilds /shared/q/rejects.jsonl, data.list
  shardkit merge-reports /shared/balanced --command balance
  shardkit merge-reports /shared/made --command make""")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--command", "report", default="convert", show_default=True,
              help="Whose slice reports to merge: COMMAND.slice-I-of-N.json (convert, validate, balance, make; for "
                   "validate, the stem of the --report FILE the slices were given).")
@json_option
@click.option("-q", "--quiet", is_flag=True, help="No summary on stderr.")
def command(out_dir, report, as_json, quiet):
    """Merge the per-slice reports of a `--split I/N` job array in OUT_DIR into one.

    Reads OUT_DIR/COMMAND.slice-I-of-N.json and OUT_DIR/data.slice-I-of-N.list for I = 1..N,
    checks that all N slices are there and were cut from the same input list with the same
    settings, and writes OUT_DIR/COMMAND.json and OUT_DIR/data.list as one run over the whole
    list would have (atomically; the slice files are kept). Exit 1 if a merged entry failed.
    Each slice's report records the lines of its list and the listed shards' sizes: a list file
    that differs (the first differing line is named) or a shard whose size changed is refused, as
    is a shard listed by two slices.
    convert and make: the slices' by-product indexes (index.slice-I-of-N.parquet) become
    OUT_DIR/index.parquet, row group by row group, the index one run writes.
    While it writes it holds the folder lock a run of COMMAND without --split takes (for validate,
    on the quarantine folder too): if such a run is writing there, the merge refuses (exit 2)
    naming its pid and host, and a run started during the merge refuses the same way.

    validate: findings are joined in input order, totals summed, and the duplicate-key check is
    redone across slices (a slice sees only its own keys). With --quarantine, the quarantine
    folder's rejects.slice-I-of-N.jsonl and data.slice-I-of-N.list become rejects.jsonl and
    data.list; a shard that holds a key of an earlier slice is quarantined again from its source.
    Exit 1 if there is any finding (make: any skipped utterance, as a single run).

    balance --layout nemo: the slices' per-shard manifest parts become OUT_DIR/tarred_audio_manifest.json
    and OUT_DIR/nemo_config.yaml (printed), as a single run writes them; --layout shar needs nothing more.
    """
    from shardkit.commands import merge_reports

    result = merge_reports(out_dir, report)
    if as_json:
        emit_json(result.summary)
    if not quiet:
        click.echo(result.text(), err=True)
    layout = result.summary.get("layout")
    if layout is not None and not as_json:  # balance --layout: the piece to paste, as a single run prints it
        click.echo(layout.get("config_fragment") or f"read it with: {layout['reader']}")
    sys.exit(result.exit_code)
