"""Plan version 3: a corpus' copies described rather than listed, and dealt straight into their places.

Versions 1 and 2 list every copy (utterance and copy number), concatenate the corpora's copies and
their seconds, deal them to shards, sort each shard's copies into place, shuffle each shard, then gather
the plan's four columns through the shuffled positions: six passes over every copy that touch memory at
random, and ~50 bytes a copy held at once. Version 3 keeps what the deal needs and nothing else:

* a corpus at its weight is :class:`Copies`: copy ``k < whole * n`` is utterance ``k % n`` (copy number
  ``k // n``); only the weight's seeded subset and the padding are listed (the tail);
* the deal order is version 2's key (float32 duration above a seeded bijection of the copy's number),
  built from the utterances' durations without a list of the copies' seconds, one sort per corpus;
* each dealing round writes its copies' utterance, copy number and seconds at their places in the output
  (shard by shard, each shard's corpora in index order): no placement sort, no gathers; the corpus column
  follows from the counts, and only repeats write a copy number;
* each shard is then shuffled in place, blocks of shards in threads, each block from its own seeded stream;
* the swaps that close the last gap run on the output itself (:class:`SwappedRows`: a shard's row is
  its own places until a swap changes it), with the shard totals the deal summed.

The guarantees are version 2's: every copy once, equal counts per shard (a corpus' count differs by at
most one), within the tolerance (0.5% of the mean shard or the median copy), a function of the seed
alone (threads only run independent per-corpus steps).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from shardkit.errors import UsageError
from shardkit.planning.balance import deal as _deal
from shardkit.planning.balance.deal import TieOrder
from shardkit.planning.balance.draws import ORDER, PAD, WEIGHT, index_dtype
from shardkit.planning.radix import stable_argsort

_CHUNK = 1 << 20  # copies a block of the shuffle (its streams: part of the plan) or of the median's pass holds
_DEAL_BATCH = 1 << 20  # copies a batch of dealing rounds holds (their utterance, copy number, seconds); any size
# gives the same plan (tests/planning/test_balance_plan_v3.py)


@dataclass
class Copies:
    """A corpus' copies: ``whole`` copies of each of its ``n`` utterances (copy k is utterance k % n, copy
    number k // n), then the listed ``tail`` (the weight's subset, then the padding)."""

    n: int
    whole: int
    tail_utt: np.ndarray
    tail_copy: np.ndarray

    def __len__(self) -> int:
        return self.whole * self.n + len(self.tail_utt)

    def repeated(self) -> np.ndarray:
        """The utterance of every copy numbered 1 or more (a repeat), in copy order."""
        whole = np.tile(np.arange(self.n, dtype=self.tail_utt.dtype), max(self.whole - 1, 0))
        return np.concatenate([whole, self.tail_utt[self.tail_copy > 0]])

    def utt_copy(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(utterance, copy number) of copies ``k`` (int64)."""
        cut = self.whole * self.n
        if self.whole <= 1 or not self.n:  # no copy below the tail is numbered above 0: no division
            utt, copy = k.copy(), np.zeros_like(k)
        else:
            utt, copy = np.divmod(k, self.n)[::-1]
        tail = k >= cut
        if tail.any():
            at = k[tail] - cut
            utt[tail] = self.tail_utt[at]
            copy[tail] = self.tail_copy[at]
        return utt, copy


def weigh(d: np.ndarray, weight: float, name: str, rng_of) -> tuple[Copies, dict, float, float]:
    """A corpus at its weight: (copies, stats, their seconds, the longest of them). ``rng_of(purpose)``:
    the corpus' seeded stream for that purpose."""
    n = len(d)
    whole = int(math.floor(weight))
    extra = int(round((weight - whole) * n))
    index = index_dtype(n)
    chosen = np.sort(rng_of(WEIGHT).choice(n, extra, replace=False)).astype(index) if extra else np.zeros(0, index)
    if not whole and not extra:
        raise UsageError(f"corpus {name!r} keeps no utterance at weight {weight:g} ({n} utterances)")
    kept = n if whole else extra  # drawn without replacement: the subset's utterances are distinct
    stats = {"name": name, "weight": weight, "utterances": n, "seconds": round(float(d.sum()), 3),
             "kept": kept, "repeated": whole * n + extra - kept, "dropped": n - kept}
    picked = d[chosen]
    seconds = whole * float(d.sum()) + float(picked.sum())
    longest = max(float(d.max()) if whole else 0.0, float(picked.max()) if extra else 0.0)
    return Copies(n, whole, chosen, np.full(extra, whole, np.int32)), stats, seconds, longest


def fill(copies: Copies, target: int, rng_of) -> tuple[Copies, dict]:
    """Pad (seeded repeats of the copies, copy numbers continued per utterance) or drop (highest copy
    numbers first, seeded among equals) to ``target`` copies; (copies, the stats' update)."""
    delta = int(target - len(copies))
    if delta > 0:
        copies = _padded(copies, delta, rng_of(PAD))
    elif delta < 0:
        copies = _dropped(copies, -delta, rng_of(PAD))
    # a whole copy of every utterance is still there, or only the listed ones (the subset and its repeats)
    unique = copies.n if copies.whole else int(len(np.unique(copies.tail_utt)))
    return copies, {"padded": max(delta, 0), "remainder_dropped": max(-delta, 0), "copies_out": int(target),
                    "unique_out": unique}


def _padded(copies: Copies, count: int, rng: np.random.Generator) -> Copies:
    picks = rng.choice(len(copies), min(count, len(copies)), replace=False)
    extra_utt, _ = copies.utt_copy(picks[np.arange(count) % len(picks)].astype(np.int64))
    subset = copies.tail_utt  # before padding: the weight's subset, sorted, each once
    have = np.full(count, copies.whole, np.int64)
    if len(subset):
        at = np.searchsorted(subset, extra_utt).clip(max=len(subset) - 1)
        have += subset[at] == extra_utt
    order = np.argsort(extra_utt, kind="stable")
    ranked = extra_utt[order]
    occurrence = np.empty(count, np.int64)
    occurrence[order] = np.arange(count) - np.searchsorted(ranked, ranked, side="left")
    utt = np.concatenate([copies.tail_utt, extra_utt.astype(copies.tail_utt.dtype)])
    return Copies(copies.n, copies.whole, utt, np.concatenate([copies.tail_copy, (have + occurrence).astype(np.int32)]))


def _dropped(copies: Copies, count: int, rng: np.random.Generator) -> Copies:
    n, whole, utt, copy = copies.n, copies.whole, copies.tail_utt, copies.tail_copy
    while count > len(utt) and whole:  # the listed copies all go, then the highest whole copy is listed
        count -= len(utt)
        whole -= 1
        utt, copy = np.arange(n, dtype=index_dtype(n)), np.full(n, whole, np.int32)
    keep = np.ones(len(utt), bool)
    keep[rng.choice(len(utt), min(count, len(utt)), replace=False)] = False
    return Copies(n, whole, utt[keep], copy[keep])


def deal_order(d: np.ndarray, copies: Copies, seed: int, c: int) -> np.ndarray:
    """The copies' numbers k in deal order: version 2's deal key of each copy (inverted float32 duration above
    :class:`TieOrder`'s image of k), built from the utterances' durations and sorted whole in place (the
    keys are distinct, so any sort gives this order), k read back from the sorted keys.

    Keys are built and read back in blocks of ``_CHUNK`` copies: each step's temporaries are a block's, reused
    from block to block, not a corpus' (10 M copies: ~0.5 GB of fresh pages fewer per corpus)."""
    ties = TieOrder(seed, c)
    key = np.empty(len(copies), np.uint64)
    blocks = [(w * copies.n + start, d[start:start + _CHUNK]) for w in range(copies.whole)
              for start in range(0, copies.n, _CHUNK)]
    cut = copies.whole * copies.n
    blocks += [(cut + start, d[copies.tail_utt[start:start + _CHUNK]])
               for start in range(0, len(copies.tail_utt), _CHUNK)]
    for first, seconds in blocks:
        _keys_into(key[first:first + len(seconds)], seconds, first, ties)
    key.sort()
    ids = np.empty(len(key), np.int32)  # < 2**31 copies (the planner's check)
    for start in range(0, len(key), _CHUNK):
        ids[start:start + _CHUNK] = ties.inverse(key[start:start + _CHUNK].astype(np.uint32)).view(np.int32)
    return ids


def _keys_into(out: np.ndarray, seconds: np.ndarray, first: int, ties: TieOrder) -> None:
    """Deal keys of copies ``first``, ``first + 1``, ... (their seconds ``seconds``) into ``out``."""
    bits = seconds.astype(np.float32)
    bits += np.float32(0.0)  # -0.0 sorts as 0.0
    inverted = bits.view(np.uint32)
    np.invert(inverted, out=inverted)
    out[:] = inverted
    out <<= np.uint64(_deal.TIE_BITS)
    out |= ties.forward(np.arange(first, first + len(out), dtype=np.uint32))


class _Output:
    """The plan's four columns in output order, written in place as copies are dealt (the corpus column at
    once, from the counts; copy numbers start at 0 and only the repeats' are written)."""

    def __init__(self, counts: np.ndarray, most_copies: int):
        num_shards, corpora = counts.shape
        total = int(counts.sum())
        kinds = np.tile(np.arange(corpora, dtype=np.int8 if corpora < 128 else np.int32), num_shards)
        self.corpus = np.repeat(kinds, counts.reshape(-1))  # shard s: its corpora in index order, counts[s]
        self.utt = np.empty(total, index_dtype(total))
        # the narrowest type that holds every copy number (int8 for any mix weighted below ~127): 3 bytes a
        # copy less than int32 (0.3 GB at 100 M); the values, and so the plan's digest, are the same
        self.copy = np.zeros(total, next(t for t in (np.int8, np.int16, np.int32) if most_copies <= np.iinfo(t).max))
        self.seconds = np.empty(total)

    def put(self, where: np.ndarray, utt: np.ndarray, copy: np.ndarray, seconds: np.ndarray) -> None:
        self.utt[where] = utt
        self.seconds[where] = seconds
        repeats = copy != 0
        if repeats.any():
            self.copy[where[repeats]] = copy[repeats]

    def columns(self) -> dict:
        return {"corpus": self.corpus, "utt": self.utt, "copy": self.copy, "seconds": self.seconds}


def deal(pool: ThreadPoolExecutor, durations: list[np.ndarray], copies: list[Copies], counts: np.ndarray,
         seed: int) -> tuple[dict, np.ndarray]:
    """Every corpus' copies dealt (corpora with the longest mean first; in rounds, the longest copy left to
    the lightest shard so far) straight to their places: (the plan's columns, each shard's seconds).

    Shard s holds its corpora in index order (``counts[s]``), each in the order dealt; :func:`shuffle_shards`
    then shuffles each shard. The corpora's deal orders are sorted in ``pool``, the next corpus' while one is
    dealt.
    """
    num_shards, _ = counts.shape
    per_shard = int(counts[0].sum())
    out = _Output(counts, max(max(c.whole - 1, int(c.tail_copy.max(initial=0))) for c in copies))
    totals = np.zeros(num_shards)
    first_place = np.arange(num_shards, dtype=np.int64) * per_shard
    means = [len(c) and float(d.mean()) for d, c in zip(durations, copies)]
    order_of_corpora = [int(c) for c in np.argsort(-np.array(means), kind="stable") if len(copies[c])]
    ordered = {}
    for i, c in enumerate(order_of_corpora):
        if c not in ordered:
            ordered[c] = pool.submit(deal_order, durations[c], copies[c], seed, c)
        ids = ordered.pop(c).result()
        # the next corpus' order is sorted while this one is dealt, not beside the first one's sort: dealing
        # waits for the first order only, so it gets the cores (the unique-key check runs beside it)
        for ahead in order_of_corpora[i + 1:i + 2]:
            ordered[ahead] = pool.submit(deal_order, durations[ahead], copies[ahead], seed, ahead)
        places = first_place + counts[:, :c].sum(axis=1)  # where shard s's copies of corpus c start
        _deal_corpus(pool, ids, durations[c], copies[c], counts[:, c], places, totals, out)
        del ids
    return out.columns(), totals


def _deal_corpus(pool: ThreadPoolExecutor, ids: np.ndarray, d: np.ndarray, copies: Copies, count: np.ndarray,
                 places: np.ndarray, totals: np.ndarray, out: _Output) -> None:
    """A corpus' copies, in deal order ``ids``, dealt in rounds: each round's copies to the shards sorted
    lightest first (the last round only to the shards that take one more copy of it); shard s's r-th copy of
    the corpus goes to place ``places[s] + r``.

    Only the shards' order and totals need the rounds one after another, so only they run here, a batch of
    rounds at a time; the rest runs in ``pool`` beside them: the next batch's copies (utterance, copy number,
    seconds) are worked out while this one is dealt, and a dealt batch is written at its places while the next
    is dealt (each place is written once, so when a write runs does not change the plan)."""
    num_shards = len(count)
    base = int(count.min())
    step = max(1, _DEAL_BATCH // num_shards)
    batches = [(lo, min(lo + step, base)) for lo in range(0, base, step)]
    ahead = pool.submit(_batch_copies, ids, d, copies, batches[0], num_shards) if batches else None
    writing = None
    for b, (lo, hi) in enumerate(batches):
        utt, copy, seconds = ahead.result()
        ahead = pool.submit(_batch_copies, ids, d, copies, batches[b + 1], num_shards) if b + 1 < len(batches) else None
        taker = np.empty((hi - lo, num_shards), np.int64)  # the shard that takes each copy of the batch
        for r in range(hi - lo):
            lightest = stable_argsort(totals.view(np.uint64))  # sums of durations: >= 0, never -0.0
            taker[r] = lightest
            totals[lightest] += seconds[r * num_shards:(r + 1) * num_shards]
        if writing is not None:  # two batches' copies held at most
            writing.result()
        writing = pool.submit(_put_rounds, out, places, lo, taker, (utt, copy, seconds))
    if len(ids) > base * num_shards:  # the last round, to the shards that take one more copy of the corpus
        utt, copy = copies.utt_copy(ids[base * num_shards:].astype(np.int64))
        seconds = d[utt]
        eligible = np.flatnonzero(count > base)
        lightest = eligible[np.argsort(totals[eligible], kind="stable")]
        out.put(places[lightest] + base, utt, copy, seconds)
        totals[lightest] += seconds
    if writing is not None:
        writing.result()


def _batch_copies(ids: np.ndarray, d: np.ndarray, copies: Copies, rounds: tuple[int, int],
                  num_shards: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(utterance, copy number, seconds) of the copies dealt in rounds ``rounds`` (first, after last)."""
    utt, copy = copies.utt_copy(ids[rounds[0] * num_shards:rounds[1] * num_shards].astype(np.int64))
    return utt, copy, d[utt]


def _put_rounds(out: _Output, places: np.ndarray, first_round: int, taker: np.ndarray, dealt: tuple) -> None:
    """Dealt rounds written at their places: round ``first_round + r``'s copy that shard s took goes to
    ``places[s] + first_round + r``."""
    num_shards = taker.shape[1]
    for r, shards in enumerate(taker):
        taken = slice(r * num_shards, (r + 1) * num_shards)
        out.put(places[shards] + (first_round + r), *(column[taken] for column in dealt))


def shuffle_shards(pool: ThreadPoolExecutor, columns: dict, num_shards: int, per_shard: int, seed: int) -> None:
    """Each shard's copies in a seeded shuffle, the same for every column, in place: shards in blocks of
    ~1 M copies, block b drawn from its own stream ``[seed, ORDER, b]`` (blocks shuffle in ``pool``, and
    the result does not depend on which thread takes which)."""
    block = max(1, _CHUNK // per_shard)
    list(pool.map(lambda lo: _shuffle_block(columns, lo, min(block, num_shards - lo), per_shard, seed, lo // block),
                  range(0, num_shards, block)))


def _shuffle_block(columns: dict, lo: int, rows: int, per_shard: int, seed: int, b: int) -> None:
    dtype = np.int32 if rows * per_shard < 2**31 else np.int64
    order = np.random.default_rng([seed, ORDER, b]).permuted(
        np.tile(np.arange(per_shard, dtype=dtype), (rows, 1)), axis=1)
    order += (np.arange(rows, dtype=dtype) * per_shard)[:, None]
    order = order.reshape(-1)
    span = slice(lo * per_shard, (lo + rows) * per_shard)
    for column in columns.values():
        part = column[span]
        part[...] = part[order]


class SwappedRows:
    """The output's shards as rows of places (shard s: places s * per .. (s + 1) * per - 1), as
    :func:`shardkit.planning.balance.swaps.refine` reads and swaps them; only the rows a swap changed are
    held (``changed``)."""

    def __init__(self, num_shards: int, per_shard: int):
        self.shape = (num_shards, per_shard)
        self.changed: dict[int, np.ndarray] = {}

    def _row(self, a) -> np.ndarray:
        a = int(a)
        row = self.changed.get(a)
        return row if row is not None else np.arange(a * self.shape[1], (a + 1) * self.shape[1], dtype=np.int64)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            return self._row(key[0])[key[1]]
        return self._row(key)

    def __setitem__(self, key, value) -> None:
        a, i = int(key[0]), key[1]
        if a not in self.changed:
            self.changed[a] = self._row(a)
        self.changed[a][i] = value

    def apply(self, columns: dict) -> None:
        """Move the swapped copies in every column (each changed row read whole before any is written)."""
        per = self.shape[1]
        for column in columns.values():
            moved = {a: column[row] for a, row in self.changed.items()}
            for a, values in moved.items():
                column[a * per:(a + 1) * per] = values


def tolerance_seconds(seconds: np.ndarray, floor: float) -> float:
    """``max(floor, median_seconds(seconds))``, the same float: the median is found only when more than half of
    the copies are longer than ``floor`` (when they are not, both middle copies are at most ``floor``, and so is
    their mean: one counting pass instead of a partition)."""
    n = len(seconds)
    at_most = sum(int(np.count_nonzero(seconds[start:start + _CHUNK] <= floor)) for start in range(0, n, _CHUNK))
    if at_most > n // 2:
        return floor
    return max(floor, median_seconds(seconds))


def median_seconds(seconds: np.ndarray) -> float:
    """``np.median(seconds)``, exactly, with a float32 copy (half the memory of np.median's float64 one): the
    float32 order statistics bound the float64 ones (rounding keeps order), whose candidates are few."""
    n = len(seconds)
    low_rank, high_rank = (n - 1) // 2, n // 2
    rounded = seconds.astype(np.float32)
    rounded.partition([low_rank, high_rank])
    low, high = rounded[low_rank], rounded[high_rank]
    del rounded
    below, near = 0, []
    for start in range(0, n, _CHUNK):
        part = seconds[start:start + _CHUNK]
        as32 = part.astype(np.float32)
        below += int(np.count_nonzero(as32 < low))
        near.append(part[(as32 >= low) & (as32 <= high)])
    near = np.sort(np.concatenate(near))
    return float(np.mean([near[low_rank - below], near[high_rank - below]]))
