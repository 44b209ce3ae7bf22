"""How balance's planner deals each corpus' copies to shards: longest first, in rounds, the largest copy
left to the lightest shard so far.

The deal order is a function of the seed (see ``shardkit.planning.balance`` for the two plan versions):
version 1 sorts a seeded permutation of the copies by duration (:func:`_deal_key`), version 2 sorts
packed 64-bit keys, the float32 duration above :class:`TieOrder`'s image of the copy's index
(:func:`_packed_deal_key`). Keys are sorted in runs of ``SORT_RUN`` in a thread pool, then merged.
:func:`deal_copies` deals corpus by corpus and places each corpus' copies into the shards' rows
(:func:`_place`) while the next corpus is dealt.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from shardkit.errors import UsageError
from shardkit.planning.balance.draws import DEAL, Draws, index_dtype, shard_dtype
from shardkit.planning.radix import stable_argsort

SORT_RUN = 1 << 21  # copies per stable sort run (runs sorted in threads, then merged)
TIE_BITS = 32  # version 2: low bits of a deal key, a bijection of the copy's index (so < 2**32 copies a corpus)


def check_packed_size(name: str, n: int, weight: float, version: int = 2) -> None:
    """Versions 2 and 3 pack each copy's index into its deal key: a corpus of ``n`` utterances at ``weight``
    must deal fewer than 2**31 copies (UsageError otherwise, naming version 1 as the way out)."""
    if n * max(1.0, weight) >= 2**TIE_BITS / 2:
        raise UsageError(f"corpus {name!r}: plan version {version} deals fewer than 2**31 copies of a corpus "
                         f"({n} utterances at weight {weight:g}); plan it with --plan-version 1")


def _deal_key(pool: ThreadPoolExecutor, draws: Draws, seconds: np.ndarray, seed: int, c: int):
    """Version 1: a corpus' copies in seeded shuffle order, their sort key (longest first), and the stable
    sorts of the key's runs of ``SORT_RUN``, submitted to ``pool`` (a 10 M-utterance corpus is not one
    thread's sort); returns what yields the deal order once the runs are sorted."""
    ids = draws.permutation(seed, DEAL, int(c), len(seconds)).astype(index_dtype(len(seconds)))
    key = -seconds[ids]
    runs = [pool.submit(_sort_run, key, start, min(start + SORT_RUN, len(key)))
            for start in range(0, len(key), SORT_RUN)]
    return lambda: _merged_order(ids, key, runs)


def _sort_run(key: np.ndarray, start: int, stop: int) -> np.ndarray:
    order = np.argsort(key[start:stop], kind="stable").astype(index_dtype(len(key)))
    order += start
    return order


def _merged_order(ids: np.ndarray, key: np.ndarray, runs: list) -> np.ndarray:
    order = np.concatenate([run.result() for run in runs])
    runs.clear()
    if len(order) > SORT_RUN:  # a stable sort of stably sorted runs (timsort merges them): the stable sort
        order = order[np.argsort(key[order], kind="stable")]
    return ids[order]


class TieOrder:
    """A seeded bijection of the 32-bit integers (version 2's order among copies of equal duration).

    Each step (xor with a key, multiplication by an odd number modulo 2**32, xor with the value shifted
    right) is invertible, so the index of a copy can be packed into its deal key and read back after
    the sort; the multiply and shift steps mix the bits, so equal durations are dealt in a seeded,
    shuffled-looking order of their indexes.
    """

    def __init__(self, seed: int, c: int):
        k0, m1, m2, k1 = np.random.default_rng([seed, DEAL, c]).integers(0, 2**32, 4, dtype=np.uint64)
        self.k0, self.k1 = np.uint32(k0), np.uint32(k1)
        self.m1, self.m2 = np.uint32(m1 | np.uint64(1)), np.uint32(m2 | np.uint64(1))
        self.inv1, self.inv2 = (np.uint32(pow(int(m), -1, 2**32)) for m in (self.m1, self.m2))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The images of ``x`` (uint32, changed in place and returned)."""
        x ^= self.k0
        x *= self.m1
        x ^= x >> 16
        x *= self.m2
        x ^= x >> 13
        x += self.k1
        return x

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """The values whose images are ``y`` (uint32, changed in place and returned)."""
        y -= self.k1
        y ^= (y >> 13) ^ (y >> 26)
        y *= self.inv2
        y ^= y >> 16
        y *= self.inv1
        y ^= self.k0
        return y


def _packed_deal_key(pool: ThreadPoolExecutor, draws: Draws, seconds: np.ndarray, seed: int, c: int):
    """Version 2: each copy's deal key (float32 duration, inverted so the longest sorts first, above
    :class:`TieOrder`'s image of its index), sorted in place in runs of ``SORT_RUN`` in ``pool``;
    returns what yields the deal order (the indexes read back from the sorted keys)."""
    ties = TieOrder(seed, c)
    # +0.0 makes -0.0 (which passes the check for negative durations) +0.0: its bits would sort it mid-way
    bits = (seconds.astype(np.float32) + np.float32(0.0)).view(np.uint32)
    key = np.invert(bits).astype(np.uint64)
    del bits
    key <<= np.uint64(TIE_BITS)
    key |= ties.forward(np.arange(len(seconds), dtype=np.uint32))
    runs = [pool.submit(sort_in_place, key, start, min(start + SORT_RUN, len(key)))
            for start in range(0, len(key), SORT_RUN)]
    return lambda: order_from_keys(key, runs, ties)


def sort_in_place(key: np.ndarray, start: int, stop: int) -> None:
    key[start:stop].sort()


def order_from_keys(key: np.ndarray, runs: list, ties: TieOrder) -> np.ndarray:
    for run in runs:
        run.result()
    runs.clear()
    if len(key) > SORT_RUN:  # sorted runs: timsort merges them (keys are distinct, so stable or not is alike)
        key.sort(kind="stable")
    low = key.astype(np.uint32)  # the index's image: the low 32 bits (a cast to uint32 keeps them)
    return ties.inverse(low).view(np.int32)  # < 2**31 copies (the planner's check): int32, as index_dtype says


def deal_orders(pool: ThreadPoolExecutor, draws: Draws, seconds: list[np.ndarray], order_of_corpora, seed: int,
                version: int = 1):
    """(corpus, the order its copies are dealt in), in ``order_of_corpora``: longest first, equal durations in
    a seeded order (see the module docstring for each version). The later corpora's orders are computed in
    ``pool`` while the earlier ones are dealt."""
    keyed_by = _deal_key if version == 1 else _packed_deal_key
    waiting = [int(c) for c in order_of_corpora if len(seconds[c])]
    keyed = {}
    while waiting or keyed:
        while waiting and len(keyed) < 2:  # one corpus ahead of the one dealt: two corpora's keys in memory
            keyed[waiting[0]] = pool.submit(keyed_by, pool, draws, seconds[waiting[0]], seed, waiting[0])
            waiting.pop(0)
        c = next(iter(keyed))
        finish = keyed.pop(c).result()  # popped: the future would hold its arrays
        ids = finish()
        del finish
        yield c, ids


def deal_copies(pool: ThreadPoolExecutor, seconds: list[np.ndarray], orders, counts: np.ndarray) -> np.ndarray:
    """The copies of each shard (a ``num_shards x per_shard`` array of positions in the corpora's
    concatenation), dealt corpus by corpus (``orders``: (corpus, deal order) pairs, see
    :func:`deal_orders`) in rounds, the largest copy left to the lightest shard so far.

    Within a shard the positions are ascending (a stable sort of the copies by shard); each corpus'
    copies are placed (:func:`_place`) in ``pool`` while the next corpus is dealt.
    """
    num_shards = counts.shape[0]
    total = sum(len(s) for s in seconds)
    rows = np.empty((num_shards, total // num_shards), index_dtype(total))
    offsets = np.cumsum([0] + [len(s) for s in seconds])
    totals = np.zeros(num_shards)
    placed = []
    for c, ids in orders:
        ranked = seconds[c][ids]  # in deal order: each round reads a slice, not a gather
        dealt = np.empty(len(ids), shard_dtype(num_shards))
        base = int(counts[:, c].min())
        for r in range(base):
            lightest = stable_argsort(totals.view(np.uint64))  # sums of durations: >= 0, never -0.0
            dealt[r * num_shards:(r + 1) * num_shards] = lightest
            totals[lightest] += ranked[r * num_shards:(r + 1) * num_shards]
        rest = slice(base * num_shards, len(ids))
        if rest.stop > rest.start:
            eligible = np.flatnonzero(counts[:, c] > base)
            lightest = eligible[np.argsort(totals[eligible], kind="stable")]
            dealt[rest] = lightest
            totals[lightest] += ranked[rest]
        del ranked
        shard_of = np.empty_like(dealt)
        shard_of[ids] = dealt
        del dealt, ids
        placed.append(pool.submit(_place, rows, shard_of, counts, c, int(offsets[c])))
    for done in placed:
        done.result()
    return rows


def _place(rows: np.ndarray, shard_of: np.ndarray, counts: np.ndarray, c: int, offset: int) -> None:
    """Write corpus c's copies (their shards: ``shard_of``) into ``rows``: in each shard after the earlier
    corpora's copies, in index order. The same rows as a stable sort of every copy's shard number, with
    a sort of one corpus at a time (memory) instead of all 20 M at once."""
    order = np.argsort(shard_of, kind="stable").astype(rows.dtype)  # radix sort where shards fit uint16
    per_shard = counts[:, c]
    first = np.cumsum(per_shard) - per_shard  # where each shard's run starts in ``order``
    before = counts[:, :c].sum(axis=1)  # copies of earlier corpora at the start of each shard
    base = (np.arange(len(per_shard)) * rows.shape[1] + before - first).astype(rows.dtype)
    where = base[shard_of[order]]
    where += np.arange(len(order), dtype=rows.dtype)
    order += offset
    rows.reshape(-1)[where] = order
