"""Who reads the rest of an interrupted epoch after an elastic restore (pure: numbers in, lists out).

A state saved under W ranks x K workers names, per consumer, the shards it has left and where it
stands in its current one. Restored under W' x K', those remaining pieces (a partly read shard
from its offset on, whole shards after it) are dealt out anew so that each is read by exactly one
new consumer. The deal balances what matters to distributed training, the work per *rank*:

1. pieces go to ranks largest first, each to the rank with the least work so far (LPT; ties to the
   lower rank); so when the deal is done, the ranks' remaining work differs by at most the
   largest piece, i.e. **at most one shard's worth** (and all ranks get the same count of whole
   shards when every piece weighs the same and the count divides W');
2. each rank's pieces go to its K' workers the same way.

A consumer reads its pieces in the order of the input list (the old epoch's order), so reading
stays deterministic. This relaxes the normal guarantee (``lines_for``: equal shard counts per
consumer when the count divides W x K) for the rest of the interrupted epoch only; the next
epoch is split by the normal rule under W' x K'.
"""

from __future__ import annotations

from typing import Sequence


def _lpt(weights: Sequence[float], items: Sequence[int], bins: int) -> list[list[int]]:
    """``items`` (indices into ``weights``) dealt to ``bins`` bins, largest first to the lightest bin."""
    loads = [0.0] * bins
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in sorted(items, key=lambda i: (-weights[i], i)):
        b = min(range(bins), key=lambda b: (loads[b], b))
        loads[b] += weights[i]
        out[b].append(i)
    return [sorted(b) for b in out]


def deal_remaining(weights: Sequence[float], world_size: int, num_workers: int) -> list[list[int]]:
    """Per consumer id (``worker * world_size + rank``, as WeNet numbers them) the indices of the
    pieces it reads, in input order; every index appears exactly once. ``weights``: each piece's
    remaining work (e.g. bytes), all >= 0."""
    if world_size < 1 or num_workers < 1:
        raise ValueError(f"world_size and num_workers must be >= 1 (got {world_size}, {num_workers})")
    if any(w < 0 for w in weights):
        raise ValueError("piece weights must be >= 0")
    consumers: list[list[int]] = [[] for _ in range(world_size * num_workers)]
    for rank, pieces in enumerate(_lpt(weights, range(len(weights)), world_size)):
        for worker, mine in enumerate(_lpt(weights, pieces, num_workers)):
            consumers[worker * world_size + rank] = mine
    return consumers


def rank_loads(weights: Sequence[float], deal: list[list[int]], world_size: int) -> list[float]:
    """Each rank's total weight under a deal (for reports and tests of the balance bound)."""
    loads = [0.0] * world_size
    for consumer, pieces in enumerate(deal):
        loads[consumer % world_size] += sum(weights[i] for i in pieces)
    return loads
