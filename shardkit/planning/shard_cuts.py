"""Where a list of utterances, in order, is cut into shards: a fixed count each (WeNet's rule) or
about equal seconds each. Numbers in, boundaries out (no I/O); ``shardkit make`` writes the shards."""

from __future__ import annotations

import math

import numpy as np


def plan_shards(durations: list[float], *, shard_duration: float | None = None,
                utts_per_shard: int | None = None) -> list[list[int]]:
    """Cut utterance indices, in order, into shards; returns one index list per shard.

    By count: ``utts_per_shard`` each (WeNet's rule), the last one shorter. By duration:
    ``ceil(total / shard_duration)`` shards, cut where the running total is closest to each
    multiple of ``total / n``, so all shards hold about equal seconds (never a small leftover);
    a shard may exceed ``shard_duration`` by less than one utterance.
    """
    cuts = plan_cuts(durations, shard_duration=shard_duration, utts_per_shard=utts_per_shard)
    return [list(range(a, b)) for a, b in zip(cuts[:-1], cuts[1:])]


def plan_cuts(durations, *, shard_duration: float | None = None, utts_per_shard: int | None = None) -> list[int]:
    """``plan_shards`` as boundaries: shard ``k`` holds utterances ``cuts[k]:cuts[k + 1]`` (no list per
    utterance, for large manifests); ``[]`` when there is no utterance."""
    count = len(durations)
    if count == 0:
        return []
    if utts_per_shard is not None:
        if utts_per_shard < 1:
            raise ValueError("utts_per_shard must be at least 1")
        return list(range(0, count, utts_per_shard)) + [count]
    if shard_duration is None or shard_duration <= 0:
        raise ValueError("shard_duration must be positive")
    return cuts_by_duration(np.cumsum(np.asarray(durations, dtype=np.float64)), shard_duration)


def cuts_by_duration(running: np.ndarray, shard_duration: float) -> list[int]:
    """The boundaries of about equal-duration shards, from the running total of the durations: each cut
    where the running total is closest to a multiple of ``total / shards``."""
    count = len(running)
    total = float(running[-1])
    shards = min(count, max(1, math.ceil(total / shard_duration - 1e-9)))
    cuts = [0]
    for k in range(1, shards):
        target = total * k / shards
        cut = int(np.searchsorted(running, target))  # first index whose running total reaches target
        if cut > 0 and target - running[cut - 1] < running[cut] - target:
            cut -= 1
        # each shard keeps at least one utterance, and leaves one for each shard after it
        cut = min(max(cut + 1, cuts[-1] + 1), count - (shards - k))
        cuts.append(cut)
    cuts.append(count)
    return cuts
