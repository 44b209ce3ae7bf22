"""The seeded choices of balance's planner, and the index dtypes its columns use.

Each decision draws from its own stream ``[seed, purpose, corpus]`` (purposes: the weight's subset,
the padding, the deal order, the order within a shard), so a draw is a function of its arguments
alone: the same plan, byte for byte, whatever the thread count or the moment it is drawn.
:class:`Draws` starts version 1's permutations early (while the index is still read).
"""

from __future__ import annotations

import math

import numpy as np

# purposes of the seeded streams: each decision draws from its own stream
WEIGHT, PAD, DEAL, ORDER = 1, 2, 3, 4


class Draws:
    """Seeded permutations the planner will draw, started ahead of it (while the index is still read).

    A permutation is a function of (seed, purpose, corpus, length) alone, so one drawn early is the
    one the planner would draw: the plan is the same, byte for byte, with or without them. The
    planner takes each at most once (:meth:`permutation`); one it does not need is never waited for.
    """

    def __init__(self, pool):
        self._pool = pool
        self._futures: dict[tuple, object] = {}

    def prefetch(self, n: int, weight: float, seed: int, c: int, remainder: str = "pad") -> None:
        """Start the draws of corpus ``c`` (``n`` utterances at ``weight``): its weight's subset and its padding."""
        whole = int(math.floor(weight))
        extra = int(round((weight - whole) * n))
        if extra:
            self._submit(seed, WEIGHT, c, n)
        if remainder == "pad":
            self._submit(seed, PAD, c, whole * n + extra)

    def deal_ahead(self, seed: int, c: int, length: int) -> None:
        """Start the permutation that orders corpus c's ``length`` copies for dealing (version 1's deal key)."""
        self._submit(seed, DEAL, c, length)

    def _submit(self, seed: int, purpose: int, c: int, length: int) -> None:
        key = (seed, purpose, c, length)
        if key not in self._futures and length:
            self._futures[key] = self._pool.submit(permutation, seed, purpose, c, length)

    def permutation(self, seed: int, purpose: int, c: int, length: int) -> np.ndarray:
        # a draw is submitted before any task that takes it, so a pool thread never waits on a queued one
        """The permutation for ``(seed, purpose, c, length)``: the one computed ahead in the pool when it
        was submitted, else computed now (same values either way: :func:`permutation` is pure).
        """
        future = self._futures.pop((seed, purpose, c, length), None)
        return future.result() if future is not None else permutation(seed, purpose, c, length)


def permutation(seed: int, purpose: int, c: int, length: int) -> np.ndarray:
    """The first draw of the stream ``[seed, purpose, c]``: a permutation of ``length`` (int32 below 2**31
    items: the same values in half the memory, while it waits to be taken)."""
    return np.random.default_rng([seed, purpose, c]).permutation(length).astype(index_dtype(length))


def index_dtype(n: int):
    """int32 indexes below 2**31 items (half the memory of int64 at 20 M utterances), else int64."""
    return np.int32 if n < 2**31 - 1 else np.int64


def shard_dtype(num_shards: int):
    """Shard numbers as uint16 where they fit: a stable sort of them is then numpy's (linear) radix sort."""
    return np.uint16 if num_shards <= 1 << 16 else index_dtype(num_shards)
