"""The trainer's batches of a shard list, epoch by epoch (pure: numbers in, numbers out, no I/O).

Everything follows WeNet's ``wenet/dataset/dataset.py`` and ``processor.py`` (read at 01546996,
see docs/reference/wenet-format.md):

    list shuffle -> (rank, worker) split -> tokenize -> filter -> resample -> speed perturb ->
    features -> spec_trim -> shuffle buffer -> sort buffer -> batch (static | bucket | dynamic)

The filter (:mod:`~shardkit.wenet_conf.filter`) and the feature frames
(:mod:`~shardkit.wenet_conf.frames`) come first; this module takes the frames of the survivors and
follows each (rank, worker) through its shuffle and sort buffers
(:mod:`~shardkit.wenet_conf.order`) into batches (:mod:`~shardkit.wenet_conf.batches`).

What is exact and what is a model:

* **static and bucket** batch counts per worker do not depend on the order of the samples: they
  are exact for the epoch's list shuffle (numpy's permutation, as ``shardkit plan``);
* **dynamic** batches depend on the order the shuffle buffer leaves, which is modelled (see
  :mod:`~shardkit.wenet_conf.order`); sort buffers and the dynamic window are then exact. The
  figures are one draw for the epoch's seed, like the list shuffle.

Batches per rank: the DataLoader (``batch_size=None``) takes batches from its workers in turn
and skips a worker that ran dry, so a rank's steps = the sum of its workers' batches, and the
batches a rank steps last are its busiest workers' last ones. ``equal_steps`` stops every rank
at the smallest rank's count: a rank leaves out (its steps - the minimum) batches, the last ones
in that order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardkit.planning.partition import shuffled_order
from shardkit.wenet_conf.batches import batch_ids, dynamic_batch_starts
from shardkit.wenet_conf.conf import BatchConf, TrainerConf
from shardkit.wenet_conf.frames import feature_frames
from shardkit.wenet_conf.order import buffered_order


@dataclass(frozen=True)
class Loader:
    """Who reads the list: ``world_size`` ranks of ``num_workers`` loader workers each, the list shuffled
    with ``seed`` each epoch (numpy's permutation for (seed, epoch)), ``epochs`` simulated."""

    world_size: int
    num_workers: int
    seed: int = 0
    epochs: int = 1

    @property
    def consumers(self) -> int:
        """Loader workers in all: list line i goes to consumer i mod consumers."""
        return self.world_size * self.num_workers



@dataclass
class EpochBatches:
    """One epoch's batches: per (rank, worker) counts, per rank steps and what equal_steps leaves out."""

    epoch: int
    worker_batches: np.ndarray  # [world_size, num_workers]
    rank_steps: np.ndarray  # [world_size]
    left_out_batches: np.ndarray  # [world_size]
    left_out_seconds: np.ndarray  # [world_size]
    rank_seconds: np.ndarray  # [world_size]

    def summary(self) -> dict:
        """The simulated epoch for the report: steps per rank, batches per worker, their spread, and what
        ``equal_steps`` would leave out (batches and seconds per rank, and their share of the epoch).
        """
        steps = self.rank_steps
        return {"epoch": self.epoch, "steps_per_rank": steps.tolist(),
                "batches_per_worker": self.worker_batches.tolist(),
                "steps_min": int(steps.min()), "steps_max": int(steps.max()),
                "steps_spread": int(steps.max() - steps.min()),
                "equal_steps_left_out": {"batches": self.left_out_batches.tolist(),
                                         "seconds": [round(float(s), 3) for s in self.left_out_seconds],
                                         "share_of_seconds": round(float(self.left_out_seconds.sum())
                                                                   / max(float(self.rank_seconds.sum()), 1e-12), 6)}}


# utterances of consumers simulated together (their order's temporaries): ~2 M, a few hundred MB
BLOCK_UTTERANCES = 1 << 21


def simulate_epoch(shard_offsets, frames, seconds, loader: Loader, conf: TrainerConf, *, epoch: int,
                   block_utterances: int = BLOCK_UTTERANCES) -> EpochBatches:
    """Batches of every (rank, worker) of ``loader`` in one epoch of the list whose shards hold the given
    utterances (``loader.epochs`` is not read: ``epoch`` is the one simulated).

    ``shard_offsets``: CSR offsets of each list line's utterances (in shard order) into ``frames``
    (feature frames, after the filter; any integer dtype, kept) and ``seconds`` (audio seconds, for
    what is left out).

    Consumers are taken in blocks of about ``block_utterances`` utterances, in consumer order (each
    consumer's samples, shuffle and batches are its own; the shuffle's draws come from one generator
    in that order, as for the whole sequence at once): only the ordered frames and utterance ids of
    the whole epoch are held, in the frames' dtype and int32. Dynamic batches are then followed for
    all consumers together; the tallies (batch seconds, rank seconds) add in the same order as one
    pass over the whole sequence would, so the result is the same to the last bit.
    """
    shard_offsets = np.asarray(shard_offsets, np.int64)
    frames = np.asarray(frames)
    if frames.dtype.kind not in "iu":
        frames = frames.astype(np.int64)
    seconds = np.asarray(seconds, np.float64)
    consumers, seed = loader.consumers, loader.seed
    n_shards = len(shard_offsets) - 1
    order = shuffled_order(n_shards, seed, epoch) if conf.list_shuffle else np.arange(n_shards)
    order = np.tile(order, conf.cycle)
    seq, seq_bounds, utt_bounds = _consumer_shards(shard_offsets, order, consumers)
    blocks = _consumer_blocks(utt_bounds, block_utterances)
    rng = np.random.default_rng([seed, epoch, 1])
    total = int(utt_bounds[-1])
    ordered_frames = np.empty(total, frames.dtype)
    ordered_utts = np.empty(total, np.int32 if len(frames) < (1 << 31) else np.int64)
    for a, b in blocks:
        utts = _shard_utterances(shard_offsets, seq[seq_bounds[a]:seq_bounds[b]])
        f = frames[utts]
        perm = buffered_order(f, utt_bounds[a:b + 1] - utt_bounds[a], conf, rng)
        ordered_frames[utt_bounds[a]:utt_bounds[b]] = f[perm]
        ordered_utts[utt_bounds[a]:utt_bounds[b]] = utts[perm]
        del utts, f, perm
    dynamic = conf.batch.batch_type == "dynamic"
    marks = dynamic_batch_starts(ordered_frames, utt_bounds, conf.batch.max_frames_in_batch) if dynamic else None
    tally = _Tally(consumers, loader.world_size)
    for a, b in blocks:
        lo, hi = int(utt_bounds[a]), int(utt_bounds[b])
        bounds = utt_bounds[a:b + 1] - lo
        ids = np.cumsum(marks[lo:hi]) - 1 if dynamic else batch_ids(ordered_frames[lo:hi], bounds, conf.batch)
        tally.add(a, bounds, ids, seconds[ordered_utts[lo:hi]])
    return tally.epoch(epoch, loader.num_workers)


def _consumer_shards(shard_offsets: np.ndarray, order: np.ndarray, consumers: int):
    """``(shards in reading order, start of each consumer in it, start of each consumer's utterances)``;
    position p of the list goes to consumer ``p mod consumers`` (see :func:`consumer_utterances`)."""
    positions = np.arange(len(order))
    seq = order[np.argsort(positions % consumers, kind="stable")]
    lengths = (shard_offsets[1:] - shard_offsets[:-1])[seq]
    seq_bounds = np.concatenate([[0], np.cumsum(np.bincount(positions % consumers, minlength=consumers))])
    utt_bounds = np.concatenate([[0], np.cumsum(lengths)])[seq_bounds]
    return seq, seq_bounds, utt_bounds.astype(np.int64)


def _shard_utterances(shard_offsets: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The utterance ids of the shards ``seq``, in order (a vectorised concatenation of ranges)."""
    lengths = (shard_offsets[1:] - shard_offsets[:-1])[seq]
    ends_before = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(shard_offsets[:-1][seq] - ends_before, lengths)


def _consumer_blocks(utt_bounds: np.ndarray, block_utterances: int) -> list[tuple[int, int]]:
    """Runs ``[a, b)`` of consumers, each of at least one consumer and, past its first, at most
    ``block_utterances`` utterances."""
    blocks, a = [], 0
    consumers = len(utt_bounds) - 1
    for c in range(1, consumers + 1):
        if c == consumers or utt_bounds[c + 1] - utt_bounds[a] > block_utterances:
            blocks.append((a, c))
            a = c
    return blocks


class _Tally:
    """One epoch's batches, block by block of consumers (in consumer order): which consumer each batch
    belongs to, its seconds, and the seconds per rank, summed in the order of the whole sequence."""

    def __init__(self, consumers: int, world_size: int):
        self.consumers, self.world_size = consumers, world_size
        self.batch_consumer: list[np.ndarray] = []
        self.batch_seconds: list[np.ndarray] = []
        self.rank_seconds = np.zeros(world_size)

    def add(self, first_consumer: int, bounds: np.ndarray, ids: np.ndarray, secs: np.ndarray) -> None:
        """A block's samples: their local batch numbers (from 0) and seconds, in batch order."""
        n_batches = int(ids.max()) + 1 if len(ids) else 0
        sizes = np.diff(bounds)
        consumers = np.arange(first_consumer, first_consumer + len(sizes))
        batch_consumer = np.zeros(n_batches, np.int64)
        batch_consumer[ids] = np.repeat(consumers, sizes)
        self.batch_consumer.append(batch_consumer)
        self.batch_seconds.append(np.bincount(ids, weights=secs, minlength=n_batches))
        # each rank's running sum goes first: bincount adds in element order, from 0.0 + the sum so far
        w = self.world_size
        self.rank_seconds = np.bincount(np.concatenate([np.arange(w), np.repeat(consumers % w, sizes)]),
                                        weights=np.concatenate([self.rank_seconds, secs]), minlength=w)

    def epoch(self, epoch: int, num_workers: int) -> EpochBatches:
        world_size = self.world_size
        batch_consumer = np.concatenate(self.batch_consumer) if self.batch_consumer else np.zeros(0, np.int64)
        batch_seconds = np.concatenate(self.batch_seconds) if self.batch_seconds else np.zeros(0)
        n_batches = len(batch_consumer)
        per_consumer = (np.bincount(batch_consumer, minlength=self.consumers) if n_batches
                        else np.zeros(self.consumers, np.int64))
        # a consumer's batch j (in leaving order) is its j-th; consumer = worker * world_size + rank
        first = np.concatenate([[0], np.cumsum(per_consumer)])[:-1]
        nth = np.arange(n_batches) - first[batch_consumer]
        worker_batches = per_consumer.reshape(num_workers, world_size).T
        rank_steps = worker_batches.sum(axis=1)
        left_b, left_s = _left_out(batch_consumer, nth, batch_seconds, rank_steps, world_size)
        return EpochBatches(epoch, worker_batches, rank_steps, left_b, left_s, self.rank_seconds)


def _left_out(batch_consumer, nth, batch_seconds, rank_steps, world_size: int):
    """Per rank, the batches and seconds past the smallest rank's step count, in the loader's order
    (round robin over the workers: batch j of worker w is stepped at (j, w))."""
    surplus = rank_steps - (rank_steps.min() if len(rank_steps) else 0)
    seconds = np.zeros(world_size)
    if len(batch_consumer):
        rank = batch_consumer % world_size
        worker = batch_consumer // world_size
        loader_order = np.lexsort((worker, nth, rank))  # per rank, in stepping order
        sorted_rank = rank[loader_order]
        starts = np.searchsorted(sorted_rank, np.arange(world_size))
        for r in np.flatnonzero(surplus):
            end = starts[r] + rank_steps[r]
            seconds[r] = batch_seconds[loader_order[end - surplus[r]:end]].sum()
    return surplus, seconds


def plan_batches(shard_offsets, samples, sample_rate, seconds, loader: Loader, conf: TrainerConf) -> dict:
    """Steps per rank and worker for each of ``loader.epochs`` epochs, JSON-ready (see :func:`simulate_epoch`).

    ``samples``/``sample_rate``/``seconds`` are per utterance (the filter's survivors), in the CSR
    layout of ``shard_offsets``. Feature frames are drawn again each epoch when they are random
    (speed perturbation, spec_trim).
    """
    random_frames = conf.speed_perturb or conf.spec_trim
    frames = None
    per_epoch = []
    for epoch in range(loader.epochs):
        if frames is None or random_frames:
            frames = None  # the last epoch's frames go before the next are drawn
            frames = _epoch_frames(samples, sample_rate, conf, (loader.seed, epoch, 2))
        per_epoch.append(simulate_epoch(shard_offsets, frames, seconds, loader, conf, epoch=epoch).summary())
    return {"batching": _batching(conf.batch), "shuffle_size": conf.shuffle_size if conf.shuffle else None,
            "sort_size": conf.sort_size if conf.sort else None, "world_size": loader.world_size,
            "num_workers": loader.num_workers, "seed": loader.seed, "order_model": ORDER_MODEL, "epochs": per_epoch,
            "worst_steps_spread": max((e["steps_spread"] for e in per_epoch), default=0)}


def _epoch_frames(samples, sample_rate, conf: TrainerConf, seed_seq: tuple[int, int, int]) -> np.ndarray:
    """An epoch's feature frames in int32, or uint16 where they fit (up to 655 s an utterance: half the
    memory, and radix sorts)."""
    frames = feature_frames(samples, sample_rate, conf, seed_seq=seed_seq, dtype=np.int32)
    if len(frames) and int(frames.min()) >= 0 and int(frames.max()) < (1 << 16):
        frames = frames.astype(np.uint16)
    return frames


def _batching(b: BatchConf) -> dict:
    """The report's ``batching``: the batch type and the fields of ``batch_conf`` it reads."""
    if b.batch_type == "static":
        return {"batch_type": b.batch_type, "batch_size": b.batch_size}
    if b.batch_type == "dynamic":
        return {"batch_type": b.batch_type, "max_frames_in_batch": b.max_frames_in_batch}
    return {"batch_type": b.batch_type, "bucket_boundaries": list(b.bucket_boundaries),
            "bucket_batch_sizes": list(b.bucket_batch_sizes)}


ORDER_MODEL = ("list shuffle: numpy's permutation for (seed, epoch); shuffle buffer: each sample leaves after a "
               "geometric wait of mean shuffle_size (one draw per epoch); sort buffer and batching: exact")

