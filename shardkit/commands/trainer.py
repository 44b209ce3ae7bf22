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
    """Per utterance (index order): where it is, how long, and what its transcript needs.

    ``keys`` is a list of strings, or (balance) a sequence that reads them back on demand and has
    ``take(positions)``; ``txt`` the (offset, size) of each ``.txt`` member as an (n, 2) int64 array.
    """

    shards: list[str]
    shard: np.ndarray
    keys: Sequence[str]
    corpus_names: list[str]
    corpus: np.ndarray
    samples: np.ndarray
    rate: np.ndarray
    seconds: np.ndarray
    text_chars: np.ndarray
    txt: np.ndarray | None = None


LACKS = ("lacks frames, sample_rate or text_chars (an index from an older shardkit? rebuild it with "
         "`shardkit index`)")
TRAINER_FIELDS = ("frames", "sample_rate", "text_chars")


@dataclass
class TrainerBlock:
    """The filter's columns of some index rows: frames, rate and transcript length (compact dtypes),
    the ``.txt`` members' (offset, size) when asked, and the first row the filter cannot use."""

    frames: np.ndarray
    rate: np.ndarray
    text_chars: np.ndarray
    txt: np.ndarray | None = None
    problem: tuple[str, str] | None = None  # (message, where: "FILE: line N" or "FILE: row N")


def compact(values: np.ndarray, small=np.int32) -> np.ndarray:
    """``values`` (integers) in ``small`` (or int32) where every value fits, else int64: the filter's
    columns of 20 M utterances are 4-8 bytes each instead of 8."""
    values = np.asarray(values)
    for dtype in dict.fromkeys((small, np.int32)):
        info = np.iinfo(dtype)
        if not len(values) or (int(values.min()) >= info.min and int(values.max()) <= info.max):
            return values.astype(dtype, copy=False)
    return values.astype(np.int64, copy=False)


def concat_blocks(blocks: Sequence[TrainerBlock], want_txt: bool) -> TrainerBlock:
    """One block of several (in order); its problem is the first block's that has one."""
    def cat(name, dtype):
        parts = [getattr(b, name) for b in blocks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype)

    txt = None
    if want_txt:
        txt = np.concatenate([b.txt for b in blocks]) if blocks else np.zeros((0, 2), np.int64)
    return TrainerBlock(cat("frames", np.int32), cat("rate", np.int32), cat("text_chars", np.int32), txt,
                        next((b.problem for b in blocks if b.problem is not None), None))


class RecordTrainer:
    """The filter's fields of JSON-lines records, one record at a time (the record already parsed)."""

    def __init__(self, want_txt: bool):
        self.want_txt = want_txt
        self.frames: list[int] = []
        self.rate: list[int] = []
        self.chars: list[int] = []
        self.txt: list[tuple[int, int]] = []
        self.problem: tuple[str, str] | None = None

    def add(self, record: dict, path: str, number: int | None = None, kept: bool = True) -> None:
        """A record's fields, appended when ``kept`` (a ``--part`` run checks every record, keeps its own);
        one the filter cannot use gives zeros and is noted (the first such record is the error
        :func:`filter_mix` reports; :class:`_Columns` raises it at once)."""
        try:
            frames, rate, chars = int(record["frames"]), int(record["sample_rate"]), int(record["text_chars"])
        except (KeyError, TypeError, ValueError):
            self._note(f"index record of {record.get('key')!r} {LACKS}", _where(path, number))
            frames = rate = chars = 0
        if self.want_txt:
            txt = _txt_range(record)
            if txt is None:
                self._note(f"index record of {record['key']!r} names no .txt member", _where(path, number))
                txt = (0, 0)
            if kept:
                self.txt.append(txt)
        if kept:
            self.frames.append(frames)
            self.rate.append(rate)
            self.chars.append(chars)

    def _note(self, message: str, where: str) -> None:
        if self.problem is None:
            self.problem = (message, where)

    def block(self) -> TrainerBlock:
        """What was appended, as compact arrays; the lists start again (one block per file)."""
        txt = np.array(self.txt, np.int64).reshape(-1, 2) if self.want_txt else None
        out = TrainerBlock(compact(np.array(self.frames, np.int64)), compact(np.array(self.rate, np.int64), np.uint16),
                           compact(np.array(self.chars, np.int64), np.uint16), txt, self.problem)
        self.frames, self.rate, self.chars, self.txt, self.problem = [], [], [], [], None
        return out


def table_trainer_block(table, path: str, first_row: int, want_txt: bool, rows: np.ndarray | None = None,
                        check_all: bool = True) -> TrainerBlock:
    """The filter's columns of rows ``rows`` (None: all) of a Parquet index's pyarrow table (or batch)
    whose first row is row ``first_row`` of ``path``: straight from the columns, no per-row object.

    ``check_all``: the problem reported is the first of every row (balance checks every row it reads),
    else of ``rows`` only. A null, absent or non-finite field is what a JSON line without it is.
    """
    names = table.schema.names
    n = table.num_rows
    bad = np.zeros(n, bool)
    values = []
    for name in TRAINER_FIELDS:
        value, missing = _int_column(table.column(name) if name in names else None, n, name)
        values.append(value)
        bad |= missing
    checked = np.ones(n, bool) if check_all or rows is None else np.isin(np.arange(n), rows)
    txt, no_txt = _txt_columns(table, n) if want_txt else (None, np.zeros(n, bool))
    problem = None
    first = np.flatnonzero(checked & (bad | no_txt))
    if len(first):
        row = int(first[0])
        key = table.column("key")[row].as_py()
        why = LACKS if bad[row] else "names no .txt member"
        problem = (f"index record of {key!r} {why}", f"{path}: row {first_row + row}")
    if rows is not None:
        values = [v[rows] for v in values]
        txt = None if txt is None else txt[rows]
    return TrainerBlock(compact(values[0]), compact(values[1], np.uint16), compact(values[2], np.uint16), txt, problem)


def _int_column(column, n: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, missing mask) of a column (None: absent) as ``int(value)`` takes them: floats truncated."""
    if column is None:
        return np.zeros(n, np.int64), np.ones(n, bool)
    import pyarrow.compute as pc

    missing = column.is_null().to_numpy(zero_copy_only=False) if column.null_count else np.zeros(n, bool)
    values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False) if column.null_count else \
        column.to_numpy(zero_copy_only=False)
    if values.dtype.kind == "f":
        missing |= ~np.isfinite(values)
        values = np.where(missing, 0, values)
    elif values.dtype.kind not in "iu":
        raise TypeError(f"column {name!r} holds {values.dtype}, not integers")
    return values.astype(np.int64), missing


def _txt_columns(table, n: int) -> tuple[np.ndarray, np.ndarray]:
    """((offset, size) of each row's ``.txt`` member, rows without one): members are stored relative to
    the key (``.txt``), or whole behind a NUL (:mod:`shardkit.io.indexfile`); the first match counts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = np.zeros((n, 2), np.int64)
    if "members" not in table.schema.names:
        return out, np.ones(n, bool)
    members = table.column("members")
    if isinstance(members, pa.ChunkedArray):
        members = members.combine_chunks()
    parents = pc.list_parent_indices(members).to_numpy(zero_copy_only=False)
    name, offset, size = pc.list_flatten(members).flatten()
    hit = pc.fill_null(pc.equal(name, ".txt"), False).to_numpy(zero_copy_only=False)
    whole = np.flatnonzero(pc.fill_null(pc.and_(pc.starts_with(name, "\0"), pc.ends_with(name, ".txt")),
                                        False).to_numpy(zero_copy_only=False))
    if len(whole):  # rare: a name that does not start with its key, stored whole
        keys = table.column("key")
        for i in whole.tolist():
            hit[i] = name[i].as_py()[1:] == keys[int(parents[i])].as_py() + ".txt"
    at = np.flatnonzero(hit)
    rows, first = np.unique(parents[at], return_index=True)
    at = at[first]
    out[rows, 0] = offset.take(pa.array(at)).to_numpy(zero_copy_only=False)
    out[rows, 1] = size.take(pa.array(at)).to_numpy(zero_copy_only=False)
    found = np.zeros(n, bool)
    found[rows] = True
    return out, ~found


class _Columns:
    """Collects index records (a dict at a time) or Parquet tables (columns at a time) into columns;
    ``want_txt`` keeps the place of each ``.txt`` member. Shards and corpora are numbered in order of
    first appearance (after those of ``shard_ids``), whichever way the rows came."""

    def __init__(self, want_txt: bool, shard_ids: dict[str, int] | None = None):
        self.want_txt = want_txt
        self.shard_ids: dict[str, int] = dict(shard_ids or {})
        self.shards = list(self.shard_ids)
        self.corpus_ids: dict[str, int] = {}
        self.keys: list[str] = []
        self.blocks: list[tuple] = []  # (shard, corpus, seconds, TrainerBlock) per table or run of records
        self._pending()

    def _pending(self) -> None:
        self.shard, self.corpus, self.seconds = [], [], []
        self.trainer = RecordTrainer(self.want_txt)

    def _flush(self) -> None:
        if self.shard:
            self.blocks.append((np.array(self.shard, np.int64), np.array(self.corpus, np.int64),
                                np.array(self.seconds, np.float64), self.trainer.block()))
            self._pending()

    def _id(self, table: dict[str, int], names: list[str] | None, name: str) -> int:
        i = table.get(name)
        if i is None:
            i = table[name] = len(table)
            if names is not None:
                names.append(name)
        return i

    def add(self, record: dict, path: str, number: int | None = None) -> None:
        """One record (``path``/``number``: where it came from, named only in an error)."""
        shard = record["shard"]
        sid = self.shard_ids.get(shard)  # (inline, not _id: this runs once per JSON line)
        if sid is None:
            sid = self.shard_ids[shard] = len(self.shards)
            self.shards.append(shard)
        corpus = record.get("corpus") or _folder(shard)
        cid = self.corpus_ids.get(corpus)
        if cid is None:
            cid = self.corpus_ids[corpus] = len(self.corpus_ids)
        trainer = self.trainer
        trainer.add(record, path, number)
        if trainer.problem is not None:
            raise ShardkitError(trainer.problem[0], shard=trainer.problem[1])
        self.shard.append(sid)
        self.keys.append(record["key"])
        self.corpus.append(cid)
        self.seconds.append(float(record["duration"]))

    def add_table(self, table, path: str, first_row: int, keep: set[str] | None) -> None:
        """The rows of a Parquet index's table (or record batch) whose shard is in ``keep`` (None: all)."""
        self._flush()
        shard_codes, shard_names = _codes(table.column("shard"))
        rows = None
        if keep is not None:
            rows = np.flatnonzero(np.fromiter((s in keep for s in shard_names), bool, len(shard_names))[shard_codes])
            shard_codes = shard_codes[rows]
        if "corpus" in table.schema.names:
            codes, names = _codes(table.column("corpus"), nulls=True)
            codes = codes if rows is None else codes[rows]
            null = codes < 0  # no corpus: the shard's folder names it
            labels = np.where(null, len(names) + shard_codes, codes)
            names = names + [_folder(s) for s in shard_names]
        else:
            labels, names = shard_codes, [_folder(s) for s in shard_names]
        block = table_trainer_block(table, path, first_row, self.want_txt, rows, check_all=False)
        if block.problem is not None:
            raise ShardkitError(block.problem[0], shard=block.problem[1])
        seconds = table.column("duration").to_numpy(zero_copy_only=False).astype(np.float64)
        keys = table.column("key")
        self.keys.extend((keys if rows is None else keys.take(rows)).to_pylist())
        self.blocks.append((self._renumber(shard_codes, shard_names, self.shard_ids, self.shards),
                            self._renumber(np.asarray(labels, np.int64), names, self.corpus_ids, None),
                            seconds if rows is None else seconds[rows], block))

    def _renumber(self, codes: np.ndarray, names: list[str], table: dict[str, int], into: list[str] | None
                  ) -> np.ndarray:
        """Local codes (into ``names``) as ids of ``table``, new names numbered in order of first appearance."""
        mapping = np.zeros(len(names), np.int64)
        used, first = np.unique(codes, return_index=True)
        for code in used[np.argsort(first, kind="stable")].tolist():
            mapping[code] = self._id(table, into, names[code])
        return mapping[codes]

    def columns(self) -> UttColumns:
        self._flush()
        trainer = concat_blocks([b[3] for b in self.blocks], self.want_txt)

        def cat(k: int, dtype) -> np.ndarray:
            return np.concatenate([b[k] for b in self.blocks]).astype(dtype) if self.blocks else np.zeros(0, dtype)

        return UttColumns(self.shards, cat(0, np.int64), self.keys, list(self.corpus_ids), cat(1, np.int64),
                          trainer.frames.astype(np.int64), trainer.rate.astype(np.int64), cat(2, np.float64),
                          trainer.text_chars.astype(np.int64), trainer.txt)


def _codes(column, nulls: bool = False) -> tuple[np.ndarray, list]:
    """(int64 codes, values) of a (dictionary-encoded or plain) string column; a null is -1 where ``nulls``
    allows it, else an error."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    if column.null_count and not nulls:
        raise ValueError("a null shard")
    codes = column.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, column.dictionary.to_pylist()


def _where(path: str, number: int | None) -> str:
    return path if number is None else f"{path}: line {number}"


def _folder(shard: str) -> str:
    return os.path.basename(os.path.dirname(os.path.abspath(shard))) or "corpus"


def _txt_range(record: dict) -> tuple[int, int] | None:
    name = record["key"] + ".txt"
    for member in record.get("members", ()):
        if member[0] == name:
            return int(member[1]), int(member[2])
    return None


def index_columns(index_files: Sequence[str], *, want_txt: bool, keep: set[str] | None = None) -> UttColumns:
    """Columns of every record of the index files (in file order), or only of shards in ``keep``.

    Parquet is read a row group at a time, column by column (no per-row dict); JSON lines a line at a time.
    """
    from shardkit.io.indexfile import (
        is_parquet,
        loads,
        open_index,
        open_parquet_index,
        parse_index_line,
        read_row_group,
    )

    cols = _Columns(want_txt)
    add = cols.add
    for path in index_files:
        if is_parquet(path):
            pf = open_parquet_index(path)
            wanted = ["shard", "key", "duration", "corpus", *TRAINER_FIELDS, *(["members"] if want_txt else [])]
            columns = [c for c in wanted if c in pf.schema_arrow.names]
            first = 0
            for group in range(pf.num_row_groups):
                table = read_row_group(pf, path, group, columns)
                try:
                    for batch in table.to_batches():  # one array per column (a dictionary each)
                        cols.add_table(batch, path, first, keep)
                        first += batch.num_rows
                except (ValueError, TypeError) as err:
                    raise ShardkitError(f"row group {group}: {err}", shard=path) from None
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
    return _tokenized(cols.shards, cols.shard, cols.txt, spec.tokenizer, on_shard)


def _tokenized(shards: Sequence[str], shard: np.ndarray, txt: np.ndarray | None, tokenizer: Tokenizer,
               on_shard: Callable[[str], None] | None) -> np.ndarray:
    """The tokenizer's label length of each utterance, its transcript read from ``shards[shard[i]]`` at ``txt[i]``."""
    from shardkit.io.wenet_conf import transcripts_by_shard
    from shardkit.planning.trainer import count_tokens

    ranges = [] if txt is None else txt.tolist()
    texts = transcripts_by_shard(shards, shard, ranges, on_shard=on_shard)
    return np.fromiter((count_tokens(t, tokenizer) for t in texts), np.int64, len(texts))


@dataclass
class FilterResult:
    """The filter's verdict on a set of utterances, and the report of what it drops."""

    keep: np.ndarray
    summary: dict
    dropped_keys: list[str] = field(default_factory=list)


def apply_filter(cols: UttColumns, spec: TrainerSpec, *, corpus_names: Sequence[str] | None = None,
                 on_shard: Callable[[str], None] | None = None) -> FilterResult:
    """WeNet's ``filter_conf`` over the columns (see :func:`shardkit.planning.trainer.filter_reasons`)."""
    from shardkit.planning.trainer import filter_reasons

    tokens = token_counts(cols, spec, on_shard)
    reasons = filter_reasons(cols.samples, cols.rate, tokens, spec.conf.filter)
    names = list(corpus_names) if corpus_names is not None else cols.corpus_names
    return _verdict(reasons, cols.corpus, names, cols.seconds, cols.keys, spec)


def _verdict(reasons: np.ndarray, corpus: np.ndarray, names: Sequence[str], seconds: np.ndarray,
             keys: Sequence[str], spec: TrainerSpec) -> FilterResult:
    """The FilterResult of the filter's reasons (0: kept) per utterance."""
    from shardkit.planning.trainer import filter_summary

    summary = filter_summary(reasons, corpus, names, seconds, keys)
    summary["filter_conf"] = dataclasses.asdict(spec.conf.filter)
    dropped = np.flatnonzero(reasons != 0)
    # balance's keys are read back from the index: the dropped ones too, when they are written (not held:
    # 1.5 M dropped keys of a 20 M mix are ~120 MB of strings while the mix is planned)
    found = KeysAt(keys, dropped) if hasattr(keys, "take") else take_keys(keys, dropped)
    return FilterResult(reasons == 0, summary, found)


class KeysAt:
    """The keys at ``positions`` of a sequence that reads keys back (``take``), read a chunk at a time
    whenever iterated, in ``positions``' order."""

    CHUNK = 1 << 18

    def __init__(self, keys, positions: np.ndarray):
        self.keys, self.positions = keys, np.asarray(positions, np.int64)

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self):
        for start in range(0, len(self.positions), self.CHUNK):
            yield from self.keys.take(self.positions[start:start + self.CHUNK])

    def __getitem__(self, i: int) -> str:
        return self.keys.take(self.positions[[i]])[0]


def take_keys(keys: Sequence[str], positions: np.ndarray) -> list[str]:
    """The keys at ``positions``: read back in one go from a sequence that can (``take``), else one by one."""
    if hasattr(keys, "take"):
        return list(keys.take(np.asarray(positions, np.int64)))
    return [keys[i] for i in positions]


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

        # in the index's own dtypes (int32 / uint16 where they fit): feature_frames widens a chunk at a time
        samples = np.zeros(len(plan.utt), np.result_type(*self.samples) if self.samples else np.int64)
        rates = np.zeros(len(plan.utt), np.result_type(*self.rates) if self.rates else np.int64)
        for c in range(len(self.samples)):
            at = plan.corpus == c
            samples[at] = self.samples[c][plan.utt[at]]
            rates[at] = self.rates[c][plan.utt[at]]
        offsets = np.arange(plan.num_shards + 1, dtype=np.int64) * plan.utts_per_shard
        return plan_batches(offsets, samples, rates, np.asarray(plan.seconds, np.float64), world_size=world_size,
                            num_workers=num_workers, conf=self.spec.conf, seed=seed, epochs=epochs)


def filter_mix(mix, spec: TrainerSpec, on_transcripts: Callable[[str], None] | None = None):
    """``(mix without the utterances WeNet's filter drops, MixFilter)``.

    ``mix`` is balance's ``MixColumns``, read with the filter's columns (``load_columns(...,
    trainer_columns=True)``: every corpus' ``trainer`` is a :class:`TrainerBlock`); the index is not
    read again. A record the filter cannot use (no frames, sample_rate or text_chars; no ``.txt``
    member when a tokenizer counts tokens) is the error, naming its file and line or row.
    """
    from shardkit.planning.trainer import filter_reasons

    blocks = []
    for name, corpus in zip(mix.names, mix.corpora):
        block = corpus.trainer
        if block is None or (spec.tokenizer is not None and block.txt is None):
            raise ValueError(f"corpus {name!r} was loaded without the trainer's columns")
        if block.problem is not None:
            raise ShardkitError(block.problem[0], shard=block.problem[1])
        blocks.append(block)
    # corpus by corpus (the filter is per utterance): no joined copy of the columns, a corpus' temporaries at a time
    parts = []
    for corpus, block in zip(mix.corpora, blocks):
        tokens = block.text_chars if spec.tokenizer is None else \
            _tokenized(mix.shards, corpus.shard, block.txt, spec.tokenizer, on_transcripts)
        parts.append(filter_reasons(block.frames, block.rate, tokens, spec.conf.filter))
    reasons = np.concatenate(parts)
    counts = [len(c.durations) for c in mix.corpora]
    corpus_ids = np.repeat(np.arange(len(counts), dtype=np.int8 if len(counts) < 128 else np.int32), counts)
    result = _verdict(reasons, corpus_ids, mix.names, np.concatenate([c.durations for c in mix.corpora]),
                      _MixKeys([c.keys for c in mix.corpora]), spec)
    del reasons, corpus_ids
    corpora, samples, rates = [], [], []
    start = 0
    for c, corpus in enumerate(mix.corpora):
        n = len(corpus.durations)
        keep = result.keep[start:start + n]
        start += n
        idx = np.flatnonzero(keep)
        if not len(idx):
            raise UsageError(f"corpus {mix.names[c]!r}: the trainer's filter_conf drops every utterance "
                             f"({len(keep)}); nothing is left to balance")
        corpora.append(dataclasses.replace(_kept(corpus, idx), trainer=None))
        samples.append(blocks[c].frames[idx])
        rates.append(blocks[c].rate[idx])
    return dataclasses.replace(mix, corpora=corpora), MixFilter(spec, result, samples, rates)


class _MixKeys:
    """The keys of several corpora as one sequence, read back from each corpus' keys (balance keeps no
    key strings: its ``IndexKeys`` reads the few asked for from the index files)."""

    def __init__(self, parts: list):
        self.parts = parts
        self.starts = np.cumsum([0] + [len(p) for p in parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> str:
        return self.take(np.array([i]))[0]

    def take(self, positions: np.ndarray) -> list[str]:
        positions = np.asarray(positions, np.int64)
        out = np.empty(len(positions), object)
        part_of = np.searchsorted(self.starts, positions, side="right") - 1
        for k, part in enumerate(self.parts):
            mine = np.flatnonzero(part_of == k)
            if len(mine):
                out[mine] = take_keys(part, positions[mine] - self.starts[k])
        return list(out)


def _kept(corpus, idx: np.ndarray):
    """balance's corpus columns of the utterances ``idx`` only (every per-utterance column subset together)."""
    def pick(column):
        return None if column is None else column[idx]

    keys = corpus.keys.subset(idx) if hasattr(corpus.keys, "subset") else [corpus.keys[i] for i in idx]  # IndexKeys
    rows = None if corpus.segments is None else (idx if corpus.rows is None else corpus.rows[idx])
    if rows is not None and (not len(rows) or int(rows.max()) < 2**31):  # ascending: int32 where it fits (memory)
        rows = rows.astype(np.int32)
    return dataclasses.replace(corpus, durations=corpus.durations[idx], keys=keys, shard=corpus.shard[idx],
                               line_file=pick(corpus.line_file), line_offset=pick(corpus.line_offset),
                               key_hash=pick(corpus.key_hash), rows=rows)


# ---------------------------------------------------------------------------------------------
# reporting


def write_dropped_keys(path: str, keys: Sequence[str]) -> None:
    """The dropped keys, one per line, written atomically."""
    from shardkit.io.files import atomic_write_lines, output_error

    try:
        atomic_write_lines(path, iter(keys))
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


__all__ = ["REASONS", "ListView", "MixFilter", "RecordTrainer", "TrainerBlock", "TrainerSpec", "UttColumns",
           "apply_filter", "batches_of_lines", "filter_mix", "format_report", "index_columns", "load_spec",
           "plan_list", "table_trainer_block", "take_keys", "token_counts", "write_dropped_keys"]
