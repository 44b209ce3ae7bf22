"""``plan --wenet-conf``: a shard list's figures after WeNet's filter, and the trainer's report on it.

The list's columns come from its index files, or from the records of the listed shards indexed now
(the caller's ``read_shards``: plan passes ``shardkit.commands.index.indexed_shards``); the filter
(:mod:`~shardkit.wenet_conf.verdict`) keeps what the trainer would, and the batch simulation
(:mod:`~shardkit.wenet_conf.simulation`) follows the list's lines, a shard's kept utterances in
index order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from shardkit.errors import UsageError
from shardkit.wenet_conf.columns import ColumnCollector, UttColumns, index_columns
from shardkit.wenet_conf.load import TrainerSpec
from shardkit.wenet_conf.simulation import Loader, plan_batches
from shardkit.wenet_conf.verdict import apply_filter


def batches_of_lines(cols: UttColumns, keep: np.ndarray, line_shards: Sequence[int], spec: TrainerSpec,
                     loader: Loader) -> dict:
    """Simulated batches of a list whose line i is the shard ``cols.shards[line_shards[i]]`` (its kept
    utterances, in index order)."""
    kept = np.flatnonzero(keep)
    by_shard = kept[np.argsort(cols.shard[kept], kind="stable")]
    counts = np.bincount(cols.shard[kept], minlength=len(cols.shards))
    starts = np.concatenate([[0], np.cumsum(counts)])
    line_shards = np.asarray(line_shards, np.int64)
    lengths = counts[line_shards]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ends_before = offsets[:-1]
    utts = by_shard[np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(starts[line_shards] - ends_before, lengths)]
    return plan_batches(offsets, cols.samples[utts], cols.rate[utts], cols.seconds[utts], loader, spec.conf)


# the index records of shards read now: ``(shard, records, error)`` per shard, in the order given
ShardReader = Callable[[list[str]], Iterable[tuple[str, list[dict] | None, str | None]]]


@dataclass
class ListView:
    """``plan --wenet-conf``: the list's figures after the filter, and the trainer's report."""

    utterances: np.ndarray
    seconds: np.ndarray
    report: dict
    dropped_keys: list[str]


def plan_list(paths: Sequence[str], spec: TrainerSpec, loader: Loader, read_shards: ShardReader, *,
              index_files: Sequence[str] = ()) -> tuple[ListView | None, list[dict]]:
    """``(view, failures)`` of a shard list (from indexes when given, else from ``read_shards`` of the
    distinct listed shards, as ``shard_sizes``); the view is None when a shard failed."""
    cols, failures = _list_columns(paths, index_files, spec.tokenizer is not None, read_shards)
    if failures:
        return None, failures
    result = apply_filter(cols, spec)
    ids = {s: i for i, s in enumerate(cols.shards)}
    line_shards = [ids[p] for p in paths]
    keep = result.keep
    per_shard_utts = np.bincount(cols.shard[keep], minlength=len(cols.shards))
    per_shard_secs = np.bincount(cols.shard[keep], weights=cols.seconds[keep], minlength=len(cols.shards))
    batches = batches_of_lines(cols, keep, line_shards, spec, loader)
    report = {**spec.header(), "filter": result.summary, "batches": batches}
    view = ListView(per_shard_utts[line_shards], per_shard_secs[line_shards], report, result.dropped_keys)
    return view, []


def _list_columns(paths: Sequence[str], index_files: Sequence[str], want_txt: bool,
                  read_shards: ShardReader) -> tuple[UttColumns, list[dict]]:
    """The columns of the listed shards: from the index files (every listed shard must be in one, as
    ``shard_sizes`` requires), else from the records of the shards read now."""
    unique = list(dict.fromkeys(paths))
    if index_files:
        cols = index_columns(index_files, want_txt=want_txt, keep=set(unique))
        missing = [s for s in unique if s not in set(cols.shards)]
        if missing:
            raise UsageError(f"{len(missing)} listed shards are in no index given with --index (first: {missing[0]})")
        return cols, []
    builder = ColumnCollector(want_txt, {s: i for i, s in enumerate(unique)})
    failures = []
    for shard, records, error in read_shards(unique):
        if error is not None:
            failures.append({"shard": shard, "error": error})
        else:
            for record in records:
                builder.add(record, shard)
    return builder.columns(), failures
