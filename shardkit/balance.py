"""balance: equal-duration, equal-count shards for a multi-corpus mix, so no rank starves or waits.

Two halves:

* :func:`plan_balance` is pure (durations per corpus in, an assignment out), deterministic for a
  seed. Weights repeat (2.0), keep a seeded subset (0.5), or both (1.5); the shard count is the
  multiple of ``world_size * num_workers`` nearest the asked shard duration; the remainder that
  keeps counts equal is padded with repeats or dropped, spread over corpora in proportion. Every
  shard then gets each corpus' share of utterances (counts differ by at most one per corpus), and
  durations are equalised in two steps: within each corpus (longest corpora first) utterances
  sorted by duration are dealt in rounds, the largest of a round to the shard with the fewest
  seconds so far; then same-corpus swaps between the most and least loaded shards close what is
  left. The guarantee is the tolerance (0.5% of the mean shard, or one median utterance, whichever
  is larger); the swaps aim tighter, so that what a rank reads in an epoch (a sum of shards)
  agrees with the other ranks to about 0.05%. Within a shard the order is a seeded shuffle; the
  k-th repeat of an utterance is named ``<key>-rep<k>``.
* :func:`run_balance` does the I/O: sources (shards, folders, data.list files or indexes) are
  indexed, planned, and written. Where each member lives comes from the index (offset in the
  decompressed tar), so each output shard is written by positioned reads (``os.pread``) in the
  planned order, one member in memory at a time, with a bounded set of open files. Plain sources
  are read in place; a compressed source is first decompressed once to a spool file in
  ``OUT_DIR/.balance/spool`` (the only way to reach its members without re-decompressing it for
  every output shard; it needs free disk equal to the uncompressed size of the compressed
  sources, and is removed at the end). Output shards are independent tasks (``-j``, or Ray tasks
  with ``executor="ray"``), written to a temporary name, read back and verified, fsynced and
  renamed; a journal lets a killed run resume and skip the shards it finished. With
  ``split=(I, N)`` every job of an array computes the same plan and writes only block I of the
  output shards; each job spools into its own ``spool.slice-I-of-N`` folder (jobs run at once and
  end apart), while the indexes of shard sources in ``OUT_DIR/.balance/index`` are shared (built
  atomically, identical bytes) and removed by ``merge-reports``.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .errors import ShardkitError, UsageError
from .executor import run_tasks
from .split import inputs_digest, slice_path, slice_record

DEFAULT_SHARD_DURATION = 3600.0
TOLERANCE_FRACTION = 0.005
REFINE_FRACTION = 0.0005
REMAINDER_POLICIES = ("pad", "drop")
REPEAT_SUFFIX = "-rep{copy}"

# purposes of the seeded streams: each decision draws from its own stream
_WEIGHT, _PAD, _DEAL, _ORDER = 1, 2, 3, 4


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
                "remainder": self.remainder, "utterances": int(len(self.utt)),
                "seconds": round(float(secs.sum()), 3), "mean_shard_seconds": round(float(secs.mean()), 3),
                "min_shard_seconds": round(float(secs.min()), 3), "max_shard_seconds": round(float(secs.max()), 3),
                "max_deviation_seconds": round(self.max_deviation, 3), "tolerance_seconds": round(self.tolerance, 3),
                "balanced": self.balanced, "corpora": self.corpora, "notes": self.notes}


def _check_args(durations, weights, names, world_size, num_workers, remainder) -> None:
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


def _distinct(utt: np.ndarray, n: int) -> int:
    return int(np.count_nonzero(np.bincount(utt, minlength=n)))


def _apply_weight(n: int, weight: float, seed: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """(utterance index, copy number) of each kept copy: floor(weight) copies of all, plus a seeded fraction."""
    whole = int(math.floor(weight))
    extra = int(round((weight - whole) * n))
    chosen = np.sort(np.random.default_rng([seed, _WEIGHT, c]).permutation(n)[:extra])
    utt = np.concatenate([np.tile(np.arange(n), whole), chosen])
    copy = np.concatenate([np.repeat(np.arange(whole), n), np.full(extra, whole)])
    return utt.astype(np.int64), copy.astype(np.int64)


def _pad(utt: np.ndarray, copy: np.ndarray, n: int, count: int, seed: int, c: int):
    """Add ``count`` repeats of seeded picks among the kept copies; copy numbers continue per utterance."""
    rng = np.random.default_rng([seed, _PAD, c])
    picks = rng.permutation(len(utt))
    extra_utt = utt[picks[np.arange(count) % len(utt)]]
    have = np.bincount(utt, minlength=n)
    order = np.argsort(extra_utt, kind="stable")
    sorted_utt = extra_utt[order]
    first = np.searchsorted(sorted_utt, sorted_utt, side="left")
    occurrence = np.empty(count, np.int64)
    occurrence[order] = np.arange(count) - first
    extra_copy = have[extra_utt] + occurrence
    return np.concatenate([utt, extra_utt]), np.concatenate([copy, extra_copy])


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


def _deal(corpus_of, seconds, counts, order_of_corpora, seed) -> np.ndarray:
    """Shard of each copy: per corpus, sorted longest first, dealt in rounds to the lightest shards."""
    num_shards = counts.shape[0]
    totals = np.zeros(num_shards)
    shard_of = np.empty(len(seconds), np.int64)
    for c in order_of_corpora:
        ids = np.flatnonzero(corpus_of == c)
        if not len(ids):
            continue
        ids = ids[np.random.default_rng([seed, _DEAL, int(c)]).permutation(len(ids))]
        ids = ids[np.argsort(-seconds[ids], kind="stable")]
        base = int(counts[:, c].min())
        for r in range(base):
            chunk = ids[r * num_shards:(r + 1) * num_shards]
            lightest = np.argsort(totals, kind="stable")
            shard_of[chunk] = lightest
            totals[lightest] += seconds[chunk]
        rest = ids[base * num_shards:]
        if len(rest):
            eligible = np.flatnonzero(counts[:, c] > base)
            lightest = eligible[np.argsort(totals[eligible], kind="stable")]
            shard_of[rest] = lightest
            totals[lightest] += seconds[rest]
    return shard_of


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


def _refine(rows, seconds, corpus_of, goal, partners=4, max_steps=None) -> None:
    """Same-corpus swaps (in place on ``rows``) until every shard is within ``goal`` of the mean."""
    num_shards = rows.shape[0]
    totals = seconds[rows].sum(axis=1)
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


def plan_balance(durations: Sequence[np.ndarray], weights: Sequence[float], *, world_size: int, num_workers: int,
                 shard_duration: float | None = None, num_shards: int | None = None, remainder: str = "pad",
                 seed: int = 0, names: Sequence[str] | None = None) -> BalancePlan:
    """Plan equal shards for corpora given as arrays of utterance durations (seconds). Pure.

    Raises UsageError (before anything is written) for: a corpus given twice, an empty corpus, a
    weight <= 0, world_size or num_workers < 1, more shards than utterances, a shard duration
    shorter than the longest utterance.
    """
    names = list(names) if names is not None else [f"corpus{i}" for i in range(len(durations))]
    weights = [float(w) for w in weights]
    durations = [np.asarray(d, dtype=np.float64) for d in durations]
    _check_args(durations, weights, names, world_size, num_workers, remainder)
    groups = world_size * num_workers
    notes: list[str] = []

    utts, copies, stats = [], [], []
    for c, (name, d, w) in enumerate(zip(names, durations, weights)):
        utt, copy = _apply_weight(len(d), w, seed, c)
        if not len(utt):
            raise UsageError(f"corpus {name!r} keeps no utterance at weight {w:g} ({len(d)} utterances)")
        kept = _distinct(utt, len(d))
        stats.append({"name": name, "weight": w, "utterances": len(d), "seconds": round(float(d.sum()), 3),
                      "kept": kept, "repeated": int(len(utt) - kept), "dropped": len(d) - kept})
        utts.append(utt)
        copies.append(copy)
    weighted = np.array([len(u) for u in utts])
    total_utts = int(weighted.sum())
    longest = max((float(d[u].max()), name) for d, u, name in zip(durations, utts, names))
    total_seconds = float(sum(d[u].sum() for d, u in zip(durations, utts)))
    count = _choose_num_shards(total_seconds, total_utts, longest, groups, shard_duration, num_shards, notes)

    per_shard = -(-total_utts // count) if remainder == "pad" else total_utts // count
    targets = apportion(weighted, count * per_shard)
    for c, target in enumerate(targets):
        delta = int(target - weighted[c])
        if delta > 0:
            utts[c], copies[c] = _pad(utts[c], copies[c], len(durations[c]), delta, seed, c)
        elif delta < 0:
            utts[c], copies[c] = _drop(utts[c], copies[c], -delta, seed, c)
        stats[c].update({"padded": max(delta, 0), "remainder_dropped": max(-delta, 0),
                         "copies_out": int(target), "unique_out": _distinct(utts[c], len(durations[c]))})

    corpus_of = np.concatenate([np.full(len(u), c, np.int64) for c, u in enumerate(utts)])
    utt_of = np.concatenate(utts)
    copy_of = np.concatenate(copies)
    seconds = np.concatenate([durations[c][u] for c, u in enumerate(utts)])

    # each shard gets floor(share) of every corpus; the leftover copies go round-robin, so every
    # shard gets the same number of them and no shard two of one corpus
    base = targets // count
    counts = np.tile(base, (count, 1))
    start = 0
    for c, left in enumerate(targets % count):
        counts[(start + np.arange(left)) % count, c] += 1
        start += int(left)
    assert (counts.sum(axis=1) == per_shard).all()

    means = [float(seconds[corpus_of == c].mean()) if (corpus_of == c).any() else 0.0 for c in range(len(names))]
    shard_of = _deal(corpus_of, seconds, counts, np.argsort(-np.array(means), kind="stable"), seed)
    rows = np.argsort(shard_of, kind="stable").reshape(count, per_shard)
    mean_shard = float(seconds.sum()) / count
    tolerance = max(TOLERANCE_FRACTION * mean_shard, float(np.median(seconds)))
    # aim inside the tolerance, tight enough that a consumer's sum of count / groups shards (whose
    # errors partly cancel, ~sqrt) stays within REFINE_FRACTION of the others
    goal = min(tolerance / 2, REFINE_FRACTION * mean_shard * math.sqrt(count / groups))
    _refine(rows, seconds, corpus_of, goal=goal)
    rows = np.random.default_rng([seed, _ORDER]).permuted(rows, axis=1)
    flat = rows.reshape(-1)
    return BalancePlan(names=names, world_size=world_size, num_workers=num_workers, num_shards=count,
                       utts_per_shard=per_shard, seed=seed, remainder=remainder, corpus=corpus_of[flat],
                       utt=utt_of[flat], copy=copy_of[flat], seconds=seconds[flat], corpora=stats,
                       tolerance=tolerance, notes=notes)


# ---------------------------------------------------------------------------------------------
# I/O: sources -> index columns -> plan -> shards


@dataclass(frozen=True)
class CorpusSource:
    name: str
    sources: tuple[str, ...]
    weight: float = 1.0


def parse_corpus_spec(text: str) -> CorpusSource:
    """``NAME=SOURCE[,SOURCE...][:WEIGHT]`` -> CorpusSource. Raises UsageError."""
    name, eq, rest = text.partition("=")
    name = name.strip()
    if not eq or not name or not rest:
        raise UsageError(f"--corpus {text!r}: expected NAME=SOURCES[:WEIGHT]")
    weight = 1.0
    head, colon, tail = rest.rpartition(":")
    if colon and "/" not in tail and "," not in tail:
        try:
            weight = float(tail)
        except ValueError:
            raise UsageError(f"--corpus {text!r}: weight {tail!r} is not a number") from None
        rest = head
    if not math.isfinite(weight) or weight <= 0:
        raise UsageError(f"corpus {name!r}: weight must be a number > 0 (got {tail})")
    sources = tuple(s for s in rest.split(",") if s)
    if not sources:
        raise UsageError(f"--corpus {name!r}: no sources given")
    return CorpusSource(name, sources, weight)


def check_corpora(corpora: Sequence[CorpusSource]) -> None:
    if not corpora:
        raise UsageError("no --corpus given")
    seen = set()
    for c in corpora:
        if c.name in seen:
            raise UsageError(f"corpus {c.name!r} is given twice")
        seen.add(c.name)
        if not (math.isfinite(c.weight) and c.weight > 0):
            raise UsageError(f"corpus {c.name!r}: weight must be a number > 0 (got {c.weight})")


@dataclass
class CorpusColumns:
    """What planning and writing need of a corpus' utterances, as arrays (no per-utterance dicts)."""

    durations: np.ndarray
    keys: list[str]
    shard: np.ndarray  # index into MixColumns.shards
    line_file: np.ndarray  # index into MixColumns.index_files
    line_offset: np.ndarray  # byte offset of the utterance's line in that index file


@dataclass
class MixColumns:
    names: list[str]
    corpora: list[CorpusColumns]
    shards: list[str]
    index_files: list[str]


def _source_stamp(paths: Sequence[str]) -> list[list]:
    stamps = []
    for p in paths:
        try:
            st = os.stat(p)
            stamps.append([p, st.st_size, st.st_mtime_ns])
        except OSError:
            stamps.append([p, None, None])
    return stamps


def resolve_index_files(corpora: Sequence[CorpusSource], work_dir: str, *, jobs: int = 1,
                        on_index: Callable[[str, int, str | None], None] | None = None,
                        on_corpus: Callable[[str, int], None] | None = None, executor: str = "local",
                        ray_address: str | None = None) -> list[list[str]]:
    """Index files per corpus: given indexes as they are, shard sources indexed into ``work_dir``.

    An index built by an earlier run over the same shards (same sizes and mtimes) is reused.
    """
    from .index import build_index, is_index_file
    from .inputs import expand_shards
    from .manifest import atomic_write_json, load_json

    owner: dict[str, str] = {}
    result = []
    for i, corpus in enumerate(corpora):
        indexes = [os.path.abspath(s) for s in corpus.sources if is_index_file(s)]
        for path in indexes:
            if not os.path.isfile(path):
                raise UsageError(f"corpus {corpus.name!r}: no such index file", shard=path)
        check_index_slices(corpus.name, indexes)
        shard_args = [s for s in corpus.sources if not is_index_file(s)]
        shards = expand_shards(shard_args) if shard_args else []
        for s in shards + indexes:
            if s in owner:
                raise UsageError(f"{s} is given to corpus {owner[s]!r} and to corpus {corpus.name!r}")
            owner[s] = corpus.name
        if shards:
            os.makedirs(work_dir, exist_ok=True)
            built = os.path.join(work_dir, f"index-{i}.jsonl")
            stamp_path = built + ".sources.json"
            stamp = {"corpus": corpus.name, "sources": _source_stamp(shards)}
            if not (os.path.exists(built) and load_json(stamp_path) == stamp):
                if on_corpus:
                    on_corpus(corpus.name, len(shards))
                report = build_index(shards, built, corpus.name, jobs=jobs, on_shard=on_index, executor=executor,
                                     ray_address=ray_address)
                if report.failures:
                    first = report.failures[0]["error"]
                    raise ShardkitError(f"corpus {corpus.name!r}: {len(report.failures)} of {report.shards} shards "
                                        f"cannot be indexed; first: {first}")
                atomic_write_json(stamp_path, stamp)
            indexes.append(built)
        result.append(indexes)
    return result


def check_index_slices(corpus: str, index_files: Sequence[str]) -> None:
    """Slice files of an index (``x.slice-I-of-N.jsonl``, from ``index --split``) come all N or none."""
    import re

    groups: dict[tuple[str, int], set[int]] = {}
    for path in index_files:
        match = re.fullmatch(r"(.*)\.slice-(\d+)-of-(\d+)\.jsonl", path)
        if match:
            groups.setdefault((match.group(1), int(match.group(3))), set()).add(int(match.group(2)))
    for (stem, count), have in sorted(groups.items()):
        missing = sorted(set(range(1, count + 1)) - have)
        if missing:
            raise UsageError(f"corpus {corpus!r}: index {stem}.jsonl is given in slices without slice"
                             f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {count}")


def load_columns(names: Sequence[str], index_files: Sequence[Sequence[str]]) -> MixColumns:
    """Read each corpus' index files into arrays; one line parsed at a time (the hot loop of a dry run)."""
    from .index import loads, open_index, parse_index_line

    shards: list[str] = []
    shard_ids: dict[str, int] = {}
    shard_corpus: list[str] = []
    files: list[str] = []
    corpora = []
    for name, paths in zip(names, index_files):
        durations, keys, shard_col, file_col, offsets = [], [], [], [], []
        for path in paths:
            file_id = len(files)
            files.append(path)
            offset = 0
            with open_index(path) as f:
                for number, line in enumerate(f, 1):
                    try:
                        record = loads(line)
                        shard, key, duration = record["shard"], record["key"], float(record["duration"])
                        record["members"]
                    except (ValueError, KeyError, TypeError):
                        if line.strip():
                            parse_index_line(line, path=path, number=number)  # raises the precise error
                            raise ShardkitError(f"line {number} is not an index record", shard=path) from None
                        offset += len(line)
                        continue
                    sid = shard_ids.get(shard)
                    if sid is None:
                        sid = shard_ids[shard] = len(shards)
                        shards.append(shard)
                        shard_corpus.append(name)
                    elif shard_corpus[sid] != name:
                        raise UsageError(f"{shard} is in corpus {shard_corpus[sid]!r} and in corpus {name!r}")
                    durations.append(duration)
                    keys.append(key)
                    shard_col.append(sid)
                    file_col.append(file_id)
                    offsets.append(offset)
                    offset += len(line)
        corpora.append(CorpusColumns(np.array(durations, np.float64), keys, np.array(shard_col, np.int64),
                                     np.array(file_col, np.int64), np.array(offsets, np.int64)))
    return MixColumns(list(names), corpora, shards, files)


def check_unique_keys(mix: MixColumns) -> None:
    """Two utterances with one key would be one sample to WeNet's grouping: refuse the mix."""
    seen: set[str] = set()
    for c, corpus in enumerate(mix.corpora):
        for i, key in enumerate(corpus.keys):
            if key in seen:
                oc, oi = next((oc, corpus_o.keys.index(key)) for oc, corpus_o in enumerate(mix.corpora)
                              if key in corpus_o.keys)
                raise ShardkitError(
                    f"key {key!r} appears twice: in {mix.shards[mix.corpora[oc].shard[oi]]} (corpus "
                    f"{mix.names[oc]!r}) and in {mix.shards[corpus.shard[i]]} (corpus {mix.names[c]!r}); "
                    f"keys must be unique across the mix")
            seen.add(key)


def repeated_keys(plan: BalancePlan, mix: MixColumns) -> list[list[str]]:
    """``[original key, output key]`` for every repeat, in output order; refuses a clash with a real key."""
    pairs = []
    for i in np.flatnonzero(plan.copy > 0):
        key = mix.corpora[plan.corpus[i]].keys[plan.utt[i]]
        pairs.append([key, repeat_key(key, int(plan.copy[i]))])
    if pairs:
        originals = {k for corpus in mix.corpora for k in corpus.keys}
        clash = next((p for p in pairs if p[1] in originals), None)
        if clash:
            raise ShardkitError(f"repeat of {clash[0]!r} would be named {clash[1]!r}, which is already a key "
                                f"in the mix")
    return pairs


def output_paths(out_dir: str, count: int, codec: str) -> list[str]:
    from .codecs import CODECS

    return [os.path.join(out_dir, f"shards_{s:09d}.tar{CODECS[codec].suffix}") for s in range(count)]


def shard_table(plan: BalancePlan, mix: MixColumns, paths: Sequence[str] | None) -> list[dict]:
    secs = plan.shard_seconds
    counts = plan.shard_corpus_counts
    return [{"shard": s, "path": paths[s] if paths else None, "utterances": plan.utts_per_shard,
             "seconds": round(float(secs[s]), 3),
             "corpora": {name: int(counts[s, c]) for c, name in enumerate(plan.names)}}
            for s in range(plan.num_shards)]


# --- writing phase ---------------------------------------------------------------------------

MANIFEST = "balance.json"
WORK_DIR = ".balance"
JOURNAL = ".balance.journal.jsonl"
MAX_OPEN_SOURCES = 64


@dataclass(frozen=True)
class WriteSettings:
    codec: str = "zst"
    level: int | None = 3
    verify: bool = True


def _spool_task(args) -> tuple[str, str | None]:
    """Decompress one compressed source into a plain tar spool (atomic); (source, error)."""
    src, dst = args
    if os.path.exists(dst):
        return src, None
    from .codecs import iter_decompressed
    from .tario import open_shard

    from .lifecycle import AtomicFile

    try:
        with open_shard(src) as f, AtomicFile(dst) as out:
            for chunk in iter_decompressed(f, shard=src):
                out.write(chunk)
            out.commit()
        return src, None
    except ShardkitError as err:
        return src, str(err.located(shard=src))
    except OSError as err:
        return src, f"{src}: {err.strerror or err}"


def spool_path(spool_dir: str, src: str) -> str:
    try:
        st = os.stat(src)
        stamp = f"{src}\0{st.st_size}\0{st.st_mtime_ns}"
    except OSError:
        stamp = src
    return os.path.join(spool_dir, hashlib.sha1(stamp.encode("utf-8", "surrogateescape")).hexdigest() + ".tar")


def spool_dir_name(split: tuple[int, int] | None) -> str:
    """Each slice of a job array spools into its own folder: slices run at once and finish apart."""
    return "spool" if split is None else f"spool.slice-{split[0]}-of-{split[1]}"


def _is_compressed(path: str) -> bool:
    from .codecs import detect_codec
    from .tario import open_shard

    try:
        with open_shard(path) as f:
            return detect_codec(f.read(16)) != "none"
    except ShardkitError:  # gone or not a file: the shards that need it fail when they read it
        return False


class _SourceReader:
    """Positioned reads of members, through at most MAX_OPEN_SOURCES open files."""

    def __init__(self, read_paths: dict[str, str]):
        self._read_paths = read_paths
        self._fds: dict[str, int] = {}

    def member(self, shard: str, name: str, offset: int, size: int) -> bytes:
        from .tario import open_regular, parse_header

        path = self._read_paths.get(shard, shard)
        fd = self._fds.pop(shard, None)
        if fd is None:
            if len(self._fds) >= MAX_OPEN_SOURCES:
                os.close(self._fds.pop(next(iter(self._fds))))
            try:
                fd = open_regular(path)  # a FIFO or device fails at once, never blocks
            except ShardkitError as err:
                raise ShardkitError(f"cannot open source ({err.reason})", shard=shard) from None
        self._fds[shard] = fd  # most recently used last
        block = os.pread(fd, 512 + size, offset - 512) if offset >= 512 else b""
        header, data = block[:512], block[512:]
        # the header just before the data must name this member with this size: otherwise the
        # shard changed since it was indexed and the offsets point elsewhere
        try:  # the one tar parser's reading of that header (tario.parse_header)
            typeflag, stored, stored_size = parse_header(header) if len(header) == 512 else (b"", b"", -1)
        except ShardkitError:
            typeflag, stored, stored_size = b"", b"", -1
        # a long name's member header holds its first 100 bytes: a prefix check
        ok = (len(data) == size and typeflag in (b"0", b"\x00", b"7") and stored
              and name.encode("utf-8", "surrogateescape").startswith(stored) and stored_size == size)
        if not ok:
            raise ShardkitError("member is not where the index says (the shard changed since it was indexed; "
                                "index it again)", shard=shard, member=name)
        return data

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


_WORKER: dict = {}


def _init_worker(index_files: list[str], read_paths: dict[str, str]) -> None:
    _WORKER.clear()
    _WORKER.update(index_files=index_files, read_paths=read_paths)


def _read_index_line(fds: dict, path: str, offset: int) -> dict:
    from .index import parse_index_line

    f = fds.get(path)
    if f is None:
        f = fds[path] = open(path, "rb")
    f.seek(offset)
    return parse_index_line(f.readline(), path=path, number=0)


def _shard_spec(records: list[tuple[dict, int]], settings: WriteSettings) -> str:
    """Digest of what an output shard is made of: sources (with size and mtime), members, copies, codec."""
    h = hashlib.sha256(repr((settings.codec, settings.level)).encode())
    stamps: dict[str, list] = {}
    for record, copy in records:
        shard = record["shard"]
        if shard not in stamps:
            stamps[shard] = _source_stamp([shard])[0]
        h.update(repr((stamps[shard], record["key"], record["members"], copy)).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def write_output_shard(dst: str, refs: list[tuple[int, int, int]], settings: WriteSettings,
                       previous: dict | None) -> dict:
    """Write one output shard from ``refs`` = (index file id, line offset, copy), in order.

    Returns its manifest entry; data problems become ``status: failed`` with the error. When
    ``previous`` (a finished run's entry) has the same spec and the file still has its digest,
    nothing is written (``status: skipped``).
    """
    from .codecs import open_writer
    from .convert import HashingFile, combine_digests, member_digest, output_unchanged
    from .lifecycle import AtomicFile, os_reason, verify_members
    from .tario import TarWriter, split_key

    started = time.perf_counter()
    entry = {"path": dst, "spec": None, "status": "failed", "error": None}
    index_files, read_paths = _WORKER["index_files"], _WORKER["read_paths"]
    reader = _SourceReader(read_paths)
    index_fds: dict = {}
    try:
        records = [(_read_index_line(index_fds, index_files[file_id], offset), copy) for file_id, offset, copy in refs]
        entry["spec"] = spec = _shard_spec(records, settings)
        if previous and previous.get("spec") == spec and previous.get("status") == "ok" and \
                output_unchanged(dst, previous["size"], previous["sha256"]):
            return {**previous, "status": "skipped"}
        written = []
        with AtomicFile(dst) as target:
            hashing = HashingFile(target.file)
            out = open_writer(hashing, settings.codec, settings.level)
            tar = TarWriter(out)
            for record, copy in records:
                key = record["key"]
                new_key = repeat_key(key, copy)
                for name, member_offset, size in record["members"]:
                    data = reader.member(record["shard"], name, member_offset, size)
                    out_name = new_key + name[len(key):] if copy else name
                    if split_key(out_name)[0] != new_key:
                        raise ShardkitError(f"member {name!r} does not belong to key {key!r}", shard=record["shard"])
                    tar.add(out_name, data)
                    written.append((out_name, member_digest(out_name, data)))
            entry["tar_bytes"] = tar.close()
            out.close()
            # fsync, read back (unless --no-verify), rename, fsync the folder
            target.commit(verify_members(written, shard=dst) if settings.verify else None)
        entry.update(status="ok", size=hashing.size, sha256=hashing.sha256.hexdigest(), members=len(written),
                     members_digest=combine_digests(written))
    except ShardkitError as err:
        entry["error"] = str(err)
    except OSError as err:
        entry["error"] = f"{dst}: {os_reason(err)}" + (f" ({err.filename})" if err.filename else "")
    finally:
        reader.close()
        for f in index_fds.values():
            f.close()
    entry["seconds_taken"] = round(time.perf_counter() - started, 4)
    return entry


def _write_task(args) -> dict:
    return write_output_shard(*args)


@dataclass
class BalanceReport:
    out_dir: str | None
    plan: BalancePlan
    figures: dict
    shards: list[dict]
    repeats: list[list[str]]
    dry_run: bool
    sources: dict
    failures: list[dict] = field(default_factory=list)
    elapsed: float = 0.0
    slice: dict | None = None  # with --split: the slice of the output shards this run wrote

    def _named(self, name: str) -> str | None:
        if self.dry_run:
            return None
        path = os.path.join(self.out_dir, name)
        return slice_path(path, self.slice["index"], self.slice["count"]) if self.slice else path

    def summary(self) -> dict:
        counts = {s: sum(1 for e in self.shards if e.get("status_this_run") == s) for s in ("ok", "skipped", "failed")}
        return {"command": "balance", "dry_run": self.dry_run, "out_dir": self.out_dir,
                "data_list": self._named("data.list"), "manifest": self._named(MANIFEST),
                **({"slice": self.slice} if self.slice else {}),
                **self.plan.summary(), "written": counts,
                "this_run": {"done": counts["ok"], "skipped": counts["skipped"], "failed": counts["failed"]},
                "failures": self.failures,
                "plan": self.figures, "repeated_copies": len(self.repeats),
                "elapsed_seconds": round(self.elapsed, 3)}

    @property
    def exit_code(self) -> int:
        return 1 if self.failures or not self.plan.balanced else 0


def run_balance(corpora: Sequence[CorpusSource], out_dir: str, *, world_size: int, num_workers: int,
                shard_duration: float | None = None, num_shards: int | None = None, codec: str = "zst",
                level: int | None = 3, remainder: str = "pad", seed: int = 0, dry_run: bool = False,
                jobs: int = 1, epochs: int = 3, verify: bool = True, overwrite: bool = False,
                on_event: Callable[..., None] | None = None, executor: str = "local", ray_address: str | None = None,
                split: tuple[int, int] | None = None) -> BalanceReport:
    """Plan (and unless ``dry_run``, write) balanced shards; see the module docstring.

    ``executor``/``ray_address``: where indexing, spooling and shard writing run (shardkit.executor;
    Ray workers must see OUT_DIR and the sources at the same paths). ``split=(I, N)``: every slice
    computes the same plan, then writes only slice I of N of the output shards, reported as
    balance.slice-I-of-N.json and data.slice-I-of-N.list for ``shardkit merge-reports``.
    """
    import tempfile

    from . import __version__
    from .lifecycle import (Journal, atomic_write_json, atomic_write_lines, claim_output, claimed_output_dir, load_json,
                            remove_leftovers, this_run)
    from .partition import plan_figures

    started = time.perf_counter()
    event = on_event or (lambda *a, **k: None)
    check_corpora(corpora)
    if world_size < 1 or num_workers < 1:
        raise UsageError(f"--world-size and --num-workers must be >= 1 (got {world_size} and {num_workers})")
    if remainder not in REMAINDER_POLICIES:
        raise UsageError(f"--remainder must be one of {', '.join(REMAINDER_POLICIES)}")
    if split is not None and dry_run:
        raise UsageError("--split writes a slice of the shards and --dry-run writes none; plan without --split")
    names = [c.name for c in corpora]
    from contextlib import ExitStack

    with tempfile.TemporaryDirectory(prefix="shardkit-balance-") as scratch, ExitStack() as stack:
        if dry_run:
            work_dir = scratch
        else:
            out_dir, _ = stack.enter_context(claimed_output_dir(
                out_dir, [s for c in corpora for s in c.sources if os.path.isfile(s)], "balance", split, urls=False))
            work_dir = os.path.join(out_dir, WORK_DIR)
        index_files = resolve_index_files(corpora, os.path.join(work_dir, "index"), jobs=jobs,
                                          on_index=lambda *a: event("indexed", *a),
                                          on_corpus=lambda *a: event("indexing", *a), executor=executor,
                                          ray_address=ray_address)
        event("loading", sum(len(f) for f in index_files))
        mix = load_columns(names, index_files)
        for name, corpus in zip(names, mix.corpora):
            if not len(corpus.durations):
                raise UsageError(f"corpus {name!r} is empty (no utterances in its sources)")
        check_unique_keys(mix)
        event("planning")
        plan = plan_balance([c.durations for c in mix.corpora], [c.weight for c in corpora], world_size=world_size,
                            num_workers=num_workers, shard_duration=shard_duration, num_shards=num_shards,
                            remainder=remainder, seed=seed, names=names)
        repeats = repeated_keys(plan, mix)
        figures = plan_figures(np.full(plan.num_shards, plan.utts_per_shard), plan.shard_seconds,
                               world_size=world_size, num_workers=num_workers, epochs=epochs, seed=seed)
        sources = {name: {"sources": list(c.sources), "index_files": files}
                   for name, c, files in zip(names, corpora, index_files)}
        if dry_run:
            return BalanceReport(None, plan, figures, shard_table(plan, mix, None), repeats, True, sources,
                                 elapsed=time.perf_counter() - started)
        if not plan.balanced:
            raise ShardkitError(f"cannot balance within tolerance: the worst shard is {plan.max_deviation:.3f} s off "
                                f"the mean (tolerance {plan.tolerance:.3f} s); ask for longer or fewer shards")

        inputs = set(mix.shards) | set(mix.index_files) | {os.path.abspath(s) for c in corpora for s in c.sources
                                                             if os.path.isfile(s)}
        paths = output_paths(out_dir, plan.num_shards, codec)
        claim_output(out_dir, sorted(inputs), paths, what="OUT_DIR")
        settings = WriteSettings(codec=codec, level=level, verify=verify)
        chosen = range(plan.num_shards)
        slice_info = None
        if split is not None:  # every slice planned the same shards; each writes its own block of them
            slice_info = slice_record(paths, *split)
            slice_info["inputs_sha256"] = inputs_digest(paths + [plan_digest(plan)])
            chosen = range(slice_info["start"], slice_info["stop"])
        # where each referenced source is read: in place if plain, else its spool
        positions = np.concatenate([np.arange(plan.shard_slice(s).start, plan.shard_slice(s).stop) for s in chosen]) \
            if len(chosen) else np.zeros(0, np.int64)
        used = sorted({int(mix.corpora[c].shard[u]) for c, u in zip(plan.corpus[positions], plan.utt[positions])})
        spool_dir = os.path.join(work_dir, spool_dir_name(split))
        read_paths = {}
        spool_tasks = []
        for sid in used:
            src = mix.shards[sid]
            if _is_compressed(src):
                read_paths[src] = spool_path(spool_dir, src)
                spool_tasks.append((src, read_paths[src]))
        if spool_tasks:
            os.makedirs(spool_dir, exist_ok=True)
            event("spooling", len(spool_tasks))
            spool_errors = []
            for _, (src, error) in run_tasks(_spool_task, spool_tasks, jobs=jobs, executor=executor,
                                             ray_address=ray_address):
                if error:
                    spool_errors.append(error)
                event("spooled", src, error)
            # an unreadable source fails the output shards that need it (they cannot open its spool), not the run

        manifest_path = os.path.join(out_dir, MANIFEST)
        data_list = os.path.join(out_dir, "data.list")
        journal_path = os.path.join(out_dir, JOURNAL)
        reports = [manifest_path]
        if split is not None:
            manifest_path, data_list, journal_path = (slice_path(p, *split) for p in (manifest_path, data_list,
                                                                                       journal_path))
            reports.insert(0, manifest_path)
        journal = Journal(journal_path)
        previous = {}
        if not overwrite:
            for entry in [e for path in reports for e in (load_json(path) or {}).get("shards", [])] + journal.load():
                if entry.get("path"):
                    previous[entry["path"]] = entry
        remove_leftovers(paths[s] for s in chosen)  # temporary files of a killed run (its lock died with it)
        tasks = []
        for s in chosen:
            dst = paths[s]
            part = plan.shard_slice(s)
            refs = []
            for c, u, k in zip(plan.corpus[part], plan.utt[part], plan.copy[part]):
                col = mix.corpora[c]
                refs.append((int(col.line_file[u]), int(col.line_offset[u]), int(k)))
            tasks.append((dst, refs, settings, previous.get(dst)))
        event("writing", len(tasks))
        entries: dict[str, dict] = {}

        def written(entry):
            entries[entry["path"]] = entry
            if entry["status"] == "ok":
                journal.append(entry)
            event("written", entry)

        try:
            for _, entry in run_tasks(_write_task, tasks, jobs=jobs, executor=executor, ray_address=ray_address,
                                      initializer=_init_worker, initargs=(mix.index_files, read_paths)):
                written(entry)
        finally:
            journal.close(remove=False)
        table = shard_table(plan, mix, paths)[chosen.start:chosen.stop]
        for row in table:
            entry = entries[row["path"]]
            row.update({k: entry.get(k) for k in ("status", "size", "sha256", "members", "members_digest", "spec",
                                                   "error")})
            if row["status"] == "skipped":
                row["status"] = "ok"
        failures = [{"shard": e["path"], "error": e["error"]} for e in entries.values() if e["status"] == "failed"]
        report = BalanceReport(out_dir, plan, figures, table, repeats, False, sources, failures,
                               elapsed=time.perf_counter() - started, slice=slice_info)
        for row in report.shards:
            row["status_this_run"] = entries[row["path"]]["status"]
            row["this_run"] = this_run(row["status_this_run"])
        atomic_write_lines(data_list, [r["path"] for r in table if r["status"] == "ok"])
        removed = not failures and split is None  # then OUT_DIR/.balance goes, with the indexes built there
        recorded_sources = {name: recorded_index_files(entry, work_dir, removed) for name, entry in sources.items()}
        atomic_write_json(manifest_path, {
            **({"slice": slice_info} if slice_info else {}),
            "tool": "shardkit", "version": __version__, "command": "balance",
            "settings": {"world_size": world_size, "num_workers": num_workers, "shard_duration": shard_duration,
                         "num_shards": num_shards, "codec": codec, "level": level, "remainder": remainder,
                         "seed": seed},
            "summary": plan.summary(), "sources": recorded_sources, "shards": [
                {k: v for k, v in row.items() if k != "status_this_run"} for row in table],
            "plan": figures, "repeat_key_format": "{key}" + REPEAT_SUFFIX, "repeats": repeats})
        if not failures:
            journal.close(remove=True)
            import shutil

            # a slice leaves the shared indexes to the other slices (merge-reports removes them)
            shutil.rmtree(work_dir if split is None else spool_dir, ignore_errors=True)
        return report


def recorded_index_files(entry: dict, work_dir: str, removed: bool) -> dict:
    """A corpus's ``sources`` record for balance.json (pure): index files built in ``work_dir`` are
    named only while they exist; once the run removes the folder, ``built_index`` says so instead."""
    inside = [p for p in entry["index_files"] if os.path.dirname(os.path.dirname(p)) == work_dir]
    if not (removed and inside):
        return entry
    return {**entry, "index_files": [p for p in entry["index_files"] if p not in inside],
            "built_index": f"indexed in {os.path.join(work_dir, 'index')} during the run and removed with it"}


def plan_digest(plan: BalancePlan) -> str:
    """sha256 of what a plan assigns where: slices of different plans must not be merged."""
    h = hashlib.sha256()
    for column in (plan.corpus, plan.utt, plan.copy):
        h.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
    return h.hexdigest()
