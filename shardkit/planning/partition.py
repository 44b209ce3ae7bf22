"""How WeNet splits a shard list across ranks and loader workers, and what each one then reads.

The single source of truth for the split: ``shardkit plan`` reports it, ``shardkit balance``
plans for it, and the torch dataset reads its lines through :func:`lines_for`.

WeNet's rule (``wenet/dataset/datapipes.py``): every rank shuffles the list with the same seed
at the start of each epoch, then line ``i`` of the shuffled list goes to consumer
``i mod (world_size * num_workers)``, where consumer id = ``worker * world_size + rank``.

The shuffle here is numpy's seeded permutation (``default_rng([seed, epoch])``), not WeNet's own
RNG, so the exact lines a rank reads in a given epoch differ from WeNet's. What this module is
used for does not depend on that: when every shard holds the same utterances and seconds and the
shard count is a multiple of ``world_size * num_workers``, each consumer gets the same work under
*any* permutation; when they do not, the figures show the imbalance a typical shuffle produces.
All functions are pure (integers and arrays in, arrays out).
"""

from __future__ import annotations

import numpy as np


def _check_sizes(world_size: int, num_workers: int) -> int:
    if world_size < 1 or num_workers < 1:
        raise ValueError(f"world_size and num_workers must be >= 1 (got {world_size}, {num_workers})")
    return world_size * num_workers


def _check_epochs(world_size: int, num_workers: int, epochs: int, shard_utterances, shard_seconds):
    """``(consumers, utterances, seconds)`` of a per-epoch simulation, its arguments checked."""
    groups = _check_sizes(world_size, num_workers)
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1 (got {epochs})")
    return groups, np.asarray(shard_utterances, dtype=np.int64), np.asarray(shard_seconds, dtype=np.float64)


def consumer_of_line(i: int, world_size: int, num_workers: int) -> tuple[int, int]:
    """``(rank, worker)`` that reads position ``i`` of the (already shuffled) list.

    consumer = i mod (world_size * num_workers); rank = consumer mod world_size;
    worker = consumer // world_size (consumer id = worker * world_size + rank).
    """
    consumer = i % _check_sizes(world_size, num_workers)
    return consumer % world_size, consumer // world_size


def shuffled_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The list order of one epoch: ``order[p]`` is the original line index read at position p.

    ``np.random.default_rng([seed, epoch]).permutation(n)`` (int64): identical on every rank for
    the same (seed, epoch), different across epochs.
    """
    return np.random.default_rng([seed, epoch]).permutation(n)


def lines_for(rank: int, worker: int, n_lines: int, world_size: int, num_workers: int,
              epoch_seed: tuple[int, int] | None = None) -> np.ndarray:
    """Original line indices that (rank, worker) reads, in reading order.

    ``epoch_seed`` is ``(seed, epoch)`` for a shuffled epoch (order from :func:`shuffled_order`),
    or None to read the list unshuffled. Position p of the epoch's order is read by the consumer
    of :func:`consumer_of_line`; a consumer reads its positions in increasing order. Across all
    (rank, worker) pairs the results partition ``range(n_lines)``.
    """
    groups = _check_sizes(world_size, num_workers)
    if not (0 <= rank < world_size and 0 <= worker < num_workers):
        raise ValueError(f"rank {rank} / worker {worker} outside world_size {world_size} / num_workers {num_workers}")
    order = np.arange(n_lines) if epoch_seed is None else shuffled_order(n_lines, *epoch_seed)
    return order[worker * world_size + rank::groups]


def plan_figures(shard_utterances, shard_seconds, *, world_size: int, num_workers: int, epochs: int = 1,
                 seed: int = 0) -> dict:
    """What each rank and (rank, worker) reads per epoch, for a list whose line i has the given sizes.

    Returns a JSON-ready dict: ``shards``, ``divides`` (count is a multiple of
    world_size * num_workers), and per epoch ``ranks`` / ``workers`` lists of
    ``{rank, [worker], shards, utterances, seconds}`` plus ``rank_spread`` (max/min seconds per
    rank; None when a rank gets nothing), and the worst spread over all epochs.
    """
    groups, utts, secs = _check_epochs(world_size, num_workers, epochs, shard_utterances, shard_seconds)
    n = len(utts)
    per_epoch = []
    worst = 1.0
    for epoch in range(epochs):
        order = shuffled_order(n, seed, epoch)
        consumer = np.arange(n) % groups
        shard_count = np.bincount(consumer, minlength=groups)
        utt_count = np.bincount(consumer, weights=utts[order], minlength=groups)
        sec_count = np.bincount(consumer, weights=secs[order], minlength=groups)
        # consumer id = worker * world_size + rank, so a (worker, rank) reshape groups them
        by_wr_shards = shard_count.reshape(num_workers, world_size)
        by_wr_utts = utt_count.reshape(num_workers, world_size)
        by_wr_secs = sec_count.reshape(num_workers, world_size)
        rank_secs = by_wr_secs.sum(axis=0)
        spread = float(rank_secs.max() / rank_secs.min()) if rank_secs.min() > 0 else None
        worst = float("inf") if spread is None else max(worst, spread)
        per_epoch.append({
            "epoch": epoch,
            "ranks": [{"rank": r, "shards": int(by_wr_shards[:, r].sum()), "utterances": int(by_wr_utts[:, r].sum()),
                       "seconds": round(float(rank_secs[r]), 3)} for r in range(world_size)],
            "workers": [{"rank": r, "worker": w, "shards": int(by_wr_shards[w, r]),
                         "utterances": int(by_wr_utts[w, r]), "seconds": round(float(by_wr_secs[w, r]), 3)}
                        for r in range(world_size) for w in range(num_workers)],
            "rank_spread": None if spread is None else round(spread, 6),
            "rank_seconds_min": round(float(rank_secs.min()), 3),
            "rank_seconds_max": round(float(rank_secs.max()), 3),
        })
    return {"shards": n, "world_size": world_size, "num_workers": num_workers, "consumers": groups,
            "divides": n % groups == 0, "utterances": int(utts.sum()), "seconds": round(float(secs.sum()), 3),
            "seed": seed, "epochs": per_epoch,
            "worst_rank_spread": None if worst == float("inf") else round(worst, 6)}


# ---------------------------------------------------------------------------------------------
# WebDataset's split

READERS = ("wenet", "webdataset")


def webdataset_lines_for(rank: int, worker: int, n_lines: int, world_size: int, num_workers: int) -> np.ndarray:
    """Original line indices that (rank, worker) reads under WebDataset's ``split_by_node`` + ``split_by_worker``.

    WebDataset splits the list *before* any shuffle: ``split_by_node`` keeps ``lines[rank::world_size]``
    and ``split_by_worker`` then ``[worker::num_workers]`` of those; ``shardshuffle`` only reorders
    a worker's own shards. So line p goes to the consumer ``p mod (world_size * num_workers)``
    with consumer = ``worker * world_size + rank`` (the same as WeNet's consumer of position p,
    but of the unshuffled list), and a consumer reads the same shards every epoch.
    """
    _check_sizes(world_size, num_workers)
    if not (0 <= rank < world_size and 0 <= worker < num_workers):
        raise ValueError(f"rank {rank} / worker {worker} outside world_size {world_size} / num_workers {num_workers}")
    return np.arange(n_lines)[rank::world_size][worker::num_workers]


def resampled_lines_for(rank: int, worker: int, n_lines: int, draws: int, seed: int, epoch: int) -> np.ndarray:
    """A typical draw of WebDataset's ``resampled=True``: ``draws`` lines picked with replacement.

    Each (rank, worker) draws independently from the whole list (WebDataset seeds per worker and
    epoch; this uses numpy's ``default_rng([seed, epoch, rank, worker])``, not its RNG).
    """
    if n_lines < 1 or draws < 0:
        raise ValueError(f"need at least one line and draws >= 0 (got {n_lines}, {draws})")
    return np.random.default_rng([seed, epoch, rank, worker]).integers(0, n_lines, draws)


def _figures_from_assignment(lines_of, utts, secs, world_size: int, num_workers: int) -> dict:
    """One epoch's ranks/workers figures from ``lines_of(rank, worker) -> line indices``."""
    workers, rank_secs = [], np.zeros(world_size)
    ranks = []
    for r in range(world_size):
        shards = utterances = 0
        seconds = 0.0
        for w in range(num_workers):
            idx = lines_of(r, w)
            s = float(secs[idx].sum())
            workers.append({"rank": r, "worker": w, "shards": int(len(idx)), "utterances": int(utts[idx].sum()),
                            "seconds": round(s, 3)})
            shards += len(idx)
            utterances += int(utts[idx].sum())
            seconds += s
        rank_secs[r] = seconds
        ranks.append({"rank": r, "shards": int(shards), "utterances": utterances, "seconds": round(seconds, 3)})
    spread = float(rank_secs.max() / rank_secs.min()) if rank_secs.min() > 0 else None
    return {"ranks": ranks, "workers": workers, "rank_spread": None if spread is None else round(spread, 6),
            "rank_seconds_min": round(float(rank_secs.min()), 3),
            "rank_seconds_max": round(float(rank_secs.max()), 3)}


def plan_figures_webdataset(shard_utterances, shard_seconds, *, world_size: int, num_workers: int, epochs: int = 1,
                            seed: int = 0, resampled: bool = False, draws: int | None = None) -> dict:
    """:func:`plan_figures` for WebDataset's reader: same JSON shape, plus ``reader`` and ``mode``.

    ``resampled=False``: ``nodesplitter=wds.split_by_node``, ``workersplitter=wds.split_by_worker``
    (:func:`webdataset_lines_for`); the split is the same every epoch. ``resampled=True``: every
    (rank, worker) draws ``draws`` shards per epoch with replacement (default: the list length
    divided by the consumers, rounded up, as ``.with_epoch`` is usually set), a typical draw from
    :func:`resampled_lines_for`. ``divides`` says whether the count is a multiple of
    world_size * num_workers, which is what makes the fixed split equal when shards are equal.
    """
    groups, utts, secs = _check_epochs(world_size, num_workers, epochs, shard_utterances, shard_seconds)
    n = len(utts)
    if resampled and draws is None:
        draws = -(-n // groups)
    per_epoch, worst = [], 1.0
    for epoch in range(epochs):
        if resampled:
            def lines_of(r, w, epoch=epoch):
                return resampled_lines_for(r, w, n, draws, seed, epoch) if n else np.zeros(0, np.int64)
        else:
            def lines_of(r, w):
                return webdataset_lines_for(r, w, n, world_size, num_workers)
        figures = {"epoch": epoch, **_figures_from_assignment(lines_of, utts, secs, world_size, num_workers)}
        spread = figures["rank_spread"]
        worst = float("inf") if spread is None else max(worst, spread)
        per_epoch.append(figures)
    return {"reader": "webdataset", "mode": "resampled" if resampled else "split_by_node+split_by_worker",
            "draws_per_worker": draws if resampled else None, "shards": n, "world_size": world_size,
            "num_workers": num_workers, "consumers": groups, "divides": n % groups == 0,
            "utterances": int(utts.sum()), "seconds": round(float(secs.sum()), 3), "seed": seed, "epochs": per_epoch,
            "worst_rank_spread": None if worst == float("inf") else round(worst, 6)}
