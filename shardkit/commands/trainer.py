"""``--wenet-conf`` for plan and balance: what WeNet's trainer would drop, and how it would batch.

The pieces: :mod:`shardkit.io.wenet_conf` reads the conf and the tokenizer, the index gives per
utterance its audio frames, sample rate, seconds and transcript length (``text_chars``) or the
place of its ``.txt`` member, and :mod:`shardkit.planning.trainer` applies WeNet's filter and
simulates its batching on arrays.

Token counts: with no tokenizer file (the conf names none and ``--tokenizer`` is not given),
one token per transcript character is assumed and the index's ``text_chars`` is used as is: no
shard is read. With a symbol table or a BPE model the transcripts are needed, and the index does
not hold them: they are read from the shards' ``.txt`` members at the offsets the index records
(a seek per utterance on a plain shard, one streaming pass on a compressed one), only then.
Keeping transcripts out of the index keeps it small and tokenizer-free.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from shardkit.errors import ShardkitError, UsageError
from shardkit.planning.trainer import REASONS, Tokenizer, TrainerConf


@dataclass(frozen=True)
class TrainerSpec:
    """What ``--wenet-conf`` (and ``--tokenizer``) hand to plan and balance."""

    conf: TrainerConf
    conf_path: str
    tokenizer: Tokenizer | None
    tokenizer_note: str

    @property
    def warnings(self) -> list[str]:
        return list(self.conf.warnings)

    def header(self) -> dict:
        return {"conf": self.conf_path, "tokens": self.tokenizer_note}


def load_spec(conf_path: str, tokenizer: str | None = None) -> TrainerSpec:
    """Read the conf and its tokenizer; every problem is a UsageError naming the file."""
    from shardkit.io.wenet_conf import load_tokenizer, load_trainer_conf

    conf = load_trainer_conf(conf_path)
    tok, note = load_tokenizer(conf.tokenizer, conf_path, tokenizer)
    return TrainerSpec(conf, conf_path, tok, note)


@dataclass
class UttColumns:
    """Per utterance (index order): where it is, how long, and what its transcript needs."""

    shards: list[str]
    shard: np.ndarray
    keys: list[str]
    corpus_names: list[str]
    corpus: np.ndarray
    samples: np.ndarray
    rate: np.ndarray
    seconds: np.ndarray
    text_chars: np.ndarray
    txt: list[tuple[int, int]] | None = None


class _Columns:
    """Collects index records into columns; ``want_txt`` keeps the place of each ``.txt`` member."""

    def __init__(self, want_txt: bool, shard_ids: dict[str, int] | None = None):
        self.want_txt = want_txt
        self.shard_ids: dict[str, int] = dict(shard_ids or {})
        self.shards = list(self.shard_ids)
        self.corpus_ids: dict[str, int] = {}
        self.shard, self.keys, self.corpus, self.samples, self.rate, self.seconds, self.chars = ([] for _ in range(7))
        self.txt: list[tuple[int, int]] = []

    def add(self, record: dict, path: str, number: int | None = None) -> None:
        """One record (``path``/``number``: where it came from, named only in an error)."""
        shard = record["shard"]
        sid = self.shard_ids.get(shard)
        if sid is None:
            sid = self.shard_ids[shard] = len(self.shards)
            self.shards.append(shard)
        corpus = record.get("corpus") or _folder(shard)
        cid = self.corpus_ids.get(corpus)
        if cid is None:
            cid = self.corpus_ids[corpus] = len(self.corpus_ids)
        try:
            self.samples.append(int(record["frames"]))
            self.rate.append(int(record["sample_rate"]))
            self.chars.append(int(record["text_chars"]))
        except (KeyError, TypeError, ValueError):
            raise ShardkitError(f"index record of {record.get('key')!r} lacks frames, sample_rate or text_chars "
                                "(an index from an older shardkit? rebuild it with `shardkit index`)",
                                shard=_where(path, number)) from None
        self.shard.append(sid)
        self.keys.append(record["key"])
        self.corpus.append(cid)
        self.seconds.append(float(record["duration"]))
        if self.want_txt:
            self.txt.append(_txt_range(record, _where(path, number)))

    def columns(self) -> UttColumns:
        return UttColumns(self.shards, np.asarray(self.shard, np.int64), self.keys, list(self.corpus_ids),
                          np.asarray(self.corpus, np.int64), np.asarray(self.samples, np.int64),
                          np.asarray(self.rate, np.int64), np.asarray(self.seconds, np.float64),
                          np.asarray(self.chars, np.int64), self.txt if self.want_txt else None)


def _where(path: str, number: int | None) -> str:
    return path if number is None else f"{path}: line {number}"


def _folder(shard: str) -> str:
    return os.path.basename(os.path.dirname(os.path.abspath(shard))) or "corpus"


def _txt_range(record: dict, where: str) -> tuple[int, int]:
    name = record["key"] + ".txt"
    for member in record.get("members", ()):
        if member[0] == name:
            return int(member[1]), int(member[2])
    raise ShardkitError(f"index record of {record['key']!r} names no .txt member", shard=where)


def index_columns(index_files: Sequence[str], *, want_txt: bool, keep: set[str] | None = None) -> UttColumns:
    """Columns of every record of the index files (in file order), or only of shards in ``keep``."""
    from shardkit.io.indexfile import is_parquet, iter_parquet_records, loads, open_index, parse_index_line

    cols = _Columns(want_txt)
    add = cols.add
    for path in index_files:
        if is_parquet(path):  # balance builds Parquet indexes when pyarrow is there; records as JSON lines give
            for number, record in enumerate(iter_parquet_records(path), 1):
                if keep is None or record["shard"] in keep:
                    add(record, path, number)
            continue
        with open_index(path) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = loads(line)
                    shard = record["shard"]
                except (ValueError, KeyError, TypeError):
                    parse_index_line(line, path=path, number=number)  # raises the precise error
                    raise ShardkitError(f"line {number} is not an index record", shard=path) from None
                if keep is None or shard in keep:
                    add(record, path, number)
    return cols.columns()


def token_counts(cols: UttColumns, spec: TrainerSpec, on_shard: Callable[[str], None] | None = None) -> np.ndarray:
    """Label length per utterance: the tokenizer's over transcripts read from the shards, or ``text_chars``."""
    if spec.tokenizer is None:
        return cols.text_chars
    from shardkit.io.wenet_conf import transcripts_by_shard
    from shardkit.planning.trainer import count_tokens

    texts = transcripts_by_shard(cols.shards, cols.shard, cols.txt or [], on_shard=on_shard)
    return np.fromiter((count_tokens(t, spec.tokenizer) for t in texts), np.int64, len(texts))


@dataclass
class FilterResult:
    """The filter's verdict on a set of utterances, and the report of what it drops."""

    keep: np.ndarray
    summary: dict
    dropped_keys: list[str] = field(default_factory=list)


def apply_filter(cols: UttColumns, spec: TrainerSpec, *, corpus_names: Sequence[str] | None = None,
                 on_shard: Callable[[str], None] | None = None) -> FilterResult:
    """WeNet's ``filter_conf`` over the columns (see :func:`shardkit.planning.trainer.filter_reasons`)."""
    from shardkit.planning.trainer import filter_reasons, filter_summary

    tokens = token_counts(cols, spec, on_shard)
    reasons = filter_reasons(cols.samples, cols.rate, tokens, spec.conf.filter)
    names = list(corpus_names) if corpus_names is not None else cols.corpus_names
    summary = filter_summary(reasons, cols.corpus, names, cols.seconds, cols.keys)
    summary["filter_conf"] = dataclasses.asdict(spec.conf.filter)
    dropped = np.flatnonzero(reasons != 0)
    return FilterResult(reasons == 0, summary, [cols.keys[i] for i in dropped])


def batches_of_lines(cols: UttColumns, keep: np.ndarray, line_shards: Sequence[int], spec: TrainerSpec, *,
                     world_size: int, num_workers: int, seed: int, epochs: int) -> dict:
    """Simulated batches of a list whose line i is the shard ``cols.shards[line_shards[i]]`` (its kept
    utterances, in index order)."""
    from shardkit.planning.trainer import plan_batches

    kept = np.flatnonzero(keep)
    by_shard = kept[np.argsort(cols.shard[kept], kind="stable")]
    counts = np.bincount(cols.shard[kept], minlength=len(cols.shards))
    starts = np.concatenate([[0], np.cumsum(counts)])
    line_shards = np.asarray(line_shards, np.int64)
    lengths = counts[line_shards]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ends_before = offsets[:-1]
    utts = by_shard[np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(starts[line_shards] - ends_before, lengths)]
    return plan_batches(offsets, cols.samples[utts], cols.rate[utts], cols.seconds[utts], world_size=world_size,
                        num_workers=num_workers, conf=spec.conf, seed=seed, epochs=epochs)


@dataclass
class ListView:
    """``plan --wenet-conf``: the list's figures after the filter, and the trainer's report."""

    utterances: np.ndarray
    seconds: np.ndarray
    report: dict
    dropped_keys: list[str]


def plan_list(paths: Sequence[str], spec: TrainerSpec, *, index_files: Sequence[str], jobs: int,
              world_size: int, num_workers: int, epochs: int, seed: int,
              on_shard: Callable[[str, int, str | None], None] | None = None,
              on_transcripts: Callable[[str], None] | None = None) -> tuple[ListView | None, list[dict]]:
    """``(view, failures)`` of a shard list (from indexes when given, else by reading the shards, as
    ``shard_sizes``); the view is None when a shard failed."""
    cols, failures = _list_columns(paths, index_files=index_files, jobs=jobs, want_txt=spec.tokenizer is not None,
                                   on_shard=on_shard)
    if failures:
        return None, failures
    result = apply_filter(cols, spec, on_shard=on_transcripts)
    ids = {s: i for i, s in enumerate(cols.shards)}
    line_shards = [ids[p] for p in paths]
    keep = result.keep
    per_shard_utts = np.bincount(cols.shard[keep], minlength=len(cols.shards))
    per_shard_secs = np.bincount(cols.shard[keep], weights=cols.seconds[keep], minlength=len(cols.shards))
    batches = batches_of_lines(cols, keep, line_shards, spec, world_size=world_size, num_workers=num_workers,
                               seed=seed, epochs=epochs)
    report = {**spec.header(), "filter": result.summary, "batches": batches}
    view = ListView(per_shard_utts[line_shards], per_shard_secs[line_shards], report, result.dropped_keys)
    return view, []


def _list_columns(paths: Sequence[str], *, index_files: Sequence[str], jobs: int, want_txt: bool,
                  on_shard) -> tuple[UttColumns, list[dict]]:
    """The columns of the listed shards: from the index files (every listed shard must be in one, as
    ``shard_sizes`` requires), else by indexing the shards now."""
    from shardkit.commands.index import iter_indexed_shards

    unique = list(dict.fromkeys(paths))
    if index_files:
        cols = index_columns(index_files, want_txt=want_txt, keep=set(unique))
        missing = [s for s in unique if s not in set(cols.shards)]
        if missing:
            raise UsageError(f"{len(missing)} listed shards are in no index given with --index (first: {missing[0]})")
        return cols, []
    builder = _Columns(want_txt, {s: i for i, s in enumerate(unique)})
    failures = []
    for shard, records, error in iter_indexed_shards(unique, jobs=jobs):
        if error is not None:
            failures.append({"shard": shard, "error": error})
        else:
            for record in records:
                builder.add(record, shard)
        if on_shard:
            on_shard(shard, len(records or ()), error)
    return builder.columns(), failures


# ---------------------------------------------------------------------------------------------
# balance


@dataclass
class MixFilter:
    """What ``balance --wenet-conf`` keeps of each corpus, for the plan of its output shards."""

    spec: TrainerSpec
    result: FilterResult
    samples: list[np.ndarray]  # per corpus, of its kept utterances (in the filtered mix's order)
    rates: list[np.ndarray]

    def report(self, plan, *, world_size: int, num_workers: int, seed: int, epochs: int) -> dict:
        """The ``BalanceReport`` fields of ``--wenet-conf``: ``wenet_conf``, ``warnings``, ``dropped_keys``."""
        batches = self.batches(plan, world_size=world_size, num_workers=num_workers, seed=seed, epochs=epochs)
        return {"wenet_conf": {**self.spec.header(), "filter": self.result.summary, "batches": batches},
                "warnings": self.spec.warnings, "dropped_keys": self.result.dropped_keys}

    def batches(self, plan, *, world_size: int, num_workers: int, seed: int, epochs: int) -> dict:
        """Simulated batches of the balanced list: output shard s holds plan positions s*U .. (s+1)*U-1."""
        from shardkit.planning.trainer import plan_batches

        samples = np.zeros(len(plan.utt), np.int64)
        rates = np.zeros(len(plan.utt), np.int64)
        for c in range(len(self.samples)):
            at = plan.corpus == c
            samples[at] = self.samples[c][plan.utt[at]]
            rates[at] = self.rates[c][plan.utt[at]]
        offsets = np.arange(plan.num_shards + 1, dtype=np.int64) * plan.utts_per_shard
        return plan_batches(offsets, samples, rates, np.asarray(plan.seconds, np.float64), world_size=world_size,
                            num_workers=num_workers, conf=self.spec.conf, seed=seed, epochs=epochs)


def filter_mix(mix, index_files: Sequence[Sequence[str]], spec: TrainerSpec,
               on_transcripts: Callable[[str], None] | None = None):
    """``(mix without the utterances WeNet's filter drops, MixFilter)``.

    ``mix`` is balance's ``MixColumns`` (read from ``index_files``, one list per corpus); the index
    is read again here for the fields the filter needs, and must give the same keys in the same order.
    """
    want_txt = spec.tokenizer is not None
    parts = []
    for name, corpus, files in zip(mix.names, mix.corpora, index_files):
        cols = index_columns(files, want_txt=want_txt)
        if not _same_keys(cols.keys, corpus):
            raise ShardkitError(f"corpus {name!r}: its index files changed while balance read them", shard=files[0])
        parts.append(cols)
    joined = _concat(parts)
    result = apply_filter(joined, spec, corpus_names=mix.names, on_shard=on_transcripts)
    corpora, samples, rates = [], [], []
    start = 0
    for c, corpus in enumerate(mix.corpora):
        n = len(corpus.keys)
        keep = result.keep[start:start + n]
        start += n
        idx = np.flatnonzero(keep)
        if not len(idx):
            raise UsageError(f"corpus {mix.names[c]!r}: the trainer's filter_conf drops every utterance "
                             f"({len(keep)}); nothing is left to balance")
        corpora.append(_kept(corpus, idx))
        samples.append(parts[c].samples[idx])
        rates.append(parts[c].rate[idx])
    return dataclasses.replace(mix, corpora=corpora), MixFilter(spec, result, samples, rates)


def _same_keys(keys: list[str], corpus) -> bool:
    """Whether the filter's reading of the index gave balance's keys, in balance's order (by key hash)."""
    from shardkit.io.indexfile import hash_strings

    if len(keys) != len(corpus.keys):
        return False
    if corpus.key_hash is not None:
        theirs = corpus.key_hash
    else:
        theirs = corpus.keys.hashes() if hasattr(corpus.keys, "hashes") else hash_strings(list(corpus.keys))
    return bool(np.array_equal(hash_strings(keys), theirs))


def _kept(corpus, idx: np.ndarray):
    """balance's corpus columns of the utterances ``idx`` only (every per-utterance column subset together)."""
    def pick(column):
        return None if column is None else column[idx]

    keys = corpus.keys.subset(idx) if hasattr(corpus.keys, "subset") else [corpus.keys[i] for i in idx]  # IndexKeys
    rows = None if corpus.segments is None else (idx if corpus.rows is None else corpus.rows[idx])
    return dataclasses.replace(corpus, durations=corpus.durations[idx], keys=keys, shard=corpus.shard[idx],
                               line_file=pick(corpus.line_file), line_offset=pick(corpus.line_offset),
                               key_hash=pick(corpus.key_hash), rows=rows)


def _concat(parts: list[UttColumns]) -> UttColumns:
    """One column set of several corpora's (corpus ids = position in ``parts``; shard ids re-based)."""
    shards: list[str] = []
    shard_cols, txt = [], []
    for p in parts:
        shard_cols.append(p.shard + len(shards))
        shards.extend(p.shards)
        txt.extend(p.txt or [])
    return UttColumns(shards, np.concatenate(shard_cols) if parts else np.zeros(0, np.int64),
                      [k for p in parts for k in p.keys], [str(i) for i in range(len(parts))],
                      np.concatenate([np.full(len(p.keys), i, np.int64) for i, p in enumerate(parts)]),
                      *(np.concatenate([getattr(p, a) for p in parts]) for a in ("samples", "rate", "seconds",
                                                                                   "text_chars")),
                      txt if parts and parts[0].txt is not None else None)


# ---------------------------------------------------------------------------------------------
# reporting


def write_dropped_keys(path: str, keys: Sequence[str]) -> None:
    """The dropped keys, one per line, written atomically."""
    from shardkit.io.files import atomic_write_lines, output_error

    try:
        atomic_write_lines(path, list(keys))
    except OSError as err:
        raise output_error(err, path) from None


def format_report(report: dict, warnings: Sequence[str]) -> str:
    """The human text of a ``wenet_conf`` report (stderr)."""
    lines = [f"WeNet conf {report['conf']}: tokens: {report['tokens']}"]
    lines.extend(f"warning: {w}" for w in warnings)
    f = report["filter"]
    lines.append(f"filter_conf drops {f['dropped_utterances']} of {f['utterances']} utterances, "
                 f"{f['dropped_seconds']:.1f} s ({100 * f['dropped_share']:.2f}% of the audio)")
    lines.append(f"  {'corpus':<16} {'utts':>9} {'dropped':>9} {'seconds':>12} {'share':>8}   reasons; examples")
    for c in f["corpora"]:
        reasons = ", ".join(f"{k} {v}" for k, v in c["reasons"].items()) or "-"
        lines.append(f"  {c['corpus']:<16} {c['utterances']:>9} {c['dropped_utterances']:>9} "
                     f"{c['dropped_seconds']:>12.1f} {100 * c['dropped_share']:>7.2f}%   {reasons}"
                     + (f"; {', '.join(c['example_keys'][:3])}" if c["example_keys"] else ""))
    b = report["batches"]
    how = ", ".join(f"{k} {v}" for k, v in b["batching"].items())
    lines.append(f"batches ({how}; shuffle_size {b['shuffle_size']}, sort_size {b['sort_size']}): steps per rank")
    for e in b["epochs"]:
        left = e["equal_steps_left_out"]
        lines.append(f"  epoch {e['epoch']}: {e['steps_per_rank']} (spread {e['steps_spread']}); equal_steps leaves "
                     f"out {left['batches']} batches, {sum(left['seconds']):.1f} s "
                     f"({100 * left['share_of_seconds']:.2f}%)")
    lines.append(f"order: {b['order_model']}")
    return "\n".join(lines)


__all__ = ["REASONS", "ListView", "MixFilter", "TrainerSpec", "UttColumns", "apply_filter", "batches_of_lines",
           "filter_mix", "format_report", "index_columns", "load_spec", "plan_list", "token_counts",
           "write_dropped_keys"]
