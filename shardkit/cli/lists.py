from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import jobs_option, json_option, run_options


@click.group("list", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Example:
  shardkit list concat aishell/data.list libri/data.list -o train.list && shardkit list check train.list""")
def command():
    """Check, rewrite and concatenate WeNet data.list files (one shard path per line)."""


@command.command("check", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit list check data/zst/data.list
  shardkit list check train.list dev.list -j 8 --json > check.json""")
@click.argument("lists", nargs=-1, required=True, type=click.Path(dir_okay=False))
@jobs_option
@click.option("--max-member-bytes", type=click.IntRange(min=1), default=2 << 30, show_default=True,
              help="Refuse members larger than this (memory stays bounded).")
@json_option
@click.option("-q", "--quiet", is_flag=True, help="No per-line table, progress bar or summary.")
def check(lists, jobs, max_member_bytes, as_json, quiet):
    """Read every shard named by LISTS through: does each line exist and hold a readable shard?

    Prints a header and one row per line on stdout (LIST:LINE, status, compression by magic bytes,
    members, utterances, path, problems), then a summary on stderr. A line is bad when its file is missing
    or is not a complete, readable tar; blank and comment lines, relative paths, whitespace around
    a path and shards listed twice are reported as WeNet would meet them. URLs are not checked.
    Exit 1 if any line is bad.
    """

    from shardkit.cli._progress import ProgressBars
    from shardkit.commands.lists import check_lists

    with ProgressBars(quiet=quiet, min_total=2) as bars:
        report = check_lists(list(lists), run_options(jobs=jobs, on_event=bars), max_member_bytes=max_member_bytes)
    summary = report.summary()
    if as_json:
        emit_json(summary)
    elif not quiet:
        _echo_table(summary["entries"])
    if not quiet:
        _echo_totals(summary)
    sys.exit(report.exit_code)


def _echo_table(entries: list[dict]) -> None:
    """The per-line table on stdout: a header, then LIST:LINE, status, compression, counts, path and problems."""
    if entries:
        click.echo(f"{'LIST:LINE'}\t{'status':<9} {'comp':<4} {'members':>7} {'utts':>6}  path\tproblems")
    for e in entries:
        notes = ([e["error"]] if e["error"] else []) + e["warnings"]
        counts = f"{e['members']:>7} {e['utterances']:>6}" if e["status"] == "ok" else f"{'-':>7} {'-':>6}"
        click.echo(f"{e['list']}:{e['line']}\t{e['status']:<9} {e['compression'] or '-':<4} {counts}  "
                   f"{e['path'] or e['text']!s}" + (f"\t{'; '.join(notes)}" if notes else ""))


def _echo_totals(summary: dict) -> None:
    """The summary on stderr, and the zstd-hook note when zst shards are listed."""
    click.echo(f"{summary['ok']} ok, {summary['bad']} bad, {summary['unchecked']} unchecked of {summary['lines']} "
               f"lines; {summary['utterances']} utterances in {summary['members']} members, "
               f"{summary['bytes'] / 1e6:.1f} MB; compression: "
               + (", ".join(f"{k} {v}" for k, v in summary["compression"].items()) or "-"), err=True)
    if summary["need_zstd_hook"]:
        click.echo(f"note: {summary['need_zstd_hook']} zst shards: on Python < 3.14 WeNet reads them only with "
                   "the hook (run `shardkit wenet enable-zstd` in the training environment)", err=True)


@command.command("rewrite", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Examples:
  shardkit list rewrite data/bz2/data.list --suffix .tar.zst --dir data/zst -o data/zst/train.list
  shardkit list rewrite data.list --suffix .tar --no-check -o data.plain.list""")
@click.argument("list_path", metavar="LIST", type=click.Path(dir_okay=False))
@click.option("--suffix", required=True, help="New shard suffix: .tar, .tar.zst, .tar.gz, .tar.bz2, .tar.xz, ...")
@click.option("--dir", "new_dir", type=click.Path(file_okay=False), default=None,
              help="Also move every shard path into this folder (made absolute), where convert -o put it: "
                   "below the mirrored folders when shard names repeat.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Every new path must exist and hold the compression its suffix names.")
@click.option("-o", "--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="List file to write (never the input).")
@json_option
def rewrite(list_path, suffix, new_dir, check, out_path, as_json):
    """Write a copy of LIST with each shard's suffix replaced, e.g. after `shardkit convert`.

    `/a/shards_000000001.tar.bz2` becomes `/a/shards_000000001.tar.zst` (or `NEW_DIR/...` with
    --dir); blank and comment lines are copied as they are. Nothing is written if a new path is
    missing or its content does not match the suffix (unless --no-check). The output is written
    to a temporary name, fsynced and renamed.
    """
    from shardkit.commands.lists import rewrite_list

    result = rewrite_list(list_path, out_path, suffix=suffix, new_dir=new_dir, check=check)
    if as_json:
        emit_json(result)
    click.echo(f"wrote {result['out']}: {result['entries']} shard lines, {result['rewritten']} rewritten"
               + ("" if check else " (not checked)")
               + (f"; {result['urls_not_checked']} URLs not checked" if result["urls_not_checked"] else ""), err=True)


@command.command("concat", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP}

\b
Example:
  shardkit list concat aishell2/data.list librispeech/data.list accented/data.list -o train.list""")
@click.argument("lists", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="List file to write (never one of the inputs).")
@click.option("--shuffle", is_flag=True, help="Shuffle the lines (WeNet shuffles the list again each epoch).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --shuffle.")
@click.option("--allow-duplicates", is_flag=True,
              help="Keep a shard listed twice (WeNet reads it twice per epoch) instead of refusing.")
@json_option
def concat(lists, out_path, shuffle, seed, allow_duplicates, as_json):
    """Join several corpora's LISTS into one data.list, since WeNet takes one list per run.

    Lines keep their order (lists in the order given) unless --shuffle; relative paths become
    absolute against their list's folder; blank and comment lines are dropped. A shard named
    twice is refused with both places named. The output is written atomically.
    """
    from shardkit.commands.lists import concat_lists

    result = concat_lists(list(lists), out_path, shuffle=shuffle, seed=seed, allow_duplicates=allow_duplicates)
    if as_json:
        emit_json(result)
    parts = ", ".join(f"{p['list']} {p['lines']}" for p in result["lists"])
    click.echo(f"wrote {result['out']}: {result['lines']} shard lines ({parts})"
               + (f", shuffled with seed {seed}" if shuffle else ""), err=True)
