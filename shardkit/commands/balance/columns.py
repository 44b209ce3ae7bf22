"""balance's index files read into columns: what planning and writing need of every utterance, as arrays.

A dry run over a million utterances is bound by this read, so the indexes are read into arrays, not
per-utterance dicts: Parquet column by column (row groups in threads), JSON lines a line at a time.
Keys are kept only as 64-bit hashes (:class:`IndexKeys` reads the few key strings asked for back from
the files); the checks made while reading (an impossible duration, a shard in two corpora) refuse a
mix before anything is written. A writing run then turns the rows into the byte offsets its workers
read records at (:func:`line_refs`).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from shardkit.errors import ShardkitError, UsageError
from shardkit.planning.balance import REPEAT_MARK
from shardkit.planning.plausible import impossible_duration


@dataclass
class CorpusColumns:
    """What planning and writing need of a corpus' utterances, as arrays (no per-utterance dicts).

    ``keys`` is a sequence of the keys or an :class:`IndexKeys` that reads them back from the index
    files on demand (only repeats and error messages need key strings; duplicates are found by
    ``key_hash``). ``line_file``/``line_offset`` say where each record is (a JSON line's byte offset,
    a Parquet row's number); a writing run fills them (:func:`line_refs`), a plan does not need them.
    """

    durations: np.ndarray
    keys: Sequence[str] | "IndexKeys"
    shard: np.ndarray  # index into MixColumns.shards
    line_file: np.ndarray | None = None  # index into MixColumns.index_files
    line_offset: np.ndarray | None = None  # byte offset of the utterance's line (JSON lines) or row (Parquet)
    key_hash: np.ndarray | None = None  # shardkit.io.indexfile.key_hashes of the keys
    segments: list["_Segment"] | None = None  # the index files the rows came from (load_columns)
    rows: np.ndarray | None = None  # after a filter: the segments' rows these utterances are (None: all)
    # load_columns(trainer_columns=True): frames, sample_rate, text_chars (and .txt places) for --wenet-conf,
    # a shardkit.wenet_conf.blocks.TrainerBlock; None otherwise (and once the filter has used it)
    trainer: object | None = None


@dataclass
class MixColumns:
    """A mix's indexes loaded as arrays: the corpora's names and columns, their shards and index files,
    and the key hashes and repeat-marked keys that the uniqueness checks need.
    """
    names: list[str]
    corpora: list[CorpusColumns]
    shards: list[str]
    index_files: list[str]
    sorted_hashes: np.ndarray | None = None  # every key's hash, sorted (check_unique_keys keeps it)
    # every key that contains REPEAT_MARK (load_columns collects them): the only keys a repeat's name can
    # equal, so the repeat-name check needs neither the 20 M hashes nor a second read (None: not collected)
    repeat_like: set[str] | None = None
    # per index file, its completeness marks and source stamps (shardkit.io.indexmarks.IndexMarks)
    index_marks: dict = field(default_factory=dict)
    # the one array whose consecutive slices are the corpora's key_hash, in corpus order (load_columns, one
    # Parquet file a corpus): check_unique_keys sorts it in place instead of a joined copy (None: not so)
    hash_pool: np.ndarray | None = None


@dataclass
class _Segment:
    """The utterances of one index file within a corpus: its id, their count, and (JSON lines) line offsets."""

    file_id: int
    path: str
    count: int
    offsets: np.ndarray | None  # None for Parquet: rows are 0..count-1


class IndexKeys:
    """A corpus' keys, read back from its index files when asked (a list of 20 M strings would not fit)."""

    def __init__(self, segments: list[_Segment], rows: np.ndarray | None = None):
        self.segments = segments
        self.starts = np.cumsum([0] + [s.count for s in segments])
        self.rows = rows  # a subset of the files' rows (after the trainer's filter), in this order

    def subset(self, utts: np.ndarray) -> "IndexKeys":
        """The keys of utterances ``utts`` of this sequence, still read back on demand."""
        # int32 rows where the files' rows fit (a filtered 20 M corpus: 74 MB less, held while it is planned)
        dtype = np.int32 if int(self.starts[-1]) < 2**31 else np.int64
        rows = np.asarray(utts, np.int64) if self.rows is None else self.rows[np.asarray(utts, np.int64)]
        return IndexKeys(self.segments, rows.astype(dtype, copy=False))

    def __len__(self) -> int:
        return int(self.starts[-1]) if self.rows is None else len(self.rows)

    def __getitem__(self, u: int) -> str:
        if not -len(self) <= u < len(self):
            raise IndexError(u)  # also ends iteration by index, which would otherwise never stop
        return self.take(np.array([u % len(self)]))[0]

    def __iter__(self):
        return iter(self.take(np.arange(len(self))))

    def hashes(self) -> np.ndarray:
        """Every key's hash again, read back from the files (only a suspected repeat-name clash needs it)."""
        from shardkit.io.indexfile import hash_strings, key_hashes, open_parquet_index, read_row_group

        parts = []
        for seg in self.segments:
            if seg.offsets is None:
                pf = open_parquet_index(seg.path)
                parts += [key_hashes(read_row_group(pf, seg.path, g, ["key"]).column("key"))
                          for g in range(pf.num_row_groups)]
            else:
                start = int(self.starts[self.segments.index(seg)])
                parts.append(hash_strings(IndexKeys(self.segments).take(np.arange(start, start + seg.count))))
        every = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
        return every if self.rows is None else every[self.rows]

    def take(self, utts: np.ndarray) -> list[str]:
        """Keys of the utterances ``utts`` (any order, repeats allowed), in that order."""
        from shardkit.io.indexfile import loads

        utts = np.asarray(utts, np.int64)
        if self.rows is not None:
            utts = self.rows[utts]
        out = np.empty(len(utts), object)
        seg_of = np.searchsorted(self.starts, utts, side="right") - 1
        for k, seg in enumerate(self.segments):
            where = np.flatnonzero(seg_of == k)
            if not len(where):
                continue
            rows = utts[where] - self.starts[k]
            if seg.offsets is None:
                out[where] = _parquet_keys(seg.path, rows)
            else:
                with open(seg.path, "rb") as f:
                    for i, row in zip(where, rows):
                        f.seek(int(seg.offsets[row]))
                        out[i] = loads(f.readline())["key"]
        return list(out)


def _parquet_keys(path: str, rows: np.ndarray) -> list[str]:
    """Keys of rows ``rows`` of a Parquet index: the row groups that hold them read in threads."""
    from concurrent.futures import ThreadPoolExecutor

    from shardkit.io.indexfile import open_parquet_index

    pf = open_parquet_index(path)
    order = np.argsort(rows, kind="stable")
    wanted = rows[order]
    out = np.empty(len(rows), object)
    starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
    bounds = np.searchsorted(wanted, starts)
    groups = [g for g in range(pf.num_row_groups) if bounds[g + 1] > bounds[g]]

    def keys_of(group: int) -> list[str]:
        lo, hi = bounds[group], bounds[group + 1]
        return _group_keys(path, group, wanted[lo:hi] - starts[group])

    with ThreadPoolExecutor(read_threads()) as pool:
        for group, keys in zip(groups, pool.map(keys_of, groups)):
            out[order[bounds[group]:bounds[group + 1]]] = keys
    return list(out)


def _group_keys(path: str, group: int, rows: np.ndarray) -> list[str]:
    from shardkit.io.indexfile import open_parquet_index, read_row_group

    keys = read_row_group(open_parquet_index(path), path, group, ["key"]).column("key")
    return keys.take(rows).to_pylist()



def read_threads() -> int:
    """Threads that read an index's row groups at once: up to 4 of the cores."""
    return max(1, min(os.cpu_count() or 1, 4))


def load_columns(names: Sequence[str], index_files: Sequence[Sequence[str]], part: tuple[int, int] | None = None,
                 on_corpus_loaded: Callable[[int, int], None] | None = None, *, trainer_columns: bool = False,
                 txt_members: bool = False) -> MixColumns:
    """Read each corpus' index files into arrays: Parquet column by column, JSON lines a line at a time.

    ``part=(I, P)``: keep only part I of P of every corpus, the utterances whose row (counted over the
    corpus' index files, in order) is I - 1 modulo P; every row is still read and checked, and every key
    that looks like a repeat's name collected, but only the part's columns are kept (memory: 1/P).
    ``on_corpus_loaded(c, utterances)`` is called as each corpus is read (balance starts its draws).

    ``trainer_columns`` (``--wenet-conf``): also collect, in the same read, what WeNet's filter needs of
    every kept utterance (``CorpusColumns.trainer``: frames, sample_rate, text_chars in compact dtypes,
    and with ``txt_members`` the ``.txt`` member's offset and size), so that the index is read once.
    """
    state = _LoadState(None if part is None else (part[0] - 1, part[1]), trainer_columns, txt_members)
    state.hash_pool = _hash_pool(index_files) if part is None else None
    corpora = []
    for c, (name, paths) in enumerate(zip(names, index_files)):
        corpora.append(_load_corpus(state, c, name, paths, names))
        if on_corpus_loaded is not None:
            on_corpus_loaded(c, len(corpora[-1].durations))
    if "pyarrow" in sys.modules:  # hand the row groups' buffers back before planning (peak memory)
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    return MixColumns(list(names), corpora, state.shards, state.files, repeat_like=state.repeat_like,
                      index_marks=state.marks, hash_pool=state.hash_pool)


def _hash_pool(index_files: Sequence[Sequence[str]]) -> np.ndarray | None:
    """One uint64 array for every key hash of a mix of one Parquet file a corpus (the footers say the rows),
    else None. A footer that cannot be read gives None: the read itself then reports it, in order."""
    from shardkit.io.indexfile import is_parquet

    if not all(len(paths) == 1 and is_parquet(paths[0]) for paths in index_files):
        return None
    try:
        import pyarrow.parquet as pq

        total = sum(pq.read_metadata(paths[0]).num_rows for paths in index_files)
    except Exception:  # noqa: BLE001 (missing pyarrow, a damaged file: the read names it)
        return None
    return np.empty(total, np.uint64)


def _load_corpus(state: _LoadState, c: int, name: str, paths: Sequence[str], names: Sequence[str]) -> CorpusColumns:
    """Corpus ``c``'s index files, read in order into one corpus' columns (its shards claimed for it)."""
    state.row = 0
    state.corpus = name
    parts = [_read_index_file(state, path) for path in paths]
    durations = _joined([p[0] for p in parts], np.float64)
    shard = _joined([p[1] for p in parts], np.int32)
    state.claim_shards(shard, c, names)
    segments = [p[3] for p in parts]
    starts = np.cumsum([0] + [seg.count for seg in segments])
    rows = None if state.part is None else np.concatenate(
        [starts[k] + p[4] for k, p in enumerate(parts)] or [np.zeros(0, np.int64)])
    return CorpusColumns(durations, IndexKeys(segments, rows), shard, key_hash=_joined(
        [p[2] for p in parts], np.uint64), segments=segments, rows=rows, trainer=state.take_trainer_columns())


def _read_index_file(state: _LoadState, path: str) -> tuple:
    """One index file of the corpus being read: (durations, shard ids, key hashes, its segment, kept rows)."""
    from shardkit.io.indexfile import is_parquet

    file_id = len(state.files)
    state.files.append(path)
    read = _read_parquet if is_parquet(path) else _read_jsonl
    first = state.row
    durations, shard, hashes, offsets, rows, count = read(path, state)
    state.row = first + (count if offsets is None else state.row - first)
    return durations, shard, hashes, _Segment(file_id, path, count, offsets), rows


def _joined(parts: list[np.ndarray], dtype) -> np.ndarray:
    """The parts as one array; one part (one index file: the usual corpus) is taken as it is, not copied
    (at 20 M utterances each copy of the columns is ~0.3 GB of fresh pages to fault in)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


class _LoadState:
    """Shards and index files seen so far, and which corpus owns each shard."""

    def __init__(self, part: tuple[int, int] | None = None, trainer: bool = False, want_txt: bool = False):
        self.shards: list[str] = []
        self.shard_ids: dict[str, int] = {}
        self.owner: list[int] = []
        self.files: list[str] = []
        self.corpus = ""  # the corpus whose index is being read (for messages)
        self.repeat_like: set[str] = set()  # keys that contain REPEAT_MARK (MixColumns.repeat_like)
        self.part = part  # (I - 1, P): keep the corpus rows that are I - 1 modulo P
        self.row = 0  # rows of the corpus read so far (over its index files)
        self.trainer = trainer  # collect the trainer's filter columns (load_columns' trainer_columns)
        self.want_txt = want_txt  # ... and the .txt members' places
        self.trainer_parts: list = []  # the corpus' TrainerBlocks so far, in row order
        self.marks: dict = {}  # index file -> its IndexMarks (completeness, source stamps)
        self.hash_pool: np.ndarray | None = None  # MixColumns.hash_pool, filled file by file from hash_at
        self.hash_at = 0

    def hashes_out(self, count: int) -> np.ndarray:
        """Where the next ``count`` key hashes go: the pool's next slice, or a fresh array (no pool, or a
        file whose rows differ from its footer's count: then the pool is given up)."""
        pool = self.hash_pool
        if pool is None or self.hash_at + count > len(pool):
            self.hash_pool = None
            return np.empty(count, np.uint64)
        self.hash_at += count
        return pool[self.hash_at - count:self.hash_at]

    def take_trainer_columns(self):
        """The corpus' trainer columns as one TrainerBlock (None unless asked); the next corpus starts afresh."""
        if not self.trainer:
            return None
        from shardkit.wenet_conf.blocks import concat_blocks

        block = concat_blocks(self.trainer_parts, self.want_txt)
        self.trainer_parts = []
        return block

    def record_trainer(self):
        """A JSON lines file's collector of the trainer's filter fields (None unless asked)."""
        if not self.trainer:
            return None
        from shardkit.wenet_conf.blocks import RecordTrainer

        return RecordTrainer(self.want_txt)

    def refuse_impossible(self, key: str, shard: str, why: str, path: str) -> None:
        """An utterance whose seconds its bytes cannot hold: no plan is built on a header lie."""
        raise ShardkitError(f"utterance {key!r} of shard {shard} in corpus {self.corpus!r}: {why}; "
                            "no plan is built on it (validate that shard)", shard=path)

    def claim_shards(self, shard: np.ndarray, corpus: int, names: Sequence[str]) -> None:
        """A shard belongs to one corpus: the shards new in this corpus become its own, an old one is refused."""
        self.owner.extend([corpus] * (len(self.shards) - len(self.owner)))
        seen = np.zeros(len(self.shards), bool)
        seen[shard] = True  # a scatter: a bincount counts (and widens to int64) what only needs marking
        used = np.flatnonzero(seen)
        owner = np.array(self.owner, np.int64)
        other = used[owner[used] != corpus]
        if len(other):
            sid = int(other[0])
            raise UsageError(f"{self.shards[sid]} is in corpus {names[self.owner[sid]]!r} and in corpus "
                             f"{names[corpus]!r}")


class _ParquetColumns:
    """A Parquet index's columns, filled a row group at a time, in row order, into arrays sized from the
    file's metadata: no list of parts joined at the end (at 20 M utterances a join is ~0.4 GB of fresh pages
    copied once more)."""

    def __init__(self, kept_per_group: list[int], with_rows: bool, hashes: np.ndarray):
        total = int(sum(kept_per_group))
        self.ends = np.cumsum([0, *kept_per_group]).tolist()
        self.durations = np.empty(total, np.float64)
        self.shards = np.empty(total, np.int32)
        self.hashes = hashes
        self.kept = np.empty(total, np.int64) if with_rows else None  # with a part: the file's rows kept

    def group_out(self, group: int) -> tuple[np.ndarray, np.ndarray]:
        """Where row group ``group``'s read writes its durations and key hashes (the reading thread writes
        them in place: no fresh arrays per row group, whose pages would be faulted in once more)."""
        span = slice(self.ends[group], self.ends[group + 1])
        return self.durations[span], self.hashes[span]

    def put(self, group: int, shards: np.ndarray, rows) -> None:
        span = slice(self.ends[group], self.ends[group + 1])
        self.shards[span] = shards
        if self.kept is not None:
            self.kept[span] = rows


def _read_parquet(path: str, state: _LoadState):
    """(durations, shard ids, key hashes, None, kept rows (None: all), rows in the file) of a Parquet index.

    Row groups are read, checked and hashed in threads (pyarrow's reads and numpy's passes release the
    GIL), a few at a time, and taken in row order: the shard ids (numbered in order of first appearance)
    and the first error reported are those of a read one row group after the other.
    """
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import ExitStack

    from shardkit.io.indexfile import open_parquet_index
    from shardkit.io.indexmarks import parquet_marks

    pf = open_parquet_index(path)
    state.marks[path] = parquet_marks(path, pf)
    plausibility = [c for c in ("sample_rate", "bytes") if c in pf.schema_arrow.names]
    plausibility = plausibility if len(plausibility) == 2 else []
    starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]).tolist()
    kept = _kept_sizes(starts, state)
    columns = _ParquetColumns(kept, state.part is not None, state.hashes_out(int(sum(kept))))
    with ThreadPoolExecutor(read_threads()) as pool, ExitStack() as on_error:
        # an error (or Ctrl-C) stops the reads not yet started, rather than reading the rest of the file first
        on_error.push(lambda kind, *_: kind is not None and pool.shutdown(wait=False, cancel_futures=True))
        reads = [pool.submit(_read_group, path, (group, starts[group]), plausibility, state, columns.group_out(group))
                 for group in range(pf.num_row_groups)]
        for group, read in enumerate(reads):
            _take_group(read.result(), (group, starts[group], starts[group + 1]), path, state, columns)
            reads[group] = None  # its columns go as soon as they are taken
    return columns.durations, columns.shards, columns.hashes, None, columns.kept, starts[-1]


def _kept_sizes(starts: list[int], state: _LoadState) -> list[int]:
    """Rows each row group keeps (all, or with a part those of the part), from the groups' first rows."""
    sizes = [stop - start for start, stop in zip(starts, starts[1:])]
    if state.part is None:
        return sizes
    return [len(_part_rows(state.row + start, size, state.part)) for start, size in zip(starts, sizes)]


def _take_group(read: tuple, where: tuple[int, int, int], path: str, state: _LoadState,
                columns: _ParquetColumns) -> None:
    """One row group's read (:func:`_read_group`) added to ``columns``, in row order (``where``: the group,
    its first row and the row after it): its shards numbered, its marked keys and trainer columns kept."""
    from shardkit.io.indexfile import dictionary_codes

    group, start, stop = where
    shard_column, marked, rows, trainer = read
    state.repeat_like.update(marked)
    try:
        shards = dictionary_codes(shard_column, state.shards, state.shard_ids)
    except (ValueError, TypeError) as err:
        raise _group_error(group, start, stop, err, path) from None
    columns.put(group, shards, None if rows is None else rows + start)
    if trainer is not None:
        state.trainer_parts.append(trainer)


def _part_rows(first: int, count: int, part: tuple[int, int]) -> np.ndarray:
    """Which of ``count`` rows, the first being corpus row ``first``, are ``part[0]`` modulo ``part[1]``."""
    index, parts = part
    return np.arange((index - first) % parts, count, parts, dtype=np.int64)


def _repeat_like(keys) -> list[str]:
    """The keys of a pyarrow string column that contain REPEAT_MARK (almost always none): one search of
    the column's bytes (a byte search, ~10x faster than matching key by key) decides whether to look closer."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    if not any(c.buffers()[2] is not None and _holds_mark(c.buffers()[2]) for c in chunks):
        return []
    marked = pc.match_substring(keys, REPEAT_MARK)
    return keys.filter(marked).to_pylist()


def _holds_mark(buffer) -> bool:
    """Whether a buffer's bytes hold REPEAT_MARK: its first byte's places found by one numpy comparison, the
    rest checked there (~8x faster than a copy of the buffer searched by bytes; a key buffer is ~14 MB)."""
    data = np.frombuffer(buffer, np.uint8)
    mark = np.frombuffer(REPEAT_MARK.encode("utf-8"), np.uint8)
    if len(data) < len(mark):
        return False
    searched = data[:len(data) - len(mark) + 1]
    first = np.equal(searched, mark[0], out=_scratch("mark_bytes", len(searched), np.bool_))  # no fresh pages
    if not first.any():
        return False
    at = np.flatnonzero(first)
    for i in range(1, len(mark)):
        at = at[data[at + i] == mark[i]]
    return bool(len(at))


def _group_error(group: int, start: int, stop: int, err: Exception, path: str) -> ShardkitError:
    return ShardkitError(f"row group {group} (rows {start}-{stop - 1}): {err} in the shard or key column", shard=path)


def _read_group(path: str, where: tuple[int, int], plausibility: list[str], state: _LoadState,
                out: tuple[np.ndarray, np.ndarray]):
    """One row group (``where``: its number and first row), checked, its durations and key hashes written into
    ``out`` (the file's columns, :meth:`_ParquetColumns.group_out`); returns (its shard column, marked keys,
    part rows, trainer columns). Its key strings are not kept.
    Each reading thread opens the file once for all the row groups it reads (a pyarrow reader is not shared
    between threads; opening it parses the footer again)."""
    from shardkit.io.indexfile import check_durations, key_hashes, read_row_group

    group, start = where
    pf = _thread_reader(path)
    columns = ["shard", "key", "duration", *plausibility]
    if state.trainer:  # --wenet-conf: the filter's columns, in this same read (absent ones: the filter's error)
        from shardkit.wenet_conf.blocks import TRAINER_FIELDS

        extra = [*TRAINER_FIELDS, *(["members"] if state.want_txt else [])]
        columns += [c for c in extra if c not in columns and c in pf.schema_arrow.names]
    table = read_row_group(pf, path, group, columns, threads=False)  # this pool's threads decode in parallel
    durations_out, hashes_out = out
    try:
        d = table.column("duration").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        check_durations(d, path=path, first_row=start)
        if plausibility:
            _check_plausible(table, d, path, state)
        keys = table.column("key")
        marked = _repeat_like(keys)
        rows = None if state.part is None else _part_rows(state.row + start, table.num_rows, state.part)
        if rows is None:
            durations_out[:] = d
            key_hashes(keys, hashes_out, _scratch("hashing", len(keys), np.uint64))
            read = table.column("shard"), marked, None
        else:
            durations_out[:] = d[rows]
            key_hashes(keys.take(rows), hashes_out, _scratch("hashing", len(rows), np.uint64))
            read = table.column("shard").take(rows), marked, rows
    except (ValueError, TypeError) as err:
        raise _group_error(group, start, start + table.num_rows, err, path) from None
    return (*read, _trainer_columns(table, path, group, start, rows, state))


def _thread_reader(path: str):
    """The calling thread's reader of the Parquet index ``path`` (opened on its first row group; a pool's threads
    end with the file's read, and their readers with them)."""
    from shardkit.io.indexfile import open_parquet_index

    readers = getattr(_SCRATCH, "readers", None)
    if readers is None or path not in readers:
        readers = _SCRATCH.readers = {path: open_parquet_index(path)}  # the last file's reader closes
    return readers[path]


def _trainer_columns(table, path: str, group: int, start: int, rows: np.ndarray | None, state: _LoadState):
    """The trainer's filter columns of a row group's rows ``rows`` (None: all), when asked (else None)."""
    if not state.trainer:
        return None
    from shardkit.wenet_conf.blocks import table_trainer_block

    try:
        return table_trainer_block(table, path, start, state.want_txt, rows)
    except (ValueError, TypeError) as err:
        raise ShardkitError(f"row group {group} (rows {start}-{start + table.num_rows - 1}): {err}",
                            shard=path) from None


def _whole_integers(column) -> bool:
    """Whether a column is integers with no null (each value known and finite), in one chunk."""
    import pyarrow as pa

    return column.num_chunks == 1 and pa.types.is_integer(column.type) and not column.null_count


_SCRATCH = threading.local()  # per reading thread: arrays a row group's checks work in, reused by the next


def _scratch(name: str, n: int, dtype) -> np.ndarray:
    """The calling thread's scratch array ``name`` of ``n`` items (grown when a larger row group needs it):
    reused from row group to row group, so that its pages are faulted in once, not once a row group."""
    have = getattr(_SCRATCH, name, None)
    if have is None or len(have) < n or have.dtype != dtype:
        have = np.empty(n, dtype)
        setattr(_SCRATCH, name, have)
    return have[:n]


def _implausible_rows(durations: np.ndarray, rate: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Rows whose frames (seconds x a known rate) exceed what their bytes can hold: the float test of
    :func:`_check_plausible`, on integer columns with no nulls (each value known and finite), in scratch."""
    from shardkit.planning.plausible import MAX_FRAMES_PER_BYTE

    n = len(durations)
    frames, most = _scratch("frames", n, np.float64), _scratch("most", n, np.float64)
    over, known = _scratch("over", n, np.bool_), _scratch("known", n, np.bool_)
    np.multiply(durations, rate, out=frames)
    np.maximum(size, 0, out=most, casting="unsafe")  # the float path's values: the cast is monotone
    most *= MAX_FRAMES_PER_BYTE
    np.greater(frames, most, out=over)
    np.greater(rate, 0, out=known)
    over &= known
    return np.flatnonzero(over) if over.any() else np.zeros(0, np.int64)


def _check_plausible(table, durations: np.ndarray, path: str, state: _LoadState) -> None:
    """The first row whose seconds its bytes cannot hold (``planning.plausible``), as an error naming it."""
    from shardkit.planning.plausible import MAX_FRAMES_PER_BYTE

    rate_column, size_column = table.column("sample_rate"), table.column("bytes")
    if _whole_integers(rate_column) and _whole_integers(size_column):
        rate, size = rate_column.to_numpy(), size_column.to_numpy()
        bad = _implausible_rows(durations, rate, size)
    else:  # nulls (unknown rates or sizes) or floats: as floats, an unknown value never refuses a row
        rate = rate_column.to_numpy(zero_copy_only=False).astype(np.float64)
        size = size_column.to_numpy(zero_copy_only=False).astype(np.float64)
        known = np.isfinite(rate) & (rate > 0) & np.isfinite(size)
        bad = np.flatnonzero(known & (durations * rate > np.maximum(size, 0) * MAX_FRAMES_PER_BYTE))
    if len(bad):
        row = int(bad[0])
        why = impossible_duration(float(durations[row]), float(rate[row]), float(size[row]))
        state.refuse_impossible(table.column("key")[row].as_py(), table.column("shard")[row].as_py(), why, path)



def _read_jsonl(path: str, state: _LoadState):
    """(durations, shard ids, key hashes, line offsets, kept rows, records kept) of a JSON lines index; one
    line parsed at a time. With a part (``state.part``) only its lines are kept: the segment is those lines.

    The loop is the per-utterance hot path of a JSON lines load: its body stays in one piece (a call per
    line would cost more than the checks it would hide)."""
    from shardkit.io.indexfile import BATCH_ROWS, hash_strings, loads, open_index
    from shardkit.io.indexmarks import JsonlMarks

    durations, shard_col, offsets, keys, hashes = [], [], [], [], []
    shard_ids, shards = state.shard_ids, state.shards
    offset = number = 0
    marks = JsonlMarks(path)
    follow = marks.add
    trainer = state.record_trainer()  # --wenet-conf: the filter's fields of each record parsed here (no second read)
    with open_index(path) as f:
        for number, line in enumerate(f, 1):
            try:
                record = loads(line)
                shard, key, duration = record["shard"], record["key"], float(record["duration"])
                record["members"]
            except (ValueError, KeyError, TypeError):
                _refuse_unless_blank(line, path, number, marks)
                offset += len(line)
                continue
            follow(line)
            if (why := impossible_duration(duration, record.get("sample_rate"), record.get("bytes"))):
                state.refuse_impossible(key, shard, why, path)
            if REPEAT_MARK in key:
                state.repeat_like.add(key)
            state.row += 1
            skip = state.part is not None and (state.row - 1) % state.part[1] != state.part[0]
            if trainer is not None:
                trainer.add(record, path, number, not skip)
            if skip:
                offset += len(line)
                continue
            sid = shard_ids.get(shard)
            if sid is None:
                sid = shard_ids[shard] = len(shards)
                shards.append(shard)
            durations.append(duration)
            keys.append(key)
            shard_col.append(sid)
            offsets.append(offset)
            offset += len(line)
            if len(keys) >= BATCH_ROWS:
                hashes.append(hash_strings(keys))
                keys = []
    hashes.append(hash_strings(keys))
    state.marks[path] = marks.finish(number)
    return _jsonl_columns(state, trainer, (durations, shard_col, hashes, offsets))


def _refuse_unless_blank(line: bytes, path: str, number: int, marks) -> None:
    """A line that is not an index record: passed over if blank or a completeness mark (followed in ``marks``),
    else the precise error (ShardkitError)."""
    from shardkit.io.indexfile import parse_index_line

    if line.strip() and not marks.take(line, number):
        parse_index_line(line, path=path, number=number)  # raises the precise error
        raise ShardkitError(f"line {number} is not an index record", shard=path) from None


def _jsonl_columns(state: _LoadState, trainer, read: tuple) -> tuple:
    """What :func:`_read_jsonl` collected, as :func:`_read_parquet` returns it (the trainer's block kept)."""
    durations, shard_col, hashes, offsets = read
    if trainer is not None:
        state.trainer_parts.append(trainer.block())
    rows = np.arange(len(offsets), dtype=np.int64) if state.part is not None else None
    return (np.array(durations, np.float64), np.array(shard_col, np.int32), np.concatenate(hashes),
            np.array(offsets, np.int64), rows, len(offsets))


def line_refs(mix: MixColumns, work_dir: str) -> list[str]:
    """Fill every corpus' ``line_file``/``line_offset`` for writing; the index files the workers read.

    Workers read one record per planned utterance by its byte offset in a JSON lines file, so a
    Parquet index is first written out as JSON lines in ``work_dir`` (one streaming pass) and its
    rows' offsets recorded.
    """
    files = list(mix.index_files)
    lines: dict[int, np.ndarray] = {}  # a Parquet file's id -> its rows' offsets in its JSON lines copy
    for corpus in mix.corpora:
        if corpus.segments is not None:  # None: given as columns (line_file/line_offset set by the caller)
            _corpus_refs(corpus, files, lines, work_dir)
    return files


def _corpus_refs(corpus: CorpusColumns, files: list[str], lines: dict[int, np.ndarray], work_dir: str) -> None:
    """One corpus' ``line_file``/``line_offset``: its Parquet segments written out as JSON lines once."""
    file_col, offset_col = [], []
    for seg in corpus.segments:
        if seg.offsets is None and seg.file_id not in lines:
            files[seg.file_id], lines[seg.file_id] = _records_as_jsonl(seg, work_dir)
        file_col.append(np.full(seg.count, seg.file_id, np.int64))
        offset_col.append(seg.offsets if seg.offsets is not None else lines[seg.file_id])
    corpus.line_file = np.concatenate(file_col) if file_col else np.zeros(0, np.int64)
    corpus.line_offset = np.concatenate(offset_col) if offset_col else np.zeros(0, np.int64)
    if corpus.rows is not None:  # a filtered corpus: the refs of the rows it kept
        corpus.line_file, corpus.line_offset = corpus.line_file[corpus.rows], corpus.line_offset[corpus.rows]


def _records_as_jsonl(seg: _Segment, work_dir: str) -> tuple[str, np.ndarray]:
    """A Parquet segment's records written out as JSON lines in ``work_dir`` (one streaming pass): the file,
    and each row's byte offset in it."""
    from shardkit.io.indexfile import dumps_line, iter_parquet_records

    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, f"records-{seg.file_id}.jsonl")
    offsets = np.zeros(seg.count, np.int64)
    position = 0
    with open(path, "wb") as out:
        for row, record in enumerate(iter_parquet_records(seg.path)):
            line = dumps_line(record)
            offsets[row] = position
            position += len(line)
            out.write(line)
    return path, offsets
