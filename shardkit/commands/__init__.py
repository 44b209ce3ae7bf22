"""One module or package per command: the library functions behind the CLI, each returning a
result. Step commands (convert, validate, index, make, lists, verify, bench, demo, loader_check) are
independent of one another; pipeline commands (balance) may call steps."""

from __future__ import annotations

from typing import Callable


def report_merger(kind: str) -> Callable | None:
    """The registry of commands whose ``--split`` reports need more than the generic join: the
    command's own ``merge_reports(slices)``, or None (convert, index: ``run.merge.write_merged``)."""
    if kind == "validate":
        from shardkit.commands.validate.merge import merge_reports
    elif kind == "make":
        from shardkit.commands.make.report import merge_reports
    elif kind == "balance":
        from shardkit.commands.balance.report import merge_reports
    else:
        return None
    return merge_reports


def merge_reports(out_dir: str, command: str = "convert", **options):
    """``shardkit.run.merge.merge_reports`` with every command's own merger: what ``merge-reports`` runs;
    a ``shardkit.run.merge.MergeResult`` (``summary``, ``text()``, ``exit_code``)."""
    from shardkit.run.merge import merge_reports as merge_slices

    return merge_slices(out_dir, command, mergers=report_merger, **options)
