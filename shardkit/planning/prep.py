"""The pure planner of prep: balanced shards decided while the utterances stream past, numbers only.

Balance plans from every duration at once; prep sees durations one source shard at a time and
must put bytes into output shards before the last source is read (one copy on disk), so it plans
in two steps, both deterministic functions of the order in which utterances are added:

1. **Streaming fill.** The shard count is fixed early (a multiple of world_size x num_workers,
   sized from the known or estimated total seconds). Utterances wait in a bounded *pool*; while
   the pool is over its limits it deals a round as balance deals: its ``num_shards`` longest
   utterances, the longest to the lightest shard (counts stay equal round by round). The pool
   keeps the short utterances: the fine change for step 2.
2. **Correction.** At the end the pool (at least one utterance per shard is always kept back) is
   padded with seeded repeats or trimmed of its longest utterances so that every shard gets the same count,
   dealt longest first to the lightest shard that still needs utterances, then balance's swap
   refinement (:func:`shardkit.planning.balance.swaps.refine`) evens the totals with same-pool
   swaps, the streamed part of each shard standing as one fixed item.

The guarantees are balance's: count a multiple of world_size x num_workers, equal utterance
counts per shard, every shard within max(0.5% of the mean shard, one median utterance) of the
mean, and what was repeated or dropped reported.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from shardkit.errors import ShardkitError, UsageError
from shardkit.planning.balance import DEFAULT_SHARD_DURATION, REFINE_FRACTION, REMAINDER_POLICIES, TOLERANCE_FRACTION
from shardkit.planning.balance.draws import PAD
from shardkit.planning.balance.swaps import refine

RESERVE_PER_SHARD = 8  # pool utterances per output shard kept back for the correction step
DEFAULT_POOL_BYTES = 256 << 20  # the pool's memory, unless one utterance per shard needs more


def choose_num_shards(total_seconds: float, *, world_size: int, num_workers: int,
                      shard_duration: float | None = None, num_shards: int | None = None) -> int:
    """The output shard count: the multiple of world_size x num_workers nearest ``num_shards``, or
    nearest ``total_seconds / shard_duration`` (default one hour), at least one per consumer."""
    groups = world_size * num_workers
    if num_shards is not None:
        if num_shards < 1:
            raise UsageError(f"--num-shards must be >= 1 (got {num_shards})")
        return max(groups, int(math.floor(num_shards / groups + 0.5)) * groups)
    target = DEFAULT_SHARD_DURATION if shard_duration is None else shard_duration
    if not target > 0:
        raise UsageError(f"--shard-duration must be > 0 (got {target})")
    return max(groups, int(math.floor(total_seconds / target / groups + 0.5)) * groups)


@dataclass
class FinalPlan:
    """What the correction step decided: ``placed`` is ``(seq, copy, shard)`` per pool utterance or
    repeat written at the end, in writing order; ``dropped`` the pool utterances left out."""

    placed: list[tuple[int, int, int]]
    dropped: list[int]
    utts_per_shard: int
    shard_seconds: np.ndarray
    tolerance: float
    notes: list[str] = field(default_factory=list)

    @property
    def max_deviation(self) -> float:
        """The largest distance, in seconds, of any shard's total from the mean shard total."""
        return float(np.abs(self.shard_seconds - self.shard_seconds.mean()).max())

    @property
    def balanced(self) -> bool:
        """Whether every shard's total is within ``tolerance`` seconds of the mean."""
        return self.max_deviation <= self.tolerance + 1e-9


class StreamingPlanner:
    """Step 1 and 2 above. ``add`` utterances in a deterministic order, ``evict`` after each source
    shard (the ``(seq, shard)`` to write now), ``finish`` once at the end."""

    def __init__(self, *, world_size: int, num_workers: int, pool_bytes: int = DEFAULT_POOL_BYTES):
        if world_size < 1 or num_workers < 1:
            raise UsageError(f"--world-size and --num-workers must be >= 1 (got {world_size} and {num_workers})")
        self.groups = world_size * num_workers
        self.pool_bytes = pool_bytes
        self.num_shards: int | None = None
        self._pool: list[tuple[float, int]] = []  # sorted (seconds, seq)
        self._pool_seconds: dict[int, float] = {}
        self._pool_size: dict[int, int] = {}
        self._held_bytes = 0
        self.counts: np.ndarray = np.zeros(0, np.int64)
        self.seconds: np.ndarray = np.zeros(0)
        self.all_seconds: list[float] = []

    @property
    def pool_held_bytes(self) -> int:
        """Bytes of the utterances waiting in the pool (what prep holds in memory or spools)."""
        return self._held_bytes

    @property
    def pool_len(self) -> int:
        """How many utterances wait in the pool."""
        return len(self._pool_seconds)

    def add(self, seq: int, seconds: float, nbytes: int) -> None:
        """Put utterance ``seq`` (``seconds`` long, ``nbytes`` big) into the pool; call in a
        deterministic order, so the plan is the same on every rerun.
        """
        bisect.insort(self._pool, (seconds, seq))
        self._pool_seconds[seq] = seconds
        self._pool_size[seq] = nbytes
        self._held_bytes += nbytes
        self.all_seconds.append(seconds)

    def set_num_shards(self, count: int) -> None:
        """Fix the output shard count (once it is known from the corpus); ValueError unless it is
        a multiple of world_size x num_workers.
        """
        if count % self.groups:
            raise ValueError(f"{count} shards is not a multiple of {self.groups}")
        self.num_shards = count
        self.counts = np.zeros(count, np.int64)
        self.seconds = np.zeros(count)

    def over_limits(self) -> bool:
        """Whether the pool must deal a round: above its count (RESERVE_PER_SHARD per shard, plus the round) or
        its bytes, and never below one utterance per shard after the round (the correction step needs them)."""
        if self.num_shards is None:
            return False
        n, shards = self.pool_len, self.num_shards
        return n > (RESERVE_PER_SHARD + 1) * shards or (self._held_bytes > self.pool_bytes and n >= 2 * shards)

    def evict(self) -> list[tuple[int, int]]:
        """``(seq, shard)`` for each utterance leaving the pool now, in the order to write them.

        Rounds, as balance deals: the pool's ``num_shards`` longest utterances, longest to the lightest
        shard, shortest to the heaviest, so every shard gets one per round (counts stay equal) and the
        pool keeps the short ones, the fine change that the correction step evens the totals with.
        """
        out = []
        while self.over_limits():
            n, shards = self.pool_len, self.num_shards
            picks = [self._pool.pop(i) for i in sorted({(2 * k + 1) * n // (2 * shards) for k in range(shards)},
                                                        reverse=True)]
            for shard, (seconds, seq) in zip(np.argsort(self.seconds, kind="stable"), picks):
                self.counts[shard] += 1
                self.seconds[shard] += seconds
                self._held_bytes -= self._pool_size.pop(seq)
                del self._pool_seconds[seq]
                out.append((seq, int(shard)))
        return out

    def finish(self, *, remainder: str = "pad", seed: int = 0) -> FinalPlan:
        """Step 2: equal counts (pad or drop), the pool dealt and refined. Raises ShardkitError when
        there are fewer utterances than shards."""
        if remainder not in REMAINDER_POLICIES:
            raise UsageError(f"--remainder must be one of {', '.join(REMAINDER_POLICIES)} (got {remainder!r})")
        shards = self.num_shards
        total = int(self.counts.sum()) + self.pool_len
        per_shard = -(-total // shards) if remainder == "pad" else total // shards
        notes = []
        if per_shard < int(self.counts.max()):  # the streamed counts drifted further than the pool can even out
            notes.append(f"--remainder drop: {shards} x {int(self.counts.max())} utterances are needed, more than "
                         f"{total}; the shortfall is padded with repeats")
            per_shard = int(self.counts.max())
        if per_shard < 1:
            raise ShardkitError(f"{shards} shards (a multiple of world_size x num_workers = {self.groups}) need at "
                                f"least {shards} utterances; the corpus has {total} that passed validation")
        pool = sorted(self._pool_seconds)  # by seq: the order the seeded choices draw from
        need = per_shard - self.counts
        items, dropped = _equalize(pool, self._pool_seconds, int(need.sum()), seed)
        rows_of = _deal(items, self._pool_seconds, need, self.seconds)
        placed, shard_seconds = self._refined(items, rows_of)
        return FinalPlan(placed, dropped, per_shard, shard_seconds, self.tolerance(shard_seconds), notes)

    def tolerance(self, shard_seconds: np.ndarray) -> float:
        """The balance a plan must reach, in seconds: TOLERANCE_FRACTION of the mean shard, or the
        median utterance if that is longer (no swap can do better than about one utterance).
        """
        return max(TOLERANCE_FRACTION * float(shard_seconds.mean()), float(np.median(self.all_seconds)))

    def _refined(self, items: list[tuple[int, int]],
                 rows_of: list[list[int]]) -> tuple[list[tuple[int, int, int]], np.ndarray]:
        """balance's swaps over :meth:`_swap_matrix`: ``(seq, copy, shard)`` of every pool item, in writing
        order, and each shard's seconds."""
        shards = self.num_shards
        rows, seconds_arr, corpus_arr = self._swap_matrix(items, rows_of)
        mean = float(seconds_arr.sum()) / shards
        goal = min(self.tolerance(seconds_arr[rows].sum(axis=1)) / 2,
                   REFINE_FRACTION * mean * math.sqrt(shards / self.groups))
        refine(rows, seconds_arr, corpus_arr, goal=goal)
        placed = [(items[c - shards][0], items[c - shards][1], s) for s in range(shards) for c in rows[s]
                  if shards <= c < shards + len(items)]
        return placed, seconds_arr[rows].sum(axis=1)

    def _swap_matrix(self, items: list[tuple[int, int]], rows_of: list[list[int]]):
        """``(rows, seconds, corpus)`` for the swaps: each row's first cell is its shard's streamed part (a
        fixed item of a corpus of its own), the other cells pool items (one corpus: any two may swap) or
        zero-second fillers (each its own corpus: never moved)."""
        shards = self.num_shards
        width = 1 + max((len(r) for r in rows_of), default=0)
        seconds = [float(x) for x in self.seconds] + [self._pool_seconds[seq] for seq, _ in items]
        corpus = [1 + s for s in range(shards)] + [0] * len(items)
        rows = np.empty((shards, width), np.int64)
        for s in range(shards):
            cells = [s] + [shards + i for i in rows_of[s]]
            while len(cells) < width:
                corpus.append(len(corpus) + shards + 1)
                seconds.append(0.0)
                cells.append(len(seconds) - 1)
            rows[s] = cells
        return rows, np.array(seconds), np.array(corpus, np.int64)


def _equalize(pool: list[int], seconds: dict[int, float], wanted: int,
              seed: int) -> tuple[list[tuple[int, int]], list[int]]:
    """``(items, dropped)``: the pool as ``(seq, copy)`` items, ``wanted`` of them, by seeded repeats
    (copy numbers 1, 2, ... per utterance) or by dropping the longest. Pure."""
    rng = np.random.default_rng([seed, PAD])  # balance's stream of pad/drop choices
    if wanted <= len(pool):  # drop the longest (fewer than num_shards): what is left evens out in finer steps
        longest_first = sorted(pool, key=lambda seq: (-seconds[seq], seq))
        dropped = sorted(longest_first[:len(pool) - wanted])
        gone = set(dropped)
        return [(seq, 0) for seq in pool if seq not in gone], dropped
    items = [(seq, 0) for seq in pool]
    picks = rng.permutation(len(pool))
    copies: dict[int, int] = {}
    for k in range(wanted - len(pool)):
        seq = pool[picks[k % len(pool)]]
        copies[seq] = copies.get(seq, 0) + 1
        items.append((seq, copies[seq]))
    return items, []


def _deal(items: list[tuple[int, int]], seconds: dict[int, float], need: np.ndarray,
          base: np.ndarray) -> list[list[int]]:
    """Item positions per shard: longest first, each to the lightest shard that still needs one."""
    order = sorted(range(len(items)), key=lambda i: (-seconds[items[i][0]], items[i]))
    left = need.copy()
    heap = [(float(base[s]), s) for s in range(len(need)) if left[s] > 0]
    heapq.heapify(heap)
    rows: list[list[int]] = [[] for _ in range(len(need))]
    for i in order:
        total, s = heapq.heappop(heap)
        rows[s].append(i)
        left[s] -= 1
        if left[s] > 0:
            heapq.heappush(heap, (total + seconds[items[i][0]], s))
    return rows
