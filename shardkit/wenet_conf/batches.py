"""The trainer's batches over an ordered, consumer-contiguous sequence of samples (pure): WeNet's
static, bucket and dynamic batching (``batch_conf``), as a batch number or a batch start per sample.

Static and bucket batch counts per worker do not depend on the order of the samples; dynamic
batches (``DynamicBatchWindow``) do, and are followed exactly over the order
:mod:`shardkit.wenet_conf.order` gives.
"""

from __future__ import annotations

import math

import numpy as np

from shardkit.wenet_conf.conf import BatchConf
from shardkit.wenet_conf.order import consumer_positions


def dynamic_batch_starts(frames: np.ndarray, bounds: np.ndarray, max_frames: int, *,
                         precompute: bool | None = None) -> np.ndarray:
    """Where each batch of WeNet's dynamic window starts, per consumer (a bool mark per sample).

    A batch that starts at sample s takes the next samples while (its longest frames) x (its size)
    stays within ``max_frames`` (``DynamicBatchWindow``: before adding a sample the window checks
    ``longest x (buffer + 1)``; a sample that alone exceeds the limit is a batch of one). The
    batches are followed from each consumer's first sample, one batch per step for all consumers
    together. By default each step reads a window of the next samples of every consumer (running
    maxima over a small matrix, widened for the rare batch longer than the window): no per-sample
    table. ``precompute`` True or False takes the older binary lifting over a table of range maxima
    (lengths for every sample beforehand, or per step); all three give the same batches.
    """
    n = len(frames)
    marks = np.zeros(n, bool)
    if n == 0:
        return marks
    bounds = np.asarray(bounds, np.int64)
    cur, end = bounds[:-1].copy(), bounds[1:].copy()
    keep = cur < end
    cur, end = cur[keep], end[keep]
    if precompute is not None:
        return _table_walk(np.asarray(frames, np.int64), bounds, max_frames, cur, end, marks, precompute)
    frames = np.asarray(frames)
    if frames.dtype.kind not in "iu":  # as the table walks read them
        frames = frames.astype(np.int64)
    width = _window_width(frames, bounds, max_frames)
    while len(cur):
        marks[cur] = True
        cur = cur + _window_lengths(frames, cur, end, max_frames, width)
        keep = cur < end
        cur, end = cur[keep], end[keep]
    return marks


def _window_width(frames: np.ndarray, bounds: np.ndarray, max_frames: int) -> int:
    """The window a step reads: a power of two past twice a typical batch (speed only, not the result)."""
    sample = frames[:: max(1, len(frames) // 10001)]
    typical = max_frames // max(1, int(np.median(sample)))
    width = 8
    while width < 2 * typical + 8:
        width *= 2
    return min(width, max(1, _longest_batch(frames, bounds, max_frames)))


def _window_lengths(frames: np.ndarray, cur: np.ndarray, end: np.ndarray, max_frames: int,
                    width: int) -> np.ndarray:
    """The dynamic batch length from each ``cur`` (at least 1), not past ``end``: the samples of a
    window of ``width`` that keep (running maximum) x (size) within ``max_frames`` (a prefix, as both
    factors only grow); a batch that fills its window is measured again in a window twice as wide."""
    got, decided = _window_try(frames, cur, end, max_frames, width)
    todo = np.flatnonzero(~decided)
    while len(todo):
        width *= 2
        rows = max(1, (1 << 22) // width)  # bound the matrix when a window grows wide
        undecided = []
        for r in range(0, len(todo), rows):
            part = todo[r:r + rows]
            got[part], decided = _window_try(frames, cur[part], end[part], max_frames, width)
            undecided.append(part[~decided])
        todo = np.concatenate(undecided)
    return np.maximum(got, 1)


def _window_try(frames: np.ndarray, start: np.ndarray, stop: np.ndarray, max_frames: int,
                width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(samples that fit from each start within a window of width, whether that is the batch's length)``."""
    idx = start[:, None] + np.arange(width)
    peak = np.maximum.accumulate(frames[np.minimum(idx, len(frames) - 1)], axis=1)
    ok = (idx < stop[:, None]) & (peak * np.arange(1, width + 1) <= max_frames)
    got = ok.sum(axis=1)
    return got, (got < width) | (start + width >= stop)


def _table_walk(f: np.ndarray, bounds: np.ndarray, max_frames: int, cur: np.ndarray, end: np.ndarray,
                marks: np.ndarray, precompute: bool) -> np.ndarray:
    """:func:`dynamic_batch_starts` by binary lifting over a table of range maxima: lengths for every
    sample at once (``precompute``) or for the current starts at each step."""
    n = len(f)
    table = _max_table(f, _longest_batch(f, bounds, max_frames))
    following = None
    if precompute:
        consumer = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
        following = np.arange(n, dtype=np.int64) + _batch_lengths(table, np.arange(n, dtype=np.int64),
                                                                  bounds[1:][consumer], max_frames)
    while len(cur):
        marks[cur] = True
        cur = following[cur] if following is not None else cur + _batch_lengths(table, cur, end, max_frames)
        keep = cur < end
        cur, end = cur[keep], end[keep]
    return marks


def _longest_batch(f: np.ndarray, bounds: np.ndarray, max_frames: int) -> int:
    """An upper bound of a dynamic batch's size: a consumer's length, or the limit over the shortest sample."""
    longest = int(np.diff(bounds).max())
    smallest = int(f.min())
    return min(longest, max_frames // smallest + 1) if smallest > 0 else longest


def _max_table(f: np.ndarray, longest: int) -> list[np.ndarray]:
    """``table[k][i] = max(f[i : i + 2**k])`` (clipped at the end), for 2**k up to past ``longest``."""
    levels = max(1, math.ceil(math.log2(longest + 1)))
    table = [f]
    for k in range(1, levels + 1):
        prev, step = table[-1], 1 << (k - 1)
        nxt = prev.copy()
        if step < len(f):
            nxt[:-step] = np.maximum(prev[:-step], prev[step:])
        table.append(nxt)
    return table


def _batch_lengths(table: list[np.ndarray], start: np.ndarray, seg_end: np.ndarray, max_frames: int) -> np.ndarray:
    """The dynamic batch length from each ``start`` (at least 1), not past ``seg_end``: the largest size
    whose (longest frames) x (size) stays within ``max_frames``, found bit by bit from the top."""
    n = len(table[0])
    size = np.zeros(len(start), np.int64)
    best = np.zeros(len(start), np.int64)
    for k in range(len(table) - 1, -1, -1):
        cand = size + (1 << k)
        peak = np.maximum(best, table[k][np.minimum(start + size, n - 1)])
        ok = (start + cand <= seg_end) & (peak * cand <= max_frames)
        size = np.where(ok, cand, size)
        best = np.where(ok, peak, best)
    return np.maximum(size, 1)


def batch_ids(frames: np.ndarray, bounds: np.ndarray, batch: BatchConf) -> np.ndarray:
    """A batch number per sample of the ordered, consumer-contiguous sequence: numbers increase
    along each consumer in the order its batches leave the worker, and never repeat across consumers."""
    consumer, pos = consumer_positions(bounds)
    if batch.batch_type == "static":
        per = -(-np.diff(bounds) // batch.batch_size)
        first = np.concatenate([[0], np.cumsum(per)])[:-1]
        return first[consumer] + pos // batch.batch_size
    if batch.batch_type == "dynamic":
        return np.cumsum(dynamic_batch_starts(frames, bounds, batch.max_frames_in_batch)) - 1
    return _bucket_batch_ids(frames, consumer, pos, batch)


def _bucket_batch_ids(frames, consumer, pos, batch: BatchConf) -> np.ndarray:
    """``bucket_by_sequence_length``: bucket = the first boundary above the frames; a bucket's batch
    leaves when it holds its size, the partial ones at the end of the worker in the order their
    buckets were opened. (torch's ``Grouper`` also empties its biggest bucket when 10000 samples wait,
    which these batch sizes never reach.)"""
    n = len(frames)
    if n == 0:
        return np.zeros(0, np.int64)
    sizes = np.asarray(batch.bucket_batch_sizes, np.int64)
    bucket = np.searchsorted(np.asarray(batch.bucket_boundaries, np.int64), frames, side="right")
    group = consumer.astype(np.int64) * len(sizes) + bucket
    order = np.lexsort((pos, group))
    g_sorted = group[order]
    first_of_group = np.concatenate([[True], g_sorted[1:] != g_sorted[:-1]])
    group_start = np.flatnonzero(first_of_group)
    rank_in_group = np.arange(n) - np.repeat(group_start, np.diff(np.append(group_start, n)))
    size = sizes[g_sorted % len(sizes)]
    count = np.repeat(np.diff(np.append(group_start, n)), np.diff(np.append(group_start, n)))
    nth = rank_in_group // size
    full = (nth + 1) * size <= count
    # when the batch leaves: the position of its last sample if full, else after the worker's last
    # sample, in the order of its first sample
    last_pos = np.where(full, pos[order][np.minimum(np.arange(n) - rank_in_group % size + size - 1, n - 1)], 0)
    first_pos = pos[order][np.arange(n) - rank_in_group % size]
    leave = np.where(full, last_pos, (1 << 40) + first_pos)
    _, inverse = np.unique(consumer[order].astype(np.int64) * (1 << 42) + leave, return_inverse=True)
    ids = np.empty(n, np.int64)
    ids[order] = inverse.ravel()
    return ids

