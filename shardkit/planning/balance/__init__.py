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

Plan versions (``version``; recorded as ``plan_version`` in the summary): all deal the same way and
meet the same tolerance; they differ in how the seeded choices are drawn and where copies are put, so
the same mix and seed give different (equally balanced) plans. Version 1 draws full permutations: the
weight's subset and the padding take the first items of a permutation of the corpus, and the deal order
is a stable sort, longest first, of a seeded shuffle. Version 2 draws only what it uses: the subset and
the padding are seeded draws without replacement (``Generator.choice``), and the deal order is one
sort of packed 64-bit keys, the duration as float32 (longest first: float32 keeps a 10-s duration to
1 us, and the shard totals still add the float64 seconds) above a seeded bijection of the copy's
index (ties in a seeded order, and the index read back from the key: no permutation, no argsort).
Version 3 (the default, :mod:`shardkit.planning.balance.direct`) draws as version 2 but lists no copy it
can describe (whole copies are implicit), deals each copy straight to its place in the output (no
placement sort, no gathers), swaps on the output and shuffles each shard in blocks, each block from its
own stream: at 20 M utterances about 2.5x less planner CPU than version 2, and a 100 M-utterance plan in
one piece under 4 GB (``benchmarks/results/2026-11-28-plan-scale.md``). Versions 1 and 2 stay for
plans made before them.
"""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from shardkit.errors import UsageError
from shardkit.planning.balance import direct
from shardkit.planning.balance.deal import check_packed_size, deal_copies, deal_orders
from shardkit.planning.balance.draws import ORDER, PAD, WEIGHT, Draws, index_dtype
from shardkit.planning.balance.swaps import refine, shard_totals

DEFAULT_SHARD_DURATION = 3600.0
TOLERANCE_FRACTION = 0.005
REFINE_FRACTION = 0.0005
REMAINDER_POLICIES = ("pad", "drop")
REPEAT_SUFFIX = "-rep{copy}"
REPEAT_MARK = REPEAT_SUFFIX.split("{")[0]  # "-rep": in every repeat's name
PLAN_VERSIONS = (1, 2, 3)
PLAN_VERSION = 3  # what balance plans unless asked for another (``--plan-version``)


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


@dataclass(frozen=True)
class PlanSettings:
    """What a plan is asked for: its consumers (``world_size`` x ``num_workers``), the shard size (a
    duration, or a count), what keeps counts equal (``remainder``), the seed and the plan version."""

    world_size: int
    num_workers: int
    shard_duration: float | None = None
    num_shards: int | None = None
    remainder: str = "pad"
    seed: int = 0
    version: int = PLAN_VERSION

    @property
    def groups(self) -> int:
        """Consumers of the list: the shard count is a multiple of this."""
        return self.world_size * self.num_workers


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
        """The rows of shard ``shard`` in the plan's arrays (every shard holds ``utts_per_shard`` rows)."""
        return slice(shard * self.utts_per_shard, (shard + 1) * self.utts_per_shard)

    @property
    def shard_seconds(self) -> np.ndarray:
        """Each shard's total audio seconds, in shard order."""
        return self.seconds.reshape(self.num_shards, self.utts_per_shard).sum(axis=1)

    @property
    def shard_corpus_counts(self) -> np.ndarray:
        """A (shards x corpora) array: how many utterances of each corpus every shard holds."""
        rows = self.corpus.reshape(self.num_shards, self.utts_per_shard)
        return np.stack([(rows == c).sum(axis=1) for c in range(len(self.names))], axis=1)

    @property
    def max_deviation(self) -> float:
        """The largest distance, in seconds, of any shard's total from the mean shard total."""
        return _max_deviation(self.shard_seconds)

    @property
    def balanced(self) -> bool:
        """Whether every shard's total is within ``tolerance`` seconds of the mean."""
        return self._within_tolerance(self.max_deviation)

    def _within_tolerance(self, deviation: float) -> bool:
        return deviation <= self.tolerance + 1e-9

    def summary(self) -> dict:
        """The plan's figures for the report: shard and utterance counts, topology, seed, remainder
        policy, version, and the spread of shard seconds (plain values, JSON-ready).
        """
        secs = self.shard_seconds  # summed once (20 M copies: ~20 ms a sum), the deviation taken from it
        deviation = _max_deviation(secs)
        return {"num_shards": self.num_shards, "utterances_per_shard": self.utts_per_shard,
                "world_size": self.world_size, "num_workers": self.num_workers, "seed": self.seed,
                "remainder": self.remainder, "plan_version": self.version, "utterances": int(len(self.utt)),
                "seconds": round(float(secs.sum()), 3), "mean_shard_seconds": round(float(secs.mean()), 3),
                "min_shard_seconds": round(float(secs.min()), 3), "max_shard_seconds": round(float(secs.max()), 3),
                "max_deviation_seconds": round(deviation, 3), "tolerance_seconds": round(self.tolerance, 3),
                "balanced": self._within_tolerance(deviation), "corpora": self.corpora, "notes": self.notes}


def _max_deviation(shard_seconds: np.ndarray) -> float:
    return float(np.abs(shard_seconds - shard_seconds.mean()).max())


def _check_args(durations, weights, names, settings: PlanSettings) -> None:
    """Refuse what cannot be planned, in one order: the settings, the corpora as a list, then each corpus."""
    _check_settings(settings)
    if not durations:
        raise UsageError("no corpus given")
    if len(weights) != len(durations) or len(names) != len(durations):
        raise UsageError("one weight and one name per corpus are needed")
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise UsageError(f"corpus {twice!r} is given twice")
    for name, d, w in zip(names, durations, weights):
        _check_corpus(name, d, w, settings.version)


def _check_settings(settings: PlanSettings) -> None:
    if settings.version not in PLAN_VERSIONS:
        raise UsageError(f"--plan-version must be one of {', '.join(map(str, PLAN_VERSIONS))} "
                         f"(got {settings.version!r})")
    if settings.world_size < 1 or settings.num_workers < 1:
        raise UsageError(f"--world-size and --num-workers must be >= 1 (got {settings.world_size} and "
                         f"{settings.num_workers})")
    if settings.remainder not in REMAINDER_POLICIES:
        raise UsageError(f"--remainder must be one of {', '.join(REMAINDER_POLICIES)} (got {settings.remainder!r})")


def _check_corpus(name: str, d: np.ndarray, w: float, version: int) -> None:
    if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0):
        raise UsageError(f"corpus {name!r}: weight must be a number > 0 (got {w})")
    if len(d) == 0:
        raise UsageError(f"corpus {name!r} is empty (no utterances)")
    if not np.all(np.isfinite(d)) or np.any(d < 0):
        raise UsageError(f"corpus {name!r} has a negative or non-finite duration")
    if version >= 2:
        check_packed_size(name, len(d), w, version)


def _distinct(utt: np.ndarray, n: int) -> int:
    return int(np.count_nonzero(np.bincount(utt, minlength=n)))


@dataclass(frozen=True)
class _Stream:
    """Where corpus ``c``'s seeded choices come from: the seed, the draws started ahead, the plan version."""

    seed: int
    c: int
    draws: Draws | None
    version: int

    def permutation(self, purpose: int, length: int) -> np.ndarray:
        """Version 1's draw: a permutation (taken from the draws started ahead, if it was)."""
        return (self.draws or Draws(None)).permutation(self.seed, purpose, self.c, length)

    def rng(self, purpose: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, purpose, self.c])


def _apply_weight(n: int, weight: float, stream: _Stream) -> tuple[np.ndarray, np.ndarray]:
    """(utterance index, copy number) of each kept copy: floor(weight) copies of all, plus a seeded fraction
    (sorted, after the whole copies: :func:`_pad` counts an utterance's copies from that layout)."""
    whole = int(math.floor(weight))
    extra = int(round((weight - whole) * n))
    index = index_dtype(n)
    # the draw is skipped when nothing is drawn (weight 1, 2, ...): the same result, without a permutation of n
    if not extra:
        chosen = np.zeros(0)
    elif stream.version == 1:
        chosen = np.sort(stream.permutation(WEIGHT, n)[:extra])
    else:
        chosen = np.sort(stream.rng(WEIGHT).choice(n, extra, replace=False))
    utt = np.concatenate([np.tile(np.arange(n, dtype=index), whole), chosen.astype(index)])
    copy = np.concatenate([np.repeat(np.arange(whole, dtype=np.int32), n), np.full(extra, whole, np.int32)])
    return utt, copy


def _pad(utt: np.ndarray, copy: np.ndarray, n: int, count: int, whole: int, stream: _Stream):
    """Add ``count`` repeats of seeded picks among the kept copies; copy numbers continue per utterance.

    ``whole``: the kept copies are ``whole`` copies of every utterance, then a sorted subset
    (:func:`_apply_weight`), so an utterance's copies are counted without a count of all n.
    """
    if stream.version == 1:
        picks = stream.permutation(PAD, len(utt))
    else:
        picks = stream.rng(PAD).choice(len(utt), min(count, len(utt)), replace=False)
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


def _drop(utt: np.ndarray, copy: np.ndarray, count: int, stream: _Stream):
    """Drop ``count`` copies: repeats first (highest copy number), seeded among equals."""
    rng = stream.rng(PAD)
    order = np.lexsort((rng.random(len(utt)), -copy))
    keep = np.sort(order[count:])
    return utt[keep], copy[keep]


def _choose_num_shards(total_seconds, total_utts, longest, groups, shard_duration, num_shards, notes) -> int:
    """The shard count: ``num_shards`` rounded to a multiple of ``groups`` (noted), or the multiple nearest
    ``total_seconds / shard_duration``; refused when it needs more utterances than there are, or shards
    shorter than the ``longest`` (seconds, corpus) utterance."""
    if num_shards is not None:
        count = _rounded_count(num_shards, total_utts, groups, notes)
    else:
        count = _count_for_duration(total_seconds, longest, groups, shard_duration)
    if count > total_utts:
        raise UsageError(f"{count} shards (a multiple of world_size x num_workers = {groups}) need at least "
                         f"{count} utterances; the mix has {total_utts} after weights")
    if total_seconds / count < longest[0]:
        raise UsageError(f"{count} shards would hold {total_seconds / count:.3f} s each, less than the longest "
                         f"utterance ({longest[0]:.3f} s, in corpus {longest[1]!r}); ask for fewer shards")
    return count


def _rounded_count(num_shards: int, total_utts: int, groups: int, notes: list[str]) -> int:
    if num_shards < 1:
        raise UsageError(f"--num-shards must be >= 1 (got {num_shards})")
    if num_shards > total_utts:
        raise UsageError(f"--num-shards {num_shards} asks for more shards than there are utterances "
                         f"({total_utts} after weights)")
    count = max(groups, int(math.floor(num_shards / groups + 0.5)) * groups)
    if count != num_shards:
        notes.append(f"--num-shards {num_shards} rounded to {count}, the nearest multiple of "
                     f"world_size x num_workers = {groups}")
    return count


def _count_for_duration(total_seconds: float, longest: tuple, groups: int, shard_duration: float | None) -> int:
    target = DEFAULT_SHARD_DURATION if shard_duration is None else shard_duration
    if not target > 0:
        raise UsageError(f"--shard-duration must be > 0 (got {target})")
    if target < longest[0]:
        raise UsageError(f"--shard-duration {target:g} s is shorter than the longest utterance "
                         f"({longest[0]:.3f} s, in corpus {longest[1]!r})")
    return max(groups, int(math.floor(total_seconds / target / groups + 0.5)) * groups)


def _weigh(d: np.ndarray, weight: float, name: str, stream: _Stream) -> tuple:
    """A corpus' copies at its weight, and what the shard count needs of them: (utt, copy, stats, seconds, longest)."""
    utt, copy = _apply_weight(len(d), weight, stream)
    if not len(utt):
        raise UsageError(f"corpus {name!r} keeps no utterance at weight {weight:g} ({len(d)} utterances)")
    # at a weight >= 1 every utterance is kept (copy 0 of each): no count needed
    kept = len(d) if weight >= 1 else _distinct(utt, len(d))
    stats = {"name": name, "weight": weight, "utterances": len(d), "seconds": round(float(d.sum()), 3),
             "kept": kept, "repeated": int(len(utt) - kept), "dropped": len(d) - kept}
    chosen = d if weight == 1 else d[utt]  # at weight 1 the copies are the utterances, in order
    return utt, copy, stats, chosen.sum(), float(chosen.max())


def _fill(d: np.ndarray, utt: np.ndarray, copy: np.ndarray, weight: float, target: int, stream: _Stream):
    """Pad or drop a corpus' copies to its target count; (utt, copy, seconds, stats update)."""
    delta = int(target - len(utt))
    whole = int(math.floor(weight))
    if delta > 0:
        utt, copy = _pad(utt, copy, len(d), delta, whole, stream)
    elif delta < 0:
        utt, copy = _drop(utt, copy, -delta, stream)
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


def plan_balance(durations: Sequence[np.ndarray], weights: Sequence[float], settings: PlanSettings, *,
                 names: Sequence[str] | None = None, threads: int = 2, draws: Draws | None = None,
                 on_repeats: Callable[[int, np.ndarray], None] | None = None) -> BalancePlan:
    """Plan equal shards for corpora given as arrays of utterance durations (seconds). Pure.

    Raises UsageError (before anything is written) for: a corpus given twice, an empty corpus, a
    weight <= 0, world_size or num_workers < 1, more shards than utterances, a shard duration
    shorter than the longest utterance.

    The per-corpus steps (weights, padding, the seeded shuffle and sort that order the dealing) are
    independent of each other, so they run in ``threads`` threads (numpy's sorts, permutations and
    gathers release the GIL); each draws from its own seeded stream, so the plan is the same, byte for
    byte, whatever the number of threads. ``draws``: permutations started earlier (:class:`Draws`; version 1
    draws permutations, version 2 none). ``settings.version``: how the seeded choices are drawn (module
    docstring). ``on_repeats(c, utts)``: told, as soon as the padding is chosen, which utterances of corpus
    c are repeated (balance starts reading their keys while the planner deals).
    """
    names = list(names) if names is not None else [f"corpus{i}" for i in range(len(durations))]
    weights = [float(w) for w in weights]
    durations = [np.asarray(d, dtype=np.float64) for d in durations]
    _check_args(durations, weights, names, settings)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        planner = _Planner(pool, durations, weights, names, settings)
        return planner.plan_direct(on_repeats) if settings.version == 3 else planner.plan(draws, on_repeats)


class _Planner:
    """One :func:`plan_balance` call, step by step: weigh, fill, deal, refine, gather into output order.

    The steps hand each other the per-corpus arrays and drop them as soon as the next step has what it
    needs (at 20 M utterances each int64 column is 160 MB: the peak is the point).
    """

    def __init__(self, pool: ThreadPoolExecutor, durations: list[np.ndarray], weights: list[float],
                 names: list[str], settings: PlanSettings):
        self.pool, self.durations, self.weights, self.names, self.settings = pool, durations, weights, names, settings
        self.notes: list[str] = []
        self.stats: list[dict] = []

    def _stream(self, c: int, draws: Draws | None) -> _Stream:
        return _Stream(self.settings.seed, c, draws, self.settings.version)

    def plan(self, draws: Draws | None, on_repeats) -> BalancePlan:
        s = self.settings
        utts, copies, count, per_shard, targets = self._weighed(draws)
        draws = draws or Draws(self.pool)
        if s.version == 1:  # likely dealing order: the permutations beside the padding, the first dealt first
            for c in np.argsort([-float(d.mean()) for d in self.durations], kind="stable"):
                draws.deal_ahead(s.seed, int(c), int(targets[c]))
        utts, copies, secs = self._filled(utts, copies, targets, draws)
        for c in range(len(utts)) if on_repeats is not None else ():
            on_repeats(c, utts[c][copies[c] > 0])
        rows = self._dealt(secs, _corpus_counts(targets, count, per_shard), draws)
        # compact columns (int8 corpus, int32 utterance and copy where they fit): at 20 M utterances each
        # int64 column is 160 MB; the values, and so the plan and its digest, are the same; each corpus'
        # part is freed as soon as it is joined (peak memory)
        corpus_of = np.concatenate([np.full(len(u), c, np.int8 if len(self.names) < 128 else np.int32)
                                    for c, u in enumerate(utts)])
        seconds, utt_of, copy_of = (_join(parts) for parts in (secs, utts, copies))
        tolerance = self._refined(rows, seconds, corpus_of, count)
        rows = np.random.default_rng([s.seed, ORDER]).permuted(rows, axis=1, out=rows)
        inputs = [corpus_of, utt_of, copy_of, seconds]
        del corpus_of, utt_of, copy_of, seconds
        columns = self._gathered(rows.reshape(-1), inputs)
        return BalancePlan(names=self.names, world_size=s.world_size, num_workers=s.num_workers, num_shards=count,
                           utts_per_shard=per_shard, seed=s.seed, remainder=s.remainder, corpora=self.stats,
                           tolerance=tolerance, notes=self.notes, version=s.version, **columns)

    def plan_direct(self, on_repeats) -> BalancePlan:
        """Version 3 (:mod:`shardkit.planning.balance.direct`): copies described, dealt straight to their places."""
        s, d = self.settings, self.durations
        weighed = list(self.pool.map(lambda c: direct.weigh(d[c], self.weights[c], self.names[c],
                                                             self._stream(c, None).rng), range(len(d))))
        copies, self.stats = [w[0] for w in weighed], [w[1] for w in weighed]
        count, per_shard, targets = self._shard_count([len(c) for c in copies], sum(w[2] for w in weighed),
                                                      max((w[3], name) for w, name in zip(weighed, self.names)))
        filled = list(self.pool.map(lambda c: direct.fill(copies[c], int(targets[c]), self._stream(c, None).rng),
                                    range(len(d))))
        copies = [f[0] for f in filled]
        for c, f in enumerate(filled):
            self.stats[c].update(f[1])
            if on_repeats is not None:
                on_repeats(c, f[0].repeated())
        del weighed, filled
        columns, totals = direct.deal(self.pool, d, copies, _corpus_counts(targets, count, per_shard), s.seed)
        seconds = columns["seconds"]
        mean_shard = float(totals.sum()) / count
        tolerance = direct.tolerance_seconds(seconds, TOLERANCE_FRACTION * mean_shard)
        goal = min(tolerance / 2, REFINE_FRACTION * mean_shard * math.sqrt(count / s.groups))
        rows = direct.SwappedRows(count, per_shard)
        refine(rows, seconds, columns["corpus"], goal=goal, totals=totals)
        rows.apply(columns)
        direct.shuffle_shards(self.pool, columns, count, per_shard, s.seed)
        return BalancePlan(names=self.names, world_size=s.world_size, num_workers=s.num_workers, num_shards=count,
                           utts_per_shard=per_shard, seed=s.seed, remainder=s.remainder, corpora=self.stats,
                           tolerance=tolerance, notes=self.notes, version=s.version, **columns)

    def _shard_count(self, weighted: list[int], total_seconds: float, longest: tuple):
        """The shard count, copies per shard and each corpus' target count of copies."""
        s = self.settings
        total_utts = int(sum(weighted))
        count = _choose_num_shards(total_seconds, total_utts, longest, s.groups, s.shard_duration, s.num_shards,
                                   self.notes)
        per_shard = -(-total_utts // count) if s.remainder == "pad" else total_utts // count
        return count, per_shard, apportion(np.array(weighted), count * per_shard)

    def _weighed(self, draws: Draws | None):
        """Every corpus at its weight, the shard count and each corpus' target count of copies:
        (utts, copies, count, per_shard, targets)."""
        s = self.settings
        d, weights, names = self.durations, self.weights, self.names
        weighed = list(self.pool.map(lambda c: _weigh(d[c], weights[c], names[c], self._stream(c, draws)),
                                     range(len(d))))
        utts, copies, self.stats = [w[0] for w in weighed], [w[1] for w in weighed], [w[2] for w in weighed]
        weighted = [len(u) for u in utts]
        longest = max((w[4], name) for w, name in zip(weighed, names))
        total_seconds = float(sum(w[3] for w in weighed))
        del weighed
        return (utts, copies, *self._shard_count(weighted, total_seconds, longest))

    def _filled(self, utts: list, copies: list, targets: np.ndarray, draws: Draws):
        """Each corpus padded or dropped to its target: (utts, copies, seconds) per corpus; the stats updated."""
        d, weights = self.durations, self.weights
        filled = list(self.pool.map(lambda c: _fill(d[c], utts[c], copies[c], weights[c], int(targets[c]),
                                                    self._stream(c, draws)), range(len(d))))
        utts.clear()
        copies.clear()
        for c, f in enumerate(filled):
            self.stats[c].update(f[3])
        return ([f[i] for f in filled] for i in range(3))

    def _dealt(self, secs: list[np.ndarray], counts: np.ndarray, draws: Draws) -> np.ndarray:
        """The shards' rows (positions in the corpora's concatenation), dealt corpora longest first."""
        means = [float(x.mean()) if len(x) else 0.0 for x in secs]
        order_of_corpora = np.argsort(-np.array(means), kind="stable")
        orders = deal_orders(self.pool, draws, secs, order_of_corpora, self.settings.seed, self.settings.version)
        return deal_copies(self.pool, secs, orders, counts)

    def _refined(self, rows: np.ndarray, seconds: np.ndarray, corpus_of: np.ndarray, count: int) -> float:
        """Swaps until the shards are within the goal (in place on ``rows``); the plan's tolerance."""
        mean_shard = float(seconds.sum()) / count
        median = self.pool.submit(np.median, seconds)  # beside the shard totals the swaps start from
        totals = shard_totals(rows, seconds)
        tolerance = max(TOLERANCE_FRACTION * mean_shard, float(median.result()))
        # aim inside the tolerance, tight enough that a consumer's sum of count / groups shards (whose
        # errors partly cancel, ~sqrt) stays within REFINE_FRACTION of the others
        goal = min(tolerance / 2, REFINE_FRACTION * mean_shard * math.sqrt(count / self.settings.groups))
        refine(rows, seconds, corpus_of, goal=goal, totals=totals)
        return tolerance

    def _gathered(self, flat: np.ndarray, inputs: list) -> dict:
        """The four columns in output order, one column at a time (in threads), each input freed once gathered
        (peak memory)."""
        def gather(i: int) -> np.ndarray:
            column, inputs[i] = inputs[i], None
            return column[flat]

        return dict(zip(("corpus", "utt", "copy", "seconds"), self.pool.map(gather, range(4))))


def plan_digest(plan: BalancePlan) -> str:
    """sha256 of what a plan assigns where: slices of different plans must not be merged."""
    h = hashlib.sha256()
    for column in (plan.corpus, plan.utt, plan.copy):
        h.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
    return h.hexdigest()
