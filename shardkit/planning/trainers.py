"""How NeMo and Lhotse deal a tarred dataset's shards to ranks and workers, and what each rank then reads.

Pure (numbers in, numbers out): the readers of the datasets live in ``shardkit.io.layouts.read``.

* NeMo (``nemo/collections/asr/data/audio_to_text.py``, ``expand_sharded_filepaths``): under
  ``scatter`` rank r takes the consecutive shards ``[r * (N // W), (r + 1) * (N // W))``, so the
  last ``N % W`` shards are read by no rank (NeMo only logs a warning); under ``replicate`` every
  rank takes all N, and each utterance is read W times an epoch. Within a rank, worker w of K takes
  ``shards[w::K]`` (``nemo/utils/distributed.py``, ``webdataset_split_by_workers``).
* Lhotse Shar (``lhotse/shar/readers/lazy.py`` with ``split_for_dataloading=True``): rank r takes
  ``shards[r::W]``, then worker w ``[w::K]`` of those; nothing is dropped, but a count that does
  not divide by W x K leaves some consumers a shard more.

A rank's steps are its workers' batches: each worker yields ``ceil(utterances / batch_size)``.
"""

from __future__ import annotations

import numpy as np

TRAINER_RULES = ("nemo-scatter", "nemo-replicate", "shar")


def nemo_rank_shards(rank: int, num_shards: int, world_size: int, strategy: str = "scatter") -> range:
    """The shard indices NeMo gives ``rank`` (before its workers split them)."""
    if strategy == "replicate" or world_size == 1:
        return range(num_shards)
    if strategy != "scatter":
        raise ValueError(f"NeMo's shard strategy is scatter or replicate (got {strategy!r})")
    per_rank = num_shards // world_size
    return range(per_rank * rank, per_rank * rank + per_rank)


def consumer_shards(rule: str, rank: int, worker: int, num_shards: int, world_size: int,
                    num_workers: int) -> list[int]:
    """The shard indices (rank, worker) reads in an epoch under ``rule`` (one of :data:`TRAINER_RULES`)."""
    if rule == "shar":
        return list(range(num_shards))[rank::world_size][worker::num_workers]
    if rule not in ("nemo-scatter", "nemo-replicate"):
        raise ValueError(f"rule must be one of {', '.join(TRAINER_RULES)} (got {rule!r})")
    shards = list(nemo_rank_shards(rank, num_shards, world_size, rule[len("nemo-"):]))
    return shards[worker::num_workers] if num_workers > 1 else shards


def trainer_figures(rule: str, shard_names: list[str], shard_utterances, shard_seconds, *, world_size: int,
                    num_workers: int, batch_size: int = 1) -> dict:
    """What each rank and (rank, worker) reads under ``rule``, and what no rank reads.

    Returns a JSON-ready dict: ``rule``, ``shards``, ``divides`` (N a multiple of what the rule needs:
    W for NeMo's scatter, W x K for Shar), ``ranks`` / ``workers`` (shards, utterances, seconds,
    steps), ``rank_spread`` (max/min seconds; None when a rank reads nothing), ``step_spread`` (max -
    min steps over ranks: DDP waits or hangs on the difference), ``dropped`` (the shards no rank
    reads, by name, with their utterances and seconds) and ``reads_per_utterance`` (W under replicate).
    """
    if world_size < 1 or num_workers < 1 or batch_size < 1:
        raise ValueError(f"world_size, num_workers and batch_size must be >= 1 (got {world_size}, {num_workers}, "
                         f"{batch_size})")
    utts = np.asarray(shard_utterances, dtype=np.int64)
    secs = np.asarray(shard_seconds, dtype=np.float64)
    n = len(shard_names)
    ranks, workers, read = _dealt(rule, utts, secs, world_size, num_workers, batch_size)
    rank_secs = np.array([row["seconds"] for row in ranks])
    for row in ranks:
        row["seconds"] = round(row["seconds"], 3)
    dropped = np.flatnonzero(~read)
    steps = [row["steps"] for row in ranks]
    return {"rule": rule, "shards": n, "world_size": world_size, "num_workers": num_workers, "batch_size": batch_size,
            "divides": n % (world_size * (num_workers if rule == "shar" else 1)) == 0,
            "utterances": int(utts.sum()), "seconds": round(float(secs.sum()), 3),
            "ranks": ranks, "workers": workers,
            "rank_spread": round(float(rank_secs.max() / rank_secs.min()), 6) if rank_secs.min() > 0 else None,
            "step_spread": max(steps) - min(steps),
            "reads_per_utterance": world_size if rule == "nemo-replicate" and world_size > 1 else 1,
            "dropped": {"shards": [shard_names[i] for i in dropped], "utterances": int(utts[dropped].sum()),
                        "seconds": round(float(secs[dropped].sum()), 3)}}


def _dealt(rule: str, utts: np.ndarray, secs: np.ndarray, world_size: int, num_workers: int,
           batch_size: int) -> tuple[list[dict], list[dict], np.ndarray]:
    """(rank rows, worker rows, which shards some consumer reads); rank seconds unrounded."""
    n = len(utts)
    ranks, workers, read = [], [], np.zeros(n, bool)
    for r in range(world_size):
        rank_row = {"rank": r, "shards": 0, "utterances": 0, "seconds": 0.0, "steps": 0}
        for w in range(num_workers):
            idx = consumer_shards(rule, r, w, n, world_size, num_workers)
            read[idx] = True
            u, s = int(utts[idx].sum()), float(secs[idx].sum())
            steps = -(-u // batch_size)
            workers.append({"rank": r, "worker": w, "shards": len(idx), "utterances": u, "seconds": round(s, 3),
                            "steps": steps})
            rank_row.update(shards=rank_row["shards"] + len(idx), utterances=rank_row["utterances"] + u,
                            seconds=rank_row["seconds"] + s, steps=rank_row["steps"] + steps)
        ranks.append(rank_row)
    return ranks, workers, read
