"""The order of a worker's samples (pure): the list's shards in reading order per consumer, then the
shuffle buffer (modelled) and the sort buffer (exact).

The buffer (torch's ``Shuffler``: once full, each new sample swaps with a uniformly chosen one) is
modelled as: each sample leaves after a geometric wait of mean ``shuffle_size`` steps (the chance
of being picked at each step), samples ordered by leaving time. The sort buffer sorts chunks of
``sort_size`` consecutive samples by frames, Python's stable sort, as ``SortDataPipe`` does.
"""

from __future__ import annotations

import numpy as np

from shardkit.planning.radix import stable_argsort
from shardkit.wenet_conf.conf import TrainerConf


def consumer_utterances(shard_offsets: np.ndarray, order: np.ndarray, consumers: int) -> tuple[np.ndarray, np.ndarray]:
    """``(utterance ids in reading order, start of each consumer in it)`` for one epoch's list order.

    ``shard_offsets``: CSR offsets (shard i's utterances are ``shard_offsets[i]:shard_offsets[i+1]``,
    in shard order); ``order[p]``: the shard read at list position p; position p goes to consumer
    ``p mod consumers``, which reads its positions in order.
    """
    positions = np.arange(len(order))
    by_consumer = np.argsort(positions % consumers, kind="stable")
    seq = order[by_consumer]
    lengths = (shard_offsets[1:] - shard_offsets[:-1])[seq]
    total = int(lengths.sum())
    starts = shard_offsets[:-1][seq]
    # expand each shard of the sequence into its utterance ids (a vectorised concatenation of ranges)
    ends_before = np.cumsum(lengths) - lengths
    utts = np.arange(total, dtype=np.int64) + np.repeat(starts - ends_before, lengths)
    shards_per_consumer = np.bincount(positions % consumers, minlength=consumers)
    consumer_of_seq = np.repeat(np.arange(consumers), shards_per_consumer)
    per_consumer = np.bincount(consumer_of_seq, weights=lengths, minlength=consumers).astype(np.int64)
    return utts, np.concatenate([[0], np.cumsum(per_consumer)])


def consumer_positions(bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(consumer, position within the consumer)`` of every element of a consumer-contiguous sequence."""
    sizes = np.diff(bounds)
    consumer = np.repeat(np.arange(len(sizes)), sizes)
    return consumer, np.arange(int(bounds[-1]), dtype=np.int64) - bounds[:-1][consumer]


def buffered_order(frames: np.ndarray, bounds: np.ndarray, conf: TrainerConf, rng: np.random.Generator) -> np.ndarray:
    """A permutation of a consumer-contiguous sequence: each consumer's samples after the shuffle
    buffer (modelled, see the module docstring) and the sort buffer (exact: chunks of ``sort_size``
    consecutive samples, each sorted by frames, Python's stable sort).

    Long consumers are ordered one at a time (their sorts stay in cache; a sort buffer's chunks are
    the rows of a matrix, sorted row by row, by radix when the frames fit in 16 bits); many short
    ones together, through one sort of a combined key. Both give the same permutation."""
    n = len(frames)
    if n and n >= _CONSUMER_AT_A_TIME * (len(bounds) - 1):
        return _buffered_order_per_consumer(frames, bounds, conf, rng)
    consumer, pos = consumer_positions(bounds)
    perm = np.arange(len(frames), dtype=np.int64)
    if conf.shuffle and len(frames):
        size = conf.shuffle_size
        leave = np.maximum(pos, size - 1) + rng.geometric(1.0 / size, len(frames))
        perm = _stable_order(consumer, leave)
    if conf.sort and len(frames):
        # positions after the shuffle are pos again (the sequence keeps its bounds): chunk c of a
        # consumer is its positions c*sort_size ... (c+1)*sort_size - 1, numbered across consumers
        chunks = -(-np.diff(bounds) // conf.sort_size)
        chunk = (np.concatenate([[0], np.cumsum(chunks)])[:-1])[consumer] + pos // conf.sort_size
        perm = perm[_stable_order(chunk, frames[perm])]
    return perm


# samples per consumer (on average) from which buffered_order takes consumers one at a time
_CONSUMER_AT_A_TIME = 4096


def _buffered_order_per_consumer(frames: np.ndarray, bounds: np.ndarray, conf: TrainerConf,
                                 rng: np.random.Generator) -> np.ndarray:
    """:func:`buffered_order`, consumer by consumer (the shuffle's draws made for all at once, as there)."""
    perm = np.arange(len(frames), dtype=np.int64)
    draws = _shuffle_draws(len(frames), bounds, conf, rng)
    values = _radix_ready(frames) if conf.sort else frames
    for c in range(len(bounds) - 1):
        a, b = int(bounds[c]), int(bounds[c + 1])
        local = _consumer_order(values[a:b], None if draws is None else draws[a:b], conf) if a < b else None
        if local is not None:
            perm[a:b] = local + a
    return perm


def _shuffle_draws(n: int, bounds: np.ndarray, conf: TrainerConf, rng: np.random.Generator) -> np.ndarray | None:
    """Each sample's geometric wait in the shuffle buffer (None: no shuffle), in 32 bits when the leaving
    times fit (the same order, a faster sort)."""
    if not conf.shuffle:
        return None
    draws = rng.geometric(1.0 / conf.shuffle_size, n)
    if int(draws.max()) + conf.shuffle_size + int(np.diff(bounds).max()) < (1 << 31):
        draws = draws.astype(np.int32)
    return draws


def _radix_ready(frames: np.ndarray) -> np.ndarray:
    """The frames as uint16 where they fit (the same order, sorted by radix), else as they are."""
    if int(frames.min()) >= 0 and int(frames.max()) < (1 << 16):
        return frames.astype(np.uint16)
    return frames


def _consumer_order(values: np.ndarray, draws: np.ndarray | None, conf: TrainerConf) -> np.ndarray | None:
    """One consumer's permutation: by leaving time from the shuffle buffer, then each sort chunk by
    frames (None: neither buffer, the samples leave as they came)."""
    local = None
    if draws is not None:
        leave = np.maximum(np.arange(len(values), dtype=draws.dtype), conf.shuffle_size - 1) + draws
        local = stable_argsort(leave)
    if conf.sort:
        order = _sort_chunks(values if local is None else values[local], conf.sort_size)
        local = order if local is None else local[order]
    return local


def _sort_chunks(values: np.ndarray, size: int) -> np.ndarray:
    """The permutation that stably sorts each run of ``size`` consecutive values (the last may be shorter)."""
    length = len(values)
    full = length // size * size
    out = np.empty(length, np.int64)
    if full:
        rows = np.argsort(values[:full].reshape(-1, size), axis=1, kind="stable")
        rows += np.arange(0, full, size)[:, None]
        out[:full] = rows.ravel()
    if full < length:
        out[full:] = np.argsort(values[full:], kind="stable") + full
    return out


def _stable_order(primary: np.ndarray, secondary: np.ndarray) -> np.ndarray:
    """``np.lexsort((secondary, primary))`` (non-negative integers), through one stable sort of a
    combined key when it fits in 62 bits: several times faster on a million samples."""
    if not len(primary):
        return np.zeros(0, np.int64)
    stride = int(secondary.max()) + 1
    if int(primary.max()) * stride + stride < (1 << 62):
        return np.argsort(primary.astype(np.int64) * stride + secondary, kind="stable")
    return np.lexsort((secondary, primary))

