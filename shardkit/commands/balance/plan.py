"""The pure planner of balance: durations per corpus in, an assignment of utterance copies to shards out.

Nothing here reads or writes a file, so a plan is a function of its arguments and the seed: every
job of a ``--split`` array computes the same one, and ``--dry-run`` shows exactly what a writing
run would write. Weights repeat (2.0), keep a seeded subset (0.5), or both (1.5); the shard count
is the multiple of ``world_size * num_workers`` nearest the asked shard duration; the remainder
that keeps counts equal is padded with repeats or dropped, spread over corpora in proportion.
Every shard then gets each corpus' share of utterances (counts differ by at most one per corpus),
and durations are equalised in two steps: within each corpus (longest corpora first) utterances
sorted by duration are dealt in rounds, the largest of a round to the shard with the fewest
seconds so far; then same-corpus swaps between the most and least loaded shards close what is
left. The guarantee is the tolerance (0.5% of the mean shard, or one median utterance, whichever
is larger); the swaps aim tighter, so that what a rank reads in an epoch (a sum of shards) agrees
with the other ranks to about 0.05%. Within a shard the order is a seeded shuffle; the k-th
repeat of an utterance is named ``<key>-rep<k>``.

Plan versions (``version``; recorded as ``plan_version`` in the summary): both deal the same way and
meet the same tolerance; they differ in how the seeded choices are drawn, so the same mix and seed
give different (equally balanced) plans. Version 1 draws full permutations: the weight's subset and
the padding take the first items of a permutation of the corpus, and the deal order is a stable sort,
longest first, of a seeded shuffle. Version 2 (the default) draws only what it uses: the subset and
the padding are seeded draws without replacement (``Generator.choice``), and the deal order is one
sort of packed 64-bit keys, the duration as float32 (longest first: float32 keeps a 10-s duration to
1 us, and the shard totals still add the float64 seconds) above a seeded bijection of the copy's
index (ties in a seeded order, and the index read back from the key: no permutation, no argsort).
At 20 M utterances the whole balance process takes 1.4x less CPU. Version 1 stays for plans made before it.
"""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from shardkit.errors import UsageError
from shardkit.planning.radix import stable_argsort

DEFAULT_SHARD_DURATION = 3600.0
TOLERANCE_FRACTION = 0.005
REFINE_FRACTION = 0.0005
REMAINDER_POLICIES = ("pad", "drop")
REPEAT_SUFFIX = "-rep{copy}"

# purposes of the seeded streams: each decision draws from its own stream
_WEIGHT, _PAD, _DEAL, _ORDER = 1, 2, 3, 4
SORT_RUN = 1 << 21  # copies per stable sort run (runs sorted in threads, then merged)
PLAN_VERSIONS = (1, 2)
PLAN_VERSION = 2  # what balance plans unless asked for another (``--plan-version``)
_TIE_BITS = 32  # version 2: low bits of a deal key, a bijection of the copy's index (so < 2**32 copies a corpus)


def repeat_key(key: str, copy: int) -> str:
    """Key of the ``copy``-th repeat of an utterance (copy 0 is the original key)."""
    return key if copy == 0 else key + REPEAT_SUFFIX.format(copy=copy)


def apportion(counts: np.ndarray, total: int) -> np.ndarray:
    """Split ``total`` in proportion to ``counts`` (largest remainder; ties to the earlier corpus)."""
    counts = np.asarray(counts, dtype=np.int64)
    quotas = counts * total / counts.sum()
    share = np.floor(quotas).astype(np.int64)
    left = total - int(share.sum())
    if left:
        order = np.argsort(-(quotas - share), kind="stable")
        share[order[:left]] += 1
    return share


@dataclass
class BalancePlan:
    """Assignment of utterance copies to shards, in output order (shard by shard).

    ``corpus[i]``, ``utt[i]`` (index within its corpus' durations), ``copy[i]`` (0 = original,
    k = k-th repeat) and ``seconds[i]`` describe position i; shard s holds positions
    ``s * utts_per_shard`` to ``(s + 1) * utts_per_shard - 1`` in that order.
    """

    names: list[str]
    world_size: int
    num_workers: int
    num_shards: int
    utts_per_shard: int
    seed: int
    remainder: str
    corpus: np.ndarray
    utt: np.ndarray
    copy: np.ndarray
    seconds: np.ndarray
    corpora: list[dict]
    tolerance: float
    notes: list[str] = field(default_factory=list)
    version: int = PLAN_VERSION

    def shard_slice(self, shard: int) -> slice:
        return slice(shard * self.utts_per_shard, (shard + 1) * self.utts_per_shard)

    @property
    def shard_seconds(self) -> np.ndarray:
        return self.seconds.reshape(self.num_shards, self.utts_per_shard).sum(axis=1)

    @property
    def shard_corpus_counts(self) -> np.ndarray:
        rows = self.corpus.reshape(self.num_shards, self.utts_per_shard)
        return np.stack([(rows == c).sum(axis=1) for c in range(len(self.names))], axis=1)

    @property
    def max_deviation(self) -> float:
        secs = self.shard_seconds
        return float(np.abs(secs - secs.mean()).max())

    @property
    def balanced(self) -> bool:
        return self.max_deviation <= self.tolerance + 1e-9

    def summary(self) -> dict:
        secs = self.shard_seconds
        return {"num_shards": self.num_shards, "utterances_per_shard": self.utts_per_shard,
                "world_size": self.world_size, "num_workers": self.num_workers, "seed": self.seed,
                "remainder": self.remainder, "plan_version": self.version, "utterances": int(len(self.utt)),
                "seconds": round(float(secs.sum()), 3), "mean_shard_seconds": round(float(secs.mean()), 3),
                "min_shard_seconds": round(float(secs.min()), 3), "max_shard_seconds": round(float(secs.max()), 3),
                "max_deviation_seconds": round(self.max_deviation, 3), "tolerance_seconds": round(self.tolerance, 3),
                "balanced": self.balanced, "corpora": self.corpora, "notes": self.notes}


def _check_args(durations, weights, names, world_size, num_workers, remainder, version=PLAN_VERSION) -> None:
    if version not in PLAN_VERSIONS:
        raise UsageError(f"--plan-version must be one of {', '.join(map(str, PLAN_VERSIONS))} (got {version!r})")
    if world_size < 1 or num_workers < 1:
        raise UsageError(f"--world-size and --num-workers must be >= 1 (got {world_size} and {num_workers})")
    if remainder not in REMAINDER_POLICIES:
        raise UsageError(f"--remainder must be one of {', '.join(REMAINDER_POLICIES)} (got {remainder!r})")
    if not durations:
        raise UsageError("no corpus given")
    if len(weights) != len(durations) or len(names) != len(durations):
        raise UsageError("one weight and one name per corpus are needed")
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise UsageError(f"corpus {twice!r} is given twice")
    for name, d, w in zip(names, durations, weights):
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0):
            raise UsageError(f"corpus {name!r}: weight must be a number > 0 (got {w})")
        if len(d) == 0:
            raise UsageError(f"corpus {name!r} is empty (no utterances)")
        if not np.all(np.isfinite(d)) or np.any(d < 0):
            raise UsageError(f"corpus {name!r} has a negative or non-finite duration")
        if version == 2 and len(d) * max(1.0, w) >= 2**_TIE_BITS / 2:
            raise UsageError(f"corpus {name!r}: plan version 2 deals fewer than 2**31 copies of a corpus "
                             f"({len(d)} utterances at weight {w:g}); plan it with --plan-version 1")


def _distinct(utt: np.ndarray, n: int) -> int:
    return int(np.count_nonzero(np.bincount(utt, minlength=n)))


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
            self._submit(seed, _WEIGHT, c, n)
        if remainder == "pad":
            self._submit(seed, _PAD, c, whole * n + extra)

    def deal_ahead(self, seed: int, c: int, length: int) -> None:
        """Start the permutation that orders corpus c's ``length`` copies for dealing (:func:`_deal_key`)."""
        self._submit(seed, _DEAL, c, length)

    def _submit(self, seed: int, purpose: int, c: int, length: int) -> None:
        key = (seed, purpose, c, length)
        if key not in self._futures and length:
            self._futures[key] = self._pool.submit(_permutation, seed, purpose, c, length)

    def permutation(self, seed: int, purpose: int, c: int, length: int) -> np.ndarray:
        # a draw is submitted before any task that takes it, so a pool thread never waits on a queued one
        future = self._futures.pop((seed, purpose, c, length), None)
        return future.result() if future is not None else _permutation(seed, purpose, c, length)


def _permutation(seed: int, purpose: int, c: int, length: int) -> np.ndarray:
    """The first draw of the stream ``[seed, purpose, c]``: a permutation of ``length`` (int32 below 2**31
    items: the same values in half the memory, while it waits to be taken)."""
    return np.random.default_rng([seed, purpose, c]).permutation(length).astype(_index_dtype(length))


def _apply_weight(n: int, weight: float, seed: int, c: int, draws: Draws | None = None, version: int = 1
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(utterance index, copy number) of each kept copy: floor(weight) copies of all, plus a seeded fraction
    (sorted, after the whole copies: :func:`_pad` counts an utterance's copies from that layout)."""
    whole = int(math.floor(weight))
    extra = int(round((weight - whole) * n))
    index = _index_dtype(n)
    # the draw is skipped when nothing is drawn (weight 1, 2, ...): the same result, without a permutation of n
    if not extra:
        chosen = np.zeros(0)
    elif version == 1:
        chosen = np.sort((draws or Draws(None)).permutation(seed, _WEIGHT, c, n)[:extra])
    else:
        chosen = np.sort(np.random.default_rng([seed, _WEIGHT, c]).choice(n, extra, replace=False))
    utt = np.concatenate([np.tile(np.arange(n, dtype=index), whole), chosen.astype(index)])
    copy = np.concatenate([np.repeat(np.arange(whole, dtype=np.int32), n), np.full(extra, whole, np.int32)])
    return utt, copy


def _index_dtype(n: int):
    """int32 indexes below 2**31 items (half the memory of int64 at 20 M utterances), else int64."""
    return np.int32 if n < 2**31 - 1 else np.int64


def _shard_dtype(num_shards: int):
    """Shard numbers as uint16 where they fit: a stable sort of them is then numpy's (linear) radix sort."""
    return np.uint16 if num_shards <= 1 << 16 else _index_dtype(num_shards)


def _pad(utt: np.ndarray, copy: np.ndarray, n: int, count: int, seed: int, c: int, draws: Draws | None,
         version: int, whole: int):
    """Add ``count`` repeats of seeded picks among the kept copies; copy numbers continue per utterance.

    ``whole``: the kept copies are ``whole`` copies of every utterance, then a sorted subset
    (:func:`_apply_weight`), so an utterance's copies are counted without a count of all n.
    """
    if version == 1:
        picks = (draws or Draws(None)).permutation(seed, _PAD, c, len(utt))
    else:
        picks = np.random.default_rng([seed, _PAD, c]).choice(len(utt), min(count, len(utt)), replace=False)
    extra_utt = utt[picks[np.arange(count) % len(picks)]]
    have = _copies_of(utt, n, whole, extra_utt)
    order = np.argsort(extra_utt, kind="stable")
    sorted_utt = extra_utt[order]
    first = np.searchsorted(sorted_utt, sorted_utt, side="left")
    occurrence = np.empty(count, np.int64)
    occurrence[order] = np.arange(count) - first
    extra_copy = have + occurrence
    return np.concatenate([utt, extra_utt]), np.concatenate([copy, extra_copy.astype(copy.dtype)])


def _copies_of(utt: np.ndarray, n: int, whole: int, which: np.ndarray) -> np.ndarray:
    """How many copies of each utterance in ``which`` ``utt`` holds (``whole``: see :func:`_pad`)."""
    subset = utt[whole * n:]
    if not len(subset):
        return np.full(len(which), whole, np.int64)
    at = np.searchsorted(subset, which).clip(max=len(subset) - 1)
    return whole + (subset[at] == which).astype(np.int64)


def _drop(utt: np.ndarray, copy: np.ndarray, count: int, seed: int, c: int):
    """Drop ``count`` copies: repeats first (highest copy number), seeded among equals."""
    rng = np.random.default_rng([seed, _PAD, c])
    order = np.lexsort((rng.random(len(utt)), -copy))
    keep = np.sort(order[count:])
    return utt[keep], copy[keep]


def _choose_num_shards(total_seconds, total_utts, longest, groups, shard_duration, num_shards, notes) -> int:
    if num_shards is not None:
        if num_shards < 1:
            raise UsageError(f"--num-shards must be >= 1 (got {num_shards})")
        if num_shards > total_utts:
            raise UsageError(f"--num-shards {num_shards} asks for more shards than there are utterances "
                             f"({total_utts} after weights)")
        count = max(groups, int(math.floor(num_shards / groups + 0.5)) * groups)
        if count != num_shards:
            notes.append(f"--num-shards {num_shards} rounded to {count}, the nearest multiple of "
                         f"world_size x num_workers = {groups}")
    else:
        target = DEFAULT_SHARD_DURATION if shard_duration is None else shard_duration
        if not target > 0:
            raise UsageError(f"--shard-duration must be > 0 (got {target})")
        if target < longest[0]:
            raise UsageError(f"--shard-duration {target:g} s is shorter than the longest utterance "
                             f"({longest[0]:.3f} s, in corpus {longest[1]!r})")
        count = max(groups, int(math.floor(total_seconds / target / groups + 0.5)) * groups)
    if count > total_utts:
        raise UsageError(f"{count} shards (a multiple of world_size x num_workers = {groups}) need at least "
                         f"{count} utterances; the mix has {total_utts} after weights")
    if total_seconds / count < longest[0]:
        raise UsageError(f"{count} shards would hold {total_seconds / count:.3f} s each, less than the longest "
                         f"utterance ({longest[0]:.3f} s, in corpus {longest[1]!r}); ask for fewer shards")
    return count


def _deal_key(pool: ThreadPoolExecutor, draws: Draws, seconds: np.ndarray, seed: int, c: int):
    """Version 1: a corpus' copies in seeded shuffle order, their sort key (longest first), and the stable
    sorts of the key's runs of ``SORT_RUN``, submitted to ``pool`` (a 10 M-utterance corpus is not one
    thread's sort); returns what yields the deal order once the runs are sorted."""
    ids = draws.permutation(seed, _DEAL, int(c), len(seconds)).astype(_index_dtype(len(seconds)))
    key = -seconds[ids]
    runs = [pool.submit(_sort_run, key, start, min(start + SORT_RUN, len(key)))
            for start in range(0, len(key), SORT_RUN)]
    return lambda: _merged_order(ids, key, runs)


def _sort_run(key: np.ndarray, start: int, stop: int) -> np.ndarray:
    order = np.argsort(key[start:stop], kind="stable").astype(_index_dtype(len(key)))
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
        k0, m1, m2, k1 = np.random.default_rng([seed, _DEAL, c]).integers(0, 2**32, 4, dtype=np.uint64)
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
    key <<= np.uint64(_TIE_BITS)
    key |= ties.forward(np.arange(len(seconds), dtype=np.uint32))
    runs = [pool.submit(_sort_in_place, key, start, min(start + SORT_RUN, len(key)))
            for start in range(0, len(key), SORT_RUN)]
    return lambda: _order_from_keys(key, runs, ties)


def _sort_in_place(key: np.ndarray, start: int, stop: int) -> None:
    key[start:stop].sort()


def _order_from_keys(key: np.ndarray, runs: list, ties: TieOrder) -> np.ndarray:
    for run in runs:
        run.result()
    runs.clear()
    if len(key) > SORT_RUN:  # sorted runs: timsort merges them (keys are distinct, so stable or not is alike)
        key.sort(kind="stable")
    low = key.astype(np.uint32)  # the index's image: the low 32 bits (a cast to uint32 keeps them)
    return ties.inverse(low).view(np.int32)  # < 2**31 copies (_check_args): int32, as _index_dtype says


def _deal_orders(pool: ThreadPoolExecutor, draws: Draws, seconds: list[np.ndarray], order_of_corpora, seed: int,
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


def _deal(pool: ThreadPoolExecutor, seconds: list[np.ndarray], orders, counts: np.ndarray) -> np.ndarray:
    """The copies of each shard (a ``num_shards x per_shard`` array of positions in the corpora's
    concatenation), dealt corpus by corpus (``orders``: (corpus, deal order) pairs, see
    :func:`_deal_orders`) in rounds, the largest copy left to the lightest shard so far.

    Within a shard the positions are ascending (a stable sort of the copies by shard); each corpus'
    copies are placed (:func:`_place`) in ``pool`` while the next corpus is dealt.
    """
    num_shards = counts.shape[0]
    total = sum(len(s) for s in seconds)
    rows = np.empty((num_shards, total // num_shards), _index_dtype(total))
    offsets = np.cumsum([0] + [len(s) for s in seconds])
    totals = np.zeros(num_shards)
    placed = []
    for c, ids in orders:
        ranked = seconds[c][ids]  # in deal order: each round reads a slice, not a gather
        dealt = np.empty(len(ids), _shard_dtype(num_shards))
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


def _best_swap(row_a, row_b, seconds, corpus_of, dev_a, dev_b):
    """Best same-corpus swap between two shards: (new worst deviation, index in a, index in b)."""
    best = None
    half = (dev_a - dev_b) / 2  # moving this many seconds from a to b evens them out
    ca, cb = corpus_of[row_a], corpus_of[row_b]
    for c in np.intersect1d(ca, cb):
        ia = np.flatnonzero(ca == c)
        ib = np.flatnonzero(cb == c)
        xa = seconds[row_a[ia]]
        yb_order = np.argsort(seconds[row_b[ib]], kind="stable")
        yb = seconds[row_b[ib]][yb_order]
        pos = np.searchsorted(yb, xa - half)
        for cand in (np.clip(pos, 0, len(yb) - 1), np.clip(pos - 1, 0, len(yb) - 1)):
            moved = xa - yb[cand]
            worst = np.maximum(np.abs(dev_a - moved), np.abs(dev_b + moved))
            k = int(np.argmin(worst))
            if best is None or worst[k] < best[0]:
                best = (float(worst[k]), int(ia[k]), int(ib[yb_order[cand[k]]]))
    return best


def _shard_totals(rows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    # block by block (each row sums alike): seconds[rows] at once would be a 20 M-element temporary
    return np.concatenate([seconds[rows[a:a + 4096]].sum(axis=1) for a in range(0, rows.shape[0], 4096)])


def _refine(rows, seconds, corpus_of, goal, partners=4, max_steps=None, totals=None) -> None:
    """Same-corpus swaps (in place on ``rows``) until every shard is within ``goal`` of the mean."""
    num_shards = rows.shape[0]
    totals = _shard_totals(rows, seconds) if totals is None else totals
    mean = totals.mean()
    stuck = np.zeros(num_shards, bool)
    for _ in range(max_steps or 4 * num_shards + 100):
        dev = totals - mean
        score = np.abs(dev)
        score[stuck] = -1.0
        a = int(np.argmax(score))
        if score[a] <= goal:
            return
        candidates = np.argsort(dev if dev[a] > 0 else -dev, kind="stable")[:partners + 1]
        best = None
        for b in candidates:
            if b == a or np.sign(dev[b]) == np.sign(dev[a]) and dev[b] != 0:
                continue
            found = _best_swap(rows[a], rows[b], seconds, corpus_of, dev[a], dev[b])
            if found and found[0] < max(abs(dev[a]), abs(dev[b])) - 1e-9 and (best is None or found[0] < best[0]):
                best = (*found, int(b))
        if best is None:
            stuck[a] = True
            continue
        _, i, j, b = best
        moved = seconds[rows[a, i]] - seconds[rows[b, j]]
        rows[a, i], rows[b, j] = rows[b, j], rows[a, i]
        totals[a] -= moved
        totals[b] += moved
        stuck[[a, b]] = False


def _weigh(d: np.ndarray, weight: float, name: str, seed: int, c: int, draws: Draws | None, version: int = 1
           ) -> tuple:
    """A corpus' copies at its weight, and what the shard count needs of them: (utt, copy, stats, seconds, longest)."""
    utt, copy = _apply_weight(len(d), weight, seed, c, draws, version)
    if not len(utt):
        raise UsageError(f"corpus {name!r} keeps no utterance at weight {weight:g} ({len(d)} utterances)")
    # at a weight >= 1 every utterance is kept (copy 0 of each): no count needed
    kept = len(d) if weight >= 1 else _distinct(utt, len(d))
    stats = {"name": name, "weight": weight, "utterances": len(d), "seconds": round(float(d.sum()), 3),
             "kept": kept, "repeated": int(len(utt) - kept), "dropped": len(d) - kept}
    chosen = d if weight == 1 else d[utt]  # at weight 1 the copies are the utterances, in order
    return utt, copy, stats, chosen.sum(), float(chosen.max())


def _fill(d: np.ndarray, utt: np.ndarray, copy: np.ndarray, weight: float, target: int, seed: int, c: int,
          draws: Draws | None, version: int = 1):
    """Pad or drop a corpus' copies to its target count; (utt, copy, seconds, stats update)."""
    delta = int(target - len(utt))
    whole = int(math.floor(weight))
    if delta > 0:
        utt, copy = _pad(utt, copy, len(d), delta, seed, c, draws, version, whole)
    elif delta < 0:
        utt, copy = _drop(utt, copy, -delta, seed, c)
    # padding only repeats kept copies: at a weight >= 1 every utterance is still there
    unique = len(d) if weight >= 1 and delta >= 0 else _distinct(utt, len(d))
    if delta >= 0:  # whole copies of d first (_apply_weight, _pad): copied, not gathered (the same values)
        seconds = np.concatenate([np.tile(d, whole), d[utt[whole * len(d):]]])
    else:
        seconds = d[utt]
    update = {"padded": max(delta, 0), "remainder_dropped": max(-delta, 0), "copies_out": int(target),
              "unique_out": unique}
    return utt, copy, seconds, update


def _join(parts: list[np.ndarray]) -> np.ndarray:
    """The parts in one array; ``parts`` is emptied as they are copied, so each part is freed once joined."""
    out = np.empty(sum(len(p) for p in parts), parts[0].dtype)
    start = 0
    while parts:
        part = parts.pop(0)
        out[start:start + len(part)] = part
        start += len(part)
    return out


def _corpus_counts(targets: np.ndarray, count: int, per_shard: int) -> np.ndarray:
    """Copies of each corpus per shard: floor(share) of every corpus; the leftover copies go round-robin,
    so every shard gets the same number of them and no shard two of one corpus."""
    base = targets // count
    counts = np.tile(base, (count, 1))
    start = 0
    for c, left in enumerate(targets % count):
        counts[(start + np.arange(left)) % count, c] += 1
        start += int(left)
    assert (counts.sum(axis=1) == per_shard).all()
    return counts


def plan_balance(durations: Sequence[np.ndarray], weights: Sequence[float], *, world_size: int, num_workers: int,
                 shard_duration: float | None = None, num_shards: int | None = None, remainder: str = "pad",
                 seed: int = 0, names: Sequence[str] | None = None, threads: int = 2,
                 draws: Draws | None = None, on_repeats: Callable[[int, np.ndarray], None] | None = None,
                 version: int = PLAN_VERSION) -> BalancePlan:
    """Plan equal shards for corpora given as arrays of utterance durations (seconds). Pure.

    Raises UsageError (before anything is written) for: a corpus given twice, an empty corpus, a
    weight <= 0, world_size or num_workers < 1, more shards than utterances, a shard duration
    shorter than the longest utterance.

    The per-corpus steps (weights, padding, the seeded shuffle and sort that order the dealing) are
    independent of each other, so they run in ``threads`` threads (numpy's sorts, permutations and
    gathers release the GIL); each draws from its own seeded stream, so the plan is the same, byte for
    byte, whatever the number of threads. ``draws``: permutations started earlier (:class:`Draws`; version 1
    draws permutations, version 2 none). ``version``: how the seeded choices are drawn (module docstring).
    ``on_repeats(c, utts)``: told, as soon as the padding is chosen, which utterances of corpus c are
    repeated (balance starts reading their keys while the planner deals).
    """
    names = list(names) if names is not None else [f"corpus{i}" for i in range(len(durations))]
    weights = [float(w) for w in weights]
    durations = [np.asarray(d, dtype=np.float64) for d in durations]
    _check_args(durations, weights, names, world_size, num_workers, remainder, version)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        return _plan_in(pool, durations, weights, names, world_size=world_size, num_workers=num_workers,
                        shard_duration=shard_duration, num_shards=num_shards, remainder=remainder, seed=seed,
                        draws=draws, on_repeats=on_repeats, version=version)


def _plan_in(pool: ThreadPoolExecutor, durations: list[np.ndarray], weights: list[float], names: list[str], *,
             world_size: int, num_workers: int, shard_duration: float | None, num_shards: int | None,
             remainder: str, seed: int, draws: Draws | None, on_repeats=None, version: int = 1) -> BalancePlan:
    groups = world_size * num_workers
    notes: list[str] = []
    corpora = range(len(durations))
    weighed = list(pool.map(lambda c: _weigh(durations[c], weights[c], names[c], seed, c, draws, version), corpora))
    utts, copies, stats = [w[0] for w in weighed], [w[1] for w in weighed], [w[2] for w in weighed]
    weighted = np.array([len(u) for u in utts])
    total_utts = int(weighted.sum())
    longest = max((w[4], name) for w, name in zip(weighed, names))
    total_seconds = float(sum(w[3] for w in weighed))
    del weighed
    count = _choose_num_shards(total_seconds, total_utts, longest, groups, shard_duration, num_shards, notes)

    per_shard = -(-total_utts // count) if remainder == "pad" else total_utts // count
    targets = apportion(weighted, count * per_shard)
    draws = draws or Draws(pool)
    for c in np.argsort([-float(d.mean()) for d in durations], kind="stable") if version == 1 else ():
        # likely dealing order: the permutations beside the padding, the first dealt first
        draws.deal_ahead(seed, int(c), int(targets[c]))
    filled = list(pool.map(lambda c: _fill(durations[c], utts[c], copies[c], weights[c], int(targets[c]), seed, c,
                                           draws, version), corpora))
    del utts, copies
    utts, copies, secs = ([f[i] for f in filled] for i in range(3))
    for c in corpora if on_repeats is not None else ():
        on_repeats(c, utts[c][copies[c] > 0])
    for c, f in enumerate(filled):
        stats[c].update(f[3])
    del filled
    counts = _corpus_counts(targets, count, per_shard)
    means = [float(s.mean()) if len(s) else 0.0 for s in secs]
    order_of_corpora = np.argsort(-np.array(means), kind="stable")
    rows = _deal(pool, secs, _deal_orders(pool, draws, secs, order_of_corpora, seed, version), counts)
    # compact columns (int8 corpus, int32 utterance and copy where they fit): at 20 M utterances each
    # int64 column is 160 MB; the values, and so the plan and its digest, are the same; each corpus'
    # part is freed as soon as it is joined (peak memory)
    corpus_of = np.concatenate([np.full(len(u), c, np.int8 if len(names) < 128 else np.int32)
                                for c, u in enumerate(utts)])
    seconds, utt_of, copy_of = (_join(parts) for parts in (secs, utts, copies))
    mean_shard = float(seconds.sum()) / count
    median = pool.submit(np.median, seconds)  # beside the shard totals the swaps start from
    totals = _shard_totals(rows, seconds)
    tolerance = max(TOLERANCE_FRACTION * mean_shard, float(median.result()))
    # aim inside the tolerance, tight enough that a consumer's sum of count / groups shards (whose
    # errors partly cancel, ~sqrt) stays within REFINE_FRACTION of the others
    goal = min(tolerance / 2, REFINE_FRACTION * mean_shard * math.sqrt(count / groups))
    _refine(rows, seconds, corpus_of, goal=goal, totals=totals)
    rows = np.random.default_rng([seed, _ORDER]).permuted(rows, axis=1, out=rows)
    flat = rows.reshape(-1)
    del rows
    # into output order one column at a time (in threads), each input freed once gathered (peak memory)
    inputs = [corpus_of, utt_of, copy_of, seconds]
    del corpus_of, utt_of, copy_of, seconds

    def gather(i: int) -> np.ndarray:
        column, inputs[i] = inputs[i], None
        return column[flat]

    columns = dict(zip(("corpus", "utt", "copy", "seconds"), pool.map(gather, range(4))))
    return BalancePlan(names=names, world_size=world_size, num_workers=num_workers, num_shards=count,
                       utts_per_shard=per_shard, seed=seed, remainder=remainder, corpora=stats,
                       tolerance=tolerance, notes=notes, version=version, **columns)


def plan_digest(plan: BalancePlan) -> str:
    """sha256 of what a plan assigns where: slices of different plans must not be merged."""
    h = hashlib.sha256()
    for column in (plan.corpus, plan.utt, plan.copy):
        h.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
    return h.hexdigest()
