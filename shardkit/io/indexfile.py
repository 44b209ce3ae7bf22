"""Index files: JSON lines (``.jsonl``) and columnar Parquet (``.parquet``), read and written here.

``index``, ``convert``, ``make`` and ``balance`` all use this module, so that none of them imports
another command. A record is one utterance (see ``shardkit.commands.index`` for the fields).

**The Parquet index** holds one row per utterance with typed columns, so a planner reads the
columns it needs straight into numpy arrays (no per-utterance Python object)::

    corpus      dictionary<int32, string>    shard       dictionary<int32, string>
    key         string                       audio       string (the audio member, key-relative)
    format      string                       bytes       int64
    sample_rate int32                        channels    int16
    frames      int64                        duration    float64 (seconds)
    text_chars  int32                        members     list<struct<name: string (key-relative),
                                                                      offset: int64, size: int64>>
    text        string, nullable (the transcript, when it is inline: see below)

Member names are stored relative to the key (``.wav`` for ``spk/utt1.wav`` of key ``spk/utt1``),
so Parquet's dictionary encoding makes them nearly free; a name that does not start with its
key is stored whole behind a NUL (``"\\0other.wav"``, NUL never occurs in a tar name).
Optional fields are null when a record lacks them. **Inline text**: a record read from a NeMo
tarred dataset or a Shar folder carries its transcript in ``text`` (the manifest line's, the
supervision's) and ``members`` holds only its audio member, whose name need not start with the key
(NeMo's ``spk_utt1.wav`` for key ``spk/utt1``); a writer makes the text member from ``text``. The
schema and rows live in ``shardkit.io.indexparquet``. Rows are written in row groups of
``ROW_GROUP_ROWS``, zstd-compressed: about 30-40 bytes an utterance on disk.

**JSON lines** stay readable and writable (one sorted-keys object per line, between the head and end
lines of the completeness marks: ``shardkit.io.indexmarks``, which every reader here follows). Converting a JSON
lines index to Parquet (:func:`convert_index`) streams ``BATCH_ROWS`` lines at a time and opens
no shard; it accepts every line ``balance`` accepts: ``shard``, ``key``, ``duration`` and
``members`` required, ``member`` as another name for ``audio`` and ``text_len`` for
``text_chars``; unknown fields are dropped. pyarrow is the ``parquet`` extra: without it, JSON
lines work and asking for a ``.parquet`` is a UsageError that says what to install.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Iterable, Iterator

import numpy as np

from shardkit.errors import ShardkitError, UsageError
from shardkit.io.indexmarks import IndexMarks, JsonlMarks, SegmentWriter, head_line, parquet_marks, parquet_metadata
from shardkit.io.indexparquet import (  # noqa: F401 - schema, records_to_batch and require_pyarrow stay
    open_parquet_writer,  # importable from here for callers outside the package (benchmarks, tests)
    record_of_row,
    records_to_batch,
    require_pyarrow,
    schema,
)

try:  # orjson parses index lines ~3x faster than json, which matters for millions of lines
    import orjson

    loads = orjson.loads

    def dumps_line(obj) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS) + b"\n"
except ImportError:  # pragma: no cover - the fallback keeps the format identical
    import json

    loads = json.loads

    def dumps_line(obj) -> bytes:
        return (json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")

JSONL_SUFFIX = ".jsonl"
PARQUET_SUFFIX = ".parquet"
REQUIRED_FIELDS = ("shard", "key", "duration", "members")
ROW_GROUP_ROWS = 1 << 18
BATCH_ROWS = 1 << 16
ALIASES = {"member": "audio", "text_len": "text_chars"}  # what other tools call our fields


def is_index_file(path: str) -> bool:
    return path.endswith(JSONL_SUFFIX) or path.endswith(PARQUET_SUFFIX)


def is_parquet(path: str) -> bool:
    return path.endswith(PARQUET_SUFFIX)


# --- JSON lines -----------------------------------------------------------------------------------


def open_index(path: str):
    """An index file opened for reading bytes; a failure is a UsageError naming it."""
    try:
        return open(path, "rb", buffering=1 << 20)
    except OSError as err:
        raise UsageError(f"cannot open index ({err.strerror or err})", shard=path) from None


def parse_index_line(line: bytes, *, path: str, number: int) -> dict:
    """One JSON line as a record (aliases renamed); an error names the file and line."""
    try:
        record = loads(line)
    except ValueError as err:
        raise ShardkitError(f"line {number} is not valid JSON ({err})", shard=path) from None
    if not isinstance(record, dict) or any(k not in record for k in REQUIRED_FIELDS):
        raise ShardkitError(f"line {number} is not an index record (needs {', '.join(REQUIRED_FIELDS)})", shard=path)
    for alias, name in ALIASES.items():
        if alias in record and name not in record:
            record[name] = record.pop(alias)
    return record


def check_record(record: dict, *, path: str, number: int) -> dict:
    """The field types a Parquet row needs; a bad one is an error naming the file, line and field."""
    problem = _record_problem(record)
    if problem is not None:
        field, why = problem
        raise ShardkitError(f"line {number}: field {field!r} {why} (got {record.get(field)!r:.80})", shard=path)
    return record


def _record_problem(record: dict) -> tuple[str, str] | None:
    """The first bad field of ``record`` and why, or None; normalises as it checks (duration to a float,
    a whole float count to an int)."""
    for field in ("shard", "key"):
        if not isinstance(record[field], str) or not record[field]:
            return field, "must be a non-empty string"
    duration = _seconds(record["duration"])
    if duration is None:
        return "duration", "must be a finite number of seconds >= 0"
    record["duration"] = duration
    if not _member_triples(record["members"]):
        return "members", "must be a list of [name, offset, size] (offset and size integers >= 0)"
    for field in ("corpus", "audio", "format", "text"):
        if record.get(field) is not None and not isinstance(record[field], str):
            return field, "must be a string"
    return _count_problem(record)


def _seconds(value) -> float | None:
    """A duration as balance takes it (``float(duration)``: a number, or a string of one), if finite and >= 0."""
    try:
        duration = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None
    return duration if duration is not None and math.isfinite(duration) and duration >= 0 else None


def _member_triples(members) -> bool:
    """Whether ``members`` is a list of [name, offset, size] with integer offset and size >= 0."""
    return isinstance(members, list) and all(
        isinstance(m, list) and len(m) == 3 and isinstance(m[0], str) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in m[1:]) for m in members)


def _count_problem(record: dict) -> tuple[str, str] | None:
    """The first count field that is not an integer >= 0 (a whole float is made an int first), or None."""
    for field in ("bytes", "sample_rate", "channels", "frames", "text_chars"):
        value = record.get(field)
        if isinstance(value, float) and value.is_integer():
            value = record[field] = int(value)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            return field, "must be an integer >= 0"
    return None


def iter_jsonl(path: str, marks: JsonlMarks | None = None) -> Iterator[dict]:
    """Records of a JSON lines index, in order; a damaged line is an error naming the file and line, and
    so is a file cut short (its completeness marks: ``shardkit.io.indexmarks``, followed in ``marks``)."""
    marks = marks or JsonlMarks(path)
    number = 0
    with open_index(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip() and not marks.take(line, number):
                marks.add(line)
                yield parse_index_line(line, path=path, number=number)
    marks.finish(number)


# --- Parquet --------------------------------------------------------------------------------------


class ParquetIndexWriter:
    """Rows appended in order into an open binary file, ``ROW_GROUP_ROWS`` to a row group."""

    def __init__(self, file):
        self._writer = open_parquet_writer(file)
        self._pending: list[dict] = []
        self.rows = 0

    def write(self, records: Iterable[dict]) -> None:
        start = len(self._pending)
        self._pending.extend(records)
        self.rows += len(self._pending) - start
        while len(self._pending) >= ROW_GROUP_ROWS:
            self._flush(self._pending[:ROW_GROUP_ROWS])
            del self._pending[:ROW_GROUP_ROWS]

    def _flush(self, records: list[dict]) -> None:
        import pyarrow as pa

        if records:
            batches = [records_to_batch(records[i:i + BATCH_ROWS]) for i in range(0, len(records), BATCH_ROWS)]
            self._writer.write_table(pa.Table.from_batches(batches), row_group_size=ROW_GROUP_ROWS)

    def close(self, sources: dict | None = None) -> None:
        """The last rows, and the footer with the completeness mark and ``sources``' stamps (None: unknown)."""
        self._flush(self._pending)
        self._pending = []
        self._writer.add_key_value_metadata(parquet_metadata(self.rows, sources))
        self._writer.close()

    def abandon(self) -> None:
        """Close without the pending rows (the file is being discarded), so nothing writes to it later."""
        self._pending = []
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - the file is thrown away; its error is not the one to report
            pass


class IndexWriter:
    """Records into an index file of either kind (the suffix chooses), over an open binary file, with its
    completeness marks and ``sources``' stamps (``shardkit.io.indexmarks``; None: not known)."""

    def __init__(self, path: str, file, sources: dict | None = None):
        self.parquet = is_parquet(path)
        self._file = file
        self._parquet = ParquetIndexWriter(file) if self.parquet else None
        self._segment = SegmentWriter(sources)
        if self._parquet is None:
            file.write(head_line())

    def write(self, records: list[dict]) -> None:
        if self._parquet is not None:
            self._parquet.write(records)
        else:
            data = b"".join(dumps_line(r) for r in records)
            self._segment.add(data, len(records))
            self._file.write(data)

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close(self._segment.sources)
        else:
            self._file.write(self._segment.end_line())

    def abandon(self) -> None:
        """The file is being discarded: the Parquet writer is closed now, so that its ``__del__`` never writes
        to the closed file later ("Exception ignored in ParquetWriter.__del__ ... write to closed file")."""
        if self._parquet is not None:
            self._parquet.abandon()


def open_parquet_index(path: str):
    """A pyarrow ParquetFile with the required columns; a damaged or foreign file is an error naming it."""
    pq = require_pyarrow()
    try:
        pf = pq.ParquetFile(path, read_dictionary=["shard", "corpus"])
    except FileNotFoundError:
        raise UsageError("no such index file", shard=path) from None
    except Exception as err:  # pyarrow raises ArrowInvalid/OSError for a truncated or damaged file
        raise ShardkitError(f"not a readable Parquet index: cut short (a copy that stopped early?) or damaged "
                            f"({err})", shard=path) from None
    names = pf.schema_arrow.names
    missing = [c for c in REQUIRED_FIELDS if c not in names]
    if missing:
        raise ShardkitError(f"is not a shardkit index (no {', '.join(missing)} column; columns: "
                            f"{', '.join(names)})", shard=path)
    return pf


def _group_rows(pf, group: int) -> tuple[int, int]:
    start = sum(pf.metadata.row_group(g).num_rows for g in range(group))
    return start, start + pf.metadata.row_group(group).num_rows


def read_row_group(pf, path: str, group: int, columns: list[str], *, threads: bool = True):
    """One row group's columns as a pyarrow Table; damage is an error naming the file, group and rows.
    ``threads=False``: its columns decoded in the calling thread (a caller reading row groups in threads of
    its own: pyarrow's pool would only add hand-offs)."""
    try:
        return pf.read_row_group(group, columns=columns, use_threads=threads)
    except Exception as err:
        start, stop = _group_rows(pf, group)
        raise ShardkitError(f"row group {group} (rows {start}-{stop - 1}) cannot be read ({err})",
                            shard=path) from None


def check_durations(durations: np.ndarray, *, path: str, first_row: int) -> None:
    """Null (NaN), negative or infinite durations are an error naming the first such row."""
    bad = ~np.isfinite(durations) | (durations < 0)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ShardkitError(f"row {first_row + row}: duration must be a finite number >= 0 (got "
                            f"{durations[row]})", shard=path)


def dictionary_codes(column, names: list[str], ids: dict[str, int]) -> np.ndarray:
    """int32 ids (into ``names``, extended with new values) of a dictionary-encoded column."""
    import pyarrow as pa

    out = []
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        if chunk.null_count:
            raise ValueError("a null value")
        mapping = np.empty(len(chunk.dictionary), np.int32)
        for i, value in enumerate(chunk.dictionary.to_pylist()):
            if value not in ids:
                ids[value] = len(names)
                names.append(value)
            mapping[i] = ids[value]
        out.append(mapping[chunk.indices.to_numpy(zero_copy_only=False)])
    return np.concatenate(out) if out else np.zeros(0, np.int32)


def iter_parquet_records(path: str, rows: np.ndarray | None = None) -> Iterator[dict]:
    """Records (JSON-lines shaped dicts) of a Parquet index, in row order; ``rows`` (sorted): only those."""
    pf = open_parquet_index(path)
    names = pf.schema_arrow.names
    start = 0
    for group in range(pf.num_row_groups):
        count = pf.metadata.row_group(group).num_rows
        if rows is not None:
            lo, hi = np.searchsorted(rows, [start, start + count])
            if lo == hi:
                start += count
                continue
        table = read_row_group(pf, path, group, names)
        if rows is not None:
            table = table.take(rows[lo:hi] - start)
        for record in table.to_pylist():
            yield record_of_row(record)
        start += count


def iter_index(path: str, marks: JsonlMarks | None = None) -> Iterator[dict]:
    """Records of an index file of either kind, in order (a JSON lines file's marks followed in ``marks``;
    a Parquet file's: :func:`index_marks`)."""
    return iter_parquet_records(path) if is_parquet(path) else iter_jsonl(path, marks)


def index_marks(path: str) -> IndexMarks:
    """The completeness marks and source stamps of an index file (a JSON lines file is read through;
    a record that does not parse, a file cut short or a row count that differs is an error naming it)."""
    if is_parquet(path):
        return parquet_marks(path, open_parquet_index(path))
    marks = JsonlMarks(path)
    for _ in iter_jsonl(path, marks):
        pass
    return marks.marks


def convert_index(src: str, file, *, on_rows=None) -> int:
    """Stream the JSON lines index ``src`` into a Parquet index on the open binary ``file``; rows written.

    Opens no shard: every line is taken as given (paths may be relative or absent here), its field
    types checked; memory stays at one row group.
    """
    writer = ParquetIndexWriter(file)
    try:
        return _convert_lines(src, writer, on_rows)
    except BaseException:
        writer.abandon()
        raise


def _convert_lines(src: str, writer: "ParquetIndexWriter", on_rows) -> int:
    """The lines of ``src`` into ``writer``, its source stamps carried over (a file cut short is refused)."""
    batch: list[dict] = []
    rows = number = 0
    marks = JsonlMarks(src)
    with open_index(src) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or marks.take(line, number):
                continue
            marks.add(line)
            batch.append(check_record(parse_index_line(line, path=src, number=number), path=src, number=number))
            if len(batch) >= BATCH_ROWS:
                writer.write(batch)
                rows += len(batch)
                if on_rows:
                    on_rows(len(batch))
                batch = []
    writer.write(batch)
    rows += len(batch)
    if on_rows and batch:
        on_rows(len(batch))
    found = marks.finish(number)
    writer.close(found.sources if found.marked and not found.unmarked_rows else None)
    return rows


# --- key hashes: duplicate keys found without a Python string per utterance -----------------------

_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [(1 << 64) - 1], np.uint64)
_K0, _K1 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)


def key_hashes(keys, out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
    """A 64-bit hash per string of a pyarrow string array (or chunked array): equal keys, equal hashes.

    Eight bytes at a time through a byte-strided uint64 view of the array's data, so the cost is a
    few numpy passes per 8 bytes of key. A collision is possible (about 2^-64 a pair): callers
    compare the strings themselves before reporting a duplicate. ``out``: where to write them (a
    loader's final column), ``scratch``: a uint64 array of at least ``len(keys)`` to work in (a loader's
    own, reused: no fresh arrays per row group, whose pages would be faulted in again).
    """
    import pyarrow as pa

    out = np.empty(len(keys), np.uint64) if out is None else out
    if isinstance(keys, pa.ChunkedArray):
        at = 0
        for chunk in keys.chunks:
            _hash_array(chunk, out[at:at + len(chunk)], scratch)
            at += len(chunk)
        return out
    return _hash_array(keys, out, scratch)


def _hash_array(keys, out: np.ndarray, scratch: np.ndarray | None) -> np.ndarray:
    """:func:`key_hashes` of one pyarrow string array, into ``out``."""
    import pyarrow as pa

    if pa.types.is_large_string(keys.type):
        keys = keys.cast(pa.string())
    n = len(keys)
    if n == 0:
        return out
    if keys.null_count:
        raise ValueError("a null key")
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32)[keys.offset:keys.offset + n + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    first, length = int(offsets[0]), int(offsets[1] - offsets[0])
    if length > 0 and int(offsets[-1]) - first == n * length and (np.diff(offsets) == length).all():
        _hash_fixed(data[first:first + n * length], n, length, out,
                    np.empty(n, np.uint64) if scratch is None else scratch[:n])
        return out
    offsets = offsets.astype(np.int64)
    out[:] = _hash_buffer(data[offsets[0]:offsets[-1]], offsets - offsets[0])
    return out


def hash_strings(keys: list[str]) -> np.ndarray:
    """:func:`key_hashes` of a list of Python strings (the same hash, without pyarrow)."""
    encoded = [k.encode("utf-8", "surrogateescape") for k in keys]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    if not encoded:
        return np.zeros(0, np.uint64)
    return _hash_buffer(np.frombuffer(b"".join(encoded), np.uint8), offsets)


def _hash_buffer(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    lengths = offsets[1:] - offsets[:-1]
    if len(lengths) and lengths[0] > 0 and (lengths == lengths[0]).all():
        n = len(lengths)
        return _hash_fixed(data, n, int(lengths[0]), np.empty(n, np.uint64), np.empty(n, np.uint64))
    data = np.concatenate([data, np.zeros(8, np.uint8)])
    starts = offsets[:-1]
    windows = np.ndarray(shape=(len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    h = (lengths.astype(np.uint64) + np.uint64(1)) * _K0
    last = len(windows) - 1
    for j in range(0, int(lengths.max()) if len(lengths) else 0, 8):
        word = windows[np.minimum(starts + j, last)] & _MASKS[np.clip(lengths - j, 0, 8)]
        mixed = (h ^ word) * _K1
        mixed ^= mixed >> np.uint64(29)
        h = np.where(lengths > j, mixed, h)  # a key's hash must not depend on the longest key beside it
    return h


def _hash_fixed(data: np.ndarray, n: int, length: int, h: np.ndarray, shifted: np.ndarray) -> np.ndarray:
    """:func:`_hash_buffer` of ``n`` keys of ``length`` bytes each (the usual case: generated and many
    corpora's keys have one width), written into ``h`` (``shifted``: scratch of the same size): each 8-byte
    word read in place through a view strided by the key width (no padded copy of the keys), the same hashes."""
    words = -(-length // 8)
    h[:] = length + 1
    h *= _K0  # (in an array: uint64 products wrap, as in _hash_buffer)
    for j in range(words):
        word = _word_column(data, n, length, j, shifted)
        h ^= word
        h *= _K1
        np.right_shift(h, np.uint64(29), out=shifted)
        h ^= shifted
    return h


def _word_column(data: np.ndarray, n: int, length: int, j: int, scratch: np.ndarray) -> np.ndarray:
    """Word ``j`` (bytes 8j..8j+7, zero past the key's end) of each of ``n`` keys of ``length`` bytes packed
    in ``data``: a strided view of the data where the word is whole, else masked into ``scratch``."""
    at, tail = 8 * j, length - 8 * j
    # keys whose 8 bytes from ``at`` lie within the data (a last partial word reads into the next key's bytes,
    # masked off; the final keys' words would read past the data's end and are padded by hand)
    inside = min(n, max(0, (len(data) - at - 8) // length + 1))
    view = np.ndarray(shape=(inside,), dtype="<u8", buffer=data, offset=at, strides=(length,))
    if tail >= 8:
        if inside == n:
            return view
        scratch[:inside] = view
    else:
        np.bitwise_and(view, _MASKS[tail], out=scratch[:inside])
    for k in range(inside, n):
        word = np.zeros(8, np.uint8)
        word[:min(tail, 8)] = data[k * length + at:k * length + at + min(tail, 8)]
        scratch[k] = word.view("<u8")[0]
    return scratch


def duplicate_hashes(hashes: np.ndarray, *, is_sorted: bool = False) -> np.ndarray:
    """Hash values that occur more than once (sorted)."""
    ordered = hashes if is_sorted else np.sort(hashes)
    return np.unique(ordered[1:][ordered[1:] == ordered[:-1]])


def shard_sizes_of(path: str, shard_ids: dict[str, int], utts: np.ndarray, secs: np.ndarray) -> set[str]:
    """Add a Parquet index's utterances and seconds per shard into ``utts``/``secs`` (by ``shard_ids``);
    the shards it covers. Vectorised: one bincount per row group."""
    pf = open_parquet_index(path)
    seen: set[str] = set()
    start = 0
    for group in range(pf.num_row_groups):
        table = read_row_group(pf, path, group, ["shard", "duration"])
        durations = table.column("duration").to_numpy(zero_copy_only=False).astype(np.float64)
        check_durations(durations, path=path, first_row=start)
        names: list[str] = []
        codes = dictionary_codes(table.column("shard"), names, {})
        where = np.array([shard_ids.get(s, -1) for s in names], np.int64)[codes]
        mine = where >= 0
        seen.update(s for s in names if s in shard_ids)
        utts += np.bincount(where[mine], minlength=len(utts))
        secs += np.bincount(where[mine], weights=durations[mine], minlength=len(secs))
        start += table.num_rows
    return seen


def write_index_file(path: str, records: Iterable[list[dict]]) -> str:
    """Write an index (either kind) atomically from batches of records; the path."""
    from shardkit.io.files import AtomicFile

    path = os.path.abspath(path)
    with AtomicFile(path, buffering=1 << 20) as out:
        writer = IndexWriter(path, out.file)
        try:
            for batch in records:
                writer.write(batch)
            writer.close()
        except BaseException:
            writer.abandon()
            raise
        out.commit()
    return path


# --- the index as a by-product of writing shards (convert, make) --------------------------------

SIDE_DIR = ".index"  # beside the written shards: one JSON lines part per shard, assembled at the end
BY_PRODUCT = "index.parquet"


class ShardRecords:
    """Index records of a shard as it is written: each member added in order with its data offset.

    ``data`` is the member's bytes (None for one streamed through without being held). The first
    utterance that cannot be indexed (no audio or transcript, unreadable audio header, a streamed
    audio member) sets ``error`` and stops the collection: no part is better than a wrong one.
    """

    def __init__(self, shard: str, corpus: str, *, enabled: bool = True):
        self.shard, self.corpus = shard, corpus
        self.records: list[dict] = []
        self.error: str | None = None
        self.enabled = enabled
        self._key: str | None = None
        self._members: list[tuple[str, int, int, bytes | None]] = []
        self._audio_facts: dict[str, dict] = {}  # audio members whose facts the writer knows (see add_written)

    @classmethod
    def for_shard(cls, dst: str) -> "ShardRecords":
        """The records of a shard being written to ``dst``; corpus = its folder's name, as ``index`` names it.
        A shard written to a URL gets no part (the part folder is local)."""
        from shardkit.io.remote import is_local

        return cls(dst, os.path.basename(os.path.dirname(dst)) or "corpus", enabled=is_local(dst))

    def add_written(self, offset_after: int, name: str, data: bytes | None, size: int,
                    audio_facts: dict | None = None) -> None:
        """A member just added to a TarWriter now at ``offset_after`` (its data ends, padded, there).

        ``audio_facts`` (format, sample_rate, channels, frames) of an audio member its writer has just encoded and
        proven (convert's transcoding: libFLAC's verify mode checked every frame and STREAMINFO's rate, channels,
        width and length): its record takes them instead of parsing the header that was just written."""
        if audio_facts is not None:
            self._audio_facts[name] = audio_facts
        self.add(name, offset_after - size - (-size % 512), data, size)

    def save(self) -> str | None:
        """Write the shard's part (or remove a stale one if it could not be indexed); the reason if not."""
        if self.enabled:
            write_side_part(self.shard, self.finish())
        return self.error

    def add(self, name: str, offset: int, data: bytes | None, size: int) -> None:
        from shardkit.io.tar import split_key

        if self.error is not None or not self.enabled:
            return
        key = split_key(name)[0]
        if key != self._key:
            self._close_utterance()
            self._key = key
        self._members.append((name, offset, size, data))

    def finish(self) -> list[dict] | None:
        self._close_utterance()
        return None if self.error is not None else self.records

    def _close_utterance(self) -> None:
        if self._key is None or self.error is not None:
            return
        try:
            self.records.append(self._record(self._key, self._members))
        except (ShardkitError, UnicodeDecodeError, ValueError) as err:
            self.error = f"{self.shard}: utterance {self._key!r} not indexed ({err})"
        self._key, self._members = None, []

    def _record(self, key: str, members: list) -> dict:
        from shardkit.io.audio import probe

        audio_name, audio, text = _audio_and_text(key, members)
        known = self._audio_facts.pop(audio_name, None)
        info = probe(audio) if known is None else {**known, "duration": known["frames"] / known["sample_rate"]}
        return {"shard": self.shard, "key": key, "corpus": self.corpus, "audio": audio_name, "format": info["format"],
                "bytes": sum(m[2] for m in members), "sample_rate": info["sample_rate"], "channels": info["channels"],
                "frames": info["frames"], "duration": round(info["duration"], 6),
                "text_chars": len(text.decode("utf-8")), "members": [[n, o, z] for n, o, z, _ in members]}


def _audio_and_text(key: str, members: list) -> tuple[str, bytes, bytes]:
    """(audio member's name, its bytes, the transcript's bytes) of one utterance's (name, offset, size, data)
    members; ValueError when either is missing or was streamed through without being held."""
    from shardkit.io.tar import AUDIO_EXTENSIONS

    by_ext = {name[len(key) + 1:]: (name, data, size) for name, _, size, data in members}
    audio_ext = next((e for e in by_ext if e.lower() in AUDIO_EXTENSIONS), None)
    if audio_ext is None or "txt" not in by_ext:
        raise ValueError("no audio member" if audio_ext is None else "no .txt transcript")
    audio_name, audio, _ = by_ext[audio_ext]
    text = by_ext["txt"][1]
    if audio is None or text is None:
        raise ValueError("a member streamed through without being held")
    return audio_name, audio, text


def side_part(shard: str) -> str:
    """Where the index part of a written shard goes: ``<folder>/.index/<shard name>.jsonl``."""
    folder, name = os.path.split(shard)
    return os.path.join(folder, SIDE_DIR, name + JSONL_SUFFIX)


def with_side_parts(outputs) -> list[str]:
    """``outputs`` and the index part of each local one: what ``remove_leftovers`` looks for, so that a
    ``.index/.<shard>.jsonl.<hex>.partial`` a killed run left is removed with the shard's own temporary file."""
    from shardkit.io.remote import is_local

    outputs = list(outputs)
    return outputs + [side_part(path) for path in outputs if is_local(path)]


def write_side_part(shard: str, records: list[dict] | None) -> None:
    """Write (or, when the shard could not be indexed, remove) a shard's index part, atomically."""
    from shardkit.io.files import atomic_write_bytes

    path = side_part(shard)
    if records is None:
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_bytes(path, b"".join(dumps_line(r) for r in records))


def assemble_index(out_path: str, shards: list[str]) -> tuple[str | None, str | None]:
    """The index of ``shards`` (in order) from their parts, as ``out_path``: (path, None) or (None, why not).

    Streams part by part into the Parquet writer (one row group in memory). Without pyarrow, or
    when a shard has no part (it could not be indexed while written, or an older run wrote it),
    no index is written and the reason says how to build one.
    """
    try:
        require_pyarrow("the index written beside data.list")
    except UsageError as err:
        return None, str(err)
    missing = next((s for s in shards if not os.path.exists(side_part(s))), None)
    if missing is not None:
        return None, (f"no index part for {missing} (see its entry, or run `shardkit index` on data.list)")
    from shardkit.io.files import AtomicFile
    from shardkit.io.indexmarks import stamp_files

    sources = stamp_files(shards)  # the shards were written and renamed before: these are their bytes
    with AtomicFile(out_path, buffering=1 << 20) as out:
        writer = ParquetIndexWriter(out.file)
        try:
            for shard in shards:
                writer.write(list(iter_jsonl(side_part(shard))))
            writer.close(sources)
        except BaseException:
            writer.abandon()
            raise
        out.commit()
    return out_path, None


def index_name_beside(data_list: str) -> str:
    """Where the index of a list goes: ``data.list`` -> ``index.parquet``, ``data.slice-2-of-3.list`` ->
    ``index.slice-2-of-3.parquet``, ``data.partial.list`` -> ``index.partial.parquet``."""
    folder, name = os.path.split(data_list)
    stem = name[:-len(".list")] if name.endswith(".list") else name
    return os.path.join(folder, "index" + stem[len("data"):] + PARQUET_SUFFIX)


def concatenate_indexes(out_path: str, parts: list[str]) -> int:
    """Write the rows of the Parquet indexes ``parts``, in order, as one index ``out_path`` (atomically);
    rows written. Streams a row group at a time (what ``merge-reports`` does with the slices' indexes)."""
    from shardkit.io.files import AtomicFile
    from shardkit.io.indexmarks import merged_sources

    rows = 0
    found = []
    with AtomicFile(out_path, buffering=1 << 20) as out:
        writer = open_parquet_writer(out.file)
        try:
            for part in parts:
                pf = open_parquet_index(part)
                found.append(parquet_marks(part, pf))
                for group in range(pf.num_row_groups):
                    table = read_row_group(pf, part, group, pf.schema_arrow.names)
                    writer.write_table(table.cast(writer.schema) if table.schema != writer.schema
                                       else table, row_group_size=ROW_GROUP_ROWS)
                    rows += table.num_rows
            marked = all(m.marked for m in found)
            writer.add_key_value_metadata(parquet_metadata(rows, merged_sources(found) if marked else None))
        except BaseException:
            try:  # the file is discarded: its footer's error (a full disk again) is not the one to report
                writer.close()
            except Exception:  # noqa: BLE001
                pass
            raise
        writer.close()
        out.commit()
    return rows


def index_beside(data_list: str, listed: list[str]) -> tuple[str | None, str | None]:
    """``index.parquet`` beside ``data.list`` (``index.slice-I-of-N.parquet`` beside a slice's list) of
    the listed shards, from the parts written with them: (path, None) or (None, why not). Never
    raises: the shards are written whatever becomes of their index."""
    from shardkit.io.remote import is_local

    if not is_local(data_list):
        return None, None  # the parts of shards written to a URL are not kept
    _remove_other_index(data_list)
    try:
        return assemble_index(index_name_beside(data_list), listed)
    except (ShardkitError, OSError) as err:
        return None, f"index not written ({err})"


def _remove_other_index(data_list: str) -> None:
    """The index of the other list goes, as ``publish_list`` removes the other list: beside a complete
    ``data.list``, an ``index.partial.parquet`` of an earlier failed run; beside ``data.partial.list``, an
    ``index.parquet`` that may list shards this run failed."""
    from shardkit.io.files import partial_list_path

    folder, name = os.path.split(data_list)
    stem, dot, ext = name.rpartition(".")
    if stem.endswith(".partial"):
        other = os.path.join(folder, f"{stem[:-len('.partial')]}.{ext}")
    else:
        other = partial_list_path(data_list)
    try:
        os.unlink(index_name_beside(other))
    except FileNotFoundError:
        pass
    except OSError as err:
        print(f"shardkit: note: could not remove the stale index {index_name_beside(other)}: {err}", file=sys.stderr)
