"""Completeness marks and source stamps of index files: whether an index is whole, and whether the shards
it describes are still the bytes it was built from.

An index is a promise about other files (offsets and durations of members of shards), made at one
moment. Two things break it silently: a copy of the index that stopped early (a JSON lines file cut at
a line boundary parses fine and just has fewer utterances), and a shard rewritten after it was indexed
(balance would copy the new bytes at the old offsets). So every index shardkit writes says how many
rows it holds and, per source shard, its **stamp**: size, ``mtime_ns`` and a cheap digest (BLAKE2b of
the size and the first and last ``STAMP_BYTES``), taken before the shard was read.

**JSON lines**: a segment is framed by two mark lines, ``{"shardkit_index": {"format": 1, "part":
"head"}}`` first and ``{"shardkit_index": {"format": 1, "part": "end", "rows": N, "blake2b": ...,
"sources": {shard: stamp}}}`` last, where ``blake2b`` digests the segment's record lines as written.
The slices of ``index --split`` are one segment each, so their concatenation is a file of segments
that checks the same way. A head without its end (the file stops early), a count or digest that
differs (lines dropped or edited) are errors naming the file and line. Mark lines are not records:
every reader of shardkit skips them.

**Parquet**: the footer (which a cut file lacks: pyarrow refuses it) holds the key-value metadata
``shardkit_index``: ``{"format": 1, "rows": N, "sources": {shard: stamp}}``, ``rows`` checked against
the row count of the footer.

An index without marks (written before they existed, or by another tool) still loads; its readers
say it cannot be checked. ``sources`` is None when what the index was built from is not known (a
JSON lines index without stamps rewritten as Parquet).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Iterable

from shardkit.errors import ShardkitError

MARK = "shardkit_index"
FORMAT = 1
STAMP_BYTES = 1 << 16
PARQUET_KEY = MARK.encode()
_MARK_PREFIX = b'{"' + MARK.encode() + b'":'


def _digest():
    return hashlib.blake2b(digest_size=16)


# --- source stamps --------------------------------------------------------------------------------


def stamp_file(path: str) -> dict | None:
    """``{"size", "mtime_ns", "digest"}`` of a local file, or None (a URL, a pipe, a file not there)."""
    try:
        if not os.path.isfile(path):  # never open a pipe or a device: it could block or be consumed
            return None
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "digest": _content_digest(f, st.st_size)}
    except (OSError, ValueError):
        return None


def _content_digest(f, size: int) -> str:
    """BLAKE2b of the size, the first and the last ``STAMP_BYTES`` (the whole file when it is smaller)."""
    h = _digest()
    h.update(size.to_bytes(8, "little"))
    h.update(f.read(STAMP_BYTES))
    if size > STAMP_BYTES:
        f.seek(max(STAMP_BYTES, size - STAMP_BYTES))
        h.update(f.read(STAMP_BYTES))
    return h.hexdigest()


def stamp_files(paths: Iterable[str]) -> dict[str, dict]:
    """The stamp of each local file of ``paths`` (others have none), a few read at once."""
    from concurrent.futures import ThreadPoolExecutor

    unique = list(dict.fromkeys(paths))
    with ThreadPoolExecutor(max(1, min(8, len(unique)))) as pool:
        stamps = list(pool.map(stamp_file, unique))
    return {path: stamp for path, stamp in zip(unique, stamps) if stamp is not None}


def stamp_change(path: str, recorded: dict, *, digest: bool = True) -> str | None:
    """What changed in ``path`` since ``recorded`` was taken ("size 100 -> 120", "mtime ..., digest
    ..."), or None when size, mtime and digest are as recorded. ``digest=False``: a stat only (no byte
    read), unless size or mtime differ (then the digest is reported too)."""
    if not digest and _same_stat(path, recorded):
        return None
    now = stamp_file(path)
    if now is None:
        return "it is gone or cannot be read"
    changes = [f"{name} {recorded.get(name)} -> {now[name]}" for name in ("size", "mtime_ns", "digest")
               if recorded.get(name) != now[name]]
    if changes and now["digest"] == recorded.get("digest") and now["size"] == recorded.get("size"):
        changes.append("digest of its first and last 64 KiB unchanged")
    return "; ".join(changes) or None


def _same_stat(path: str, recorded: dict) -> bool:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return st.st_size == recorded.get("size") and st.st_mtime_ns == recorded.get("mtime_ns")


def changed_sources(sources: dict[str, dict], only: Iterable[str] | None = None, *,
                    digest: bool = True) -> list[tuple[str, str]]:
    """``(shard, what changed)`` of every stamped source (of ``only``, when given) that is not as stamped
    (``digest``: see :func:`stamp_change`)."""
    from concurrent.futures import ThreadPoolExecutor

    wanted = [s for s in (sources if only is None else dict.fromkeys(only)) if s in sources]
    with ThreadPoolExecutor(max(1, min(8, len(wanted)))) as pool:
        changes = list(pool.map(lambda s: stamp_change(s, sources[s], digest=digest), wanted))
    return [(shard, why) for shard, why in zip(wanted, changes) if why is not None]


# --- what a reader learns of one index file ---------------------------------------------------------


@dataclass
class IndexMarks:
    """What an index file says of itself: ``marked`` (it carries completeness marks), its rows, and the
    stamps of its sources (None: not known)."""

    path: str
    marked: bool = False
    rows: int = 0
    sources: dict | None = None
    unmarked_rows: int = 0  # rows outside any marked segment (an old index, or an old one concatenated)

    def check_sources(self, only: Iterable[str] | None = None, *, digest: bool = True) -> None:
        """Refuse (ShardkitError naming the shard and what changed) when a source the index describes was
        rewritten since it was indexed; ``only``: the shards the caller uses. ``digest=False`` (a reader
        that opens no shard, like plan): size and mtime by a stat, no byte read."""
        changed = changed_sources(self.sources or {}, only, digest=digest)
        if changed:
            shard, why = changed[0]
            more = f" (and {len(changed) - 1} more shards)" if len(changed) > 1 else ""
            raise ShardkitError(f"changed since it was indexed into {self.path}: {why}{more}; its index no longer "
                                f"describes its bytes: index it again (shardkit index)", shard=shard)

    def note(self) -> str | None:
        """A line for a person when the index cannot be checked (no marks or no stamps), else None."""
        if not self.marked or self.unmarked_rows:
            return (f"{self.path}: no completeness mark or source stamps (an index written before shardkit "
                    f"recorded them): neither a cut copy nor a changed shard can be detected; index again to add them")
        if self.sources is None:
            return f"{self.path}: no source stamps (rewritten from an index without them): changed shards go unseen"
        return None

    def record(self) -> dict:
        """What a report records of the index: whether it was whole-checked, its rows, its sources' stamps."""
        return {"marked": self.marked and not self.unmarked_rows, "rows": self.rows, "sources": self.sources}


class JsonlMarks:
    """Follows a JSON lines index line by line: records through :meth:`add`, other lines through
    :meth:`take`; :meth:`finish` checks the last segment closed and gives the :class:`IndexMarks`."""

    def __init__(self, path: str):
        self.marks = IndexMarks(path)
        self._open: int | None = None  # line number of the head of the segment being read
        self._rows = 0
        self._digest = _digest()

    def add(self, line: bytes) -> None:
        """A record line (as read, newline included)."""
        self._rows += 1
        self._digest.update(line)

    def take(self, line: bytes, number: int) -> bool:
        """Whether ``line`` (not a record) is a mark; a mark that does not match its segment is an error."""
        if not line.startswith(_MARK_PREFIX):
            return False
        try:
            mark = json.loads(line)[MARK]
            part = mark["part"]
        except (ValueError, KeyError, TypeError):
            raise ShardkitError(f"line {number} is a damaged completeness mark", shard=self.marks.path) from None
        if part == "head":
            self._head(number)
        elif part == "end":
            self._end(mark, number)
        else:
            raise ShardkitError(f"line {number} is a completeness mark of unknown part {part!r}", shard=self.marks.path)
        return True

    def _head(self, number: int) -> None:
        if self._open is not None:
            raise ShardkitError(f"line {number}: a new segment starts before the one of line {self._open} "
                                f"ended (a copy cut short, then another appended?)", shard=self.marks.path)
        self.marks.unmarked_rows += self._rows
        self.marks.rows += self._rows
        self._open, self._rows, self._digest = number, 0, _digest()

    def _end(self, mark: dict, number: int) -> None:
        path = self.marks.path
        if self._open is None:
            raise ShardkitError(f"line {number}: a segment's end mark without its head", shard=path)
        if mark.get("rows") != self._rows:
            raise ShardkitError(f"line {number}: the segment from line {self._open} holds {self._rows} records, its "
                                f"end mark says {mark.get('rows')} (lines dropped or added since it was written)",
                                shard=path)
        if mark.get("blake2b") != self._digest.hexdigest():
            raise ShardkitError(f"line {number}: the records from line {self._open} do not match the digest of "
                                f"their end mark (edited since they were written)", shard=path)
        self.marks.marked = True
        self.marks.rows += self._rows
        sources = mark.get("sources")
        if isinstance(sources, dict):
            self.marks.sources = {**(self.marks.sources or {}), **sources}
        self._open, self._rows, self._digest = None, 0, _digest()

    def finish(self, lines: int) -> IndexMarks:
        """The marks of the whole file (``lines``: how many it has); a segment left open is an error."""
        if self._open is not None:
            raise ShardkitError(f"is cut short: the segment that starts at line {self._open} has {self._rows} "
                                f"records and no end mark after line {lines} (a copy that stopped early?); "
                                f"copy or index it again", shard=self.marks.path)
        self.marks.unmarked_rows += self._rows
        self.marks.rows += self._rows
        return self.marks


# --- writing ------------------------------------------------------------------------------------------


def head_line() -> bytes:
    return _mark_line({"format": FORMAT, "part": "head"})


def _mark_line(mark: dict) -> bytes:
    return json.dumps({MARK: mark}, sort_keys=True, separators=(",", ":")).encode() + b"\n"


@dataclass
class SegmentWriter:
    """The marks of one JSON lines segment being written: the head first, then records, then :meth:`end_line`."""

    sources: dict | None = None
    rows: int = 0
    _digest: object = field(default_factory=_digest)

    def add(self, data: bytes, rows: int) -> None:
        self.rows += rows
        self._digest.update(data)

    def end_line(self) -> bytes:
        return _mark_line({"format": FORMAT, "part": "end", "rows": self.rows, "blake2b": self._digest.hexdigest(),
                           "sources": self.sources})


def parquet_metadata(rows: int, sources: dict | None) -> dict[bytes, bytes]:
    """The key-value metadata a Parquet index's footer carries."""
    return {PARQUET_KEY: json.dumps({"format": FORMAT, "rows": rows, "sources": sources},
                                    sort_keys=True, separators=(",", ":")).encode()}


def parquet_marks(path: str, pf) -> IndexMarks:
    """The marks of an open Parquet index (``pyarrow.parquet.ParquetFile``); a row count other than the
    footer's is an error naming the file."""
    marks = IndexMarks(path, rows=pf.metadata.num_rows)
    raw = (pf.metadata.metadata or {}).get(PARQUET_KEY)
    if raw is None:
        marks.unmarked_rows = marks.rows
        return marks
    try:
        mark = json.loads(raw)
        rows, sources = mark["rows"], mark.get("sources")
    except (ValueError, KeyError, TypeError):
        raise ShardkitError("its completeness mark (footer metadata shardkit_index) is damaged", shard=path) from None
    if rows != marks.rows:
        raise ShardkitError(f"holds {marks.rows} rows, its completeness mark says {rows}", shard=path)
    marks.marked, marks.sources = True, sources if isinstance(sources, dict) else None
    return marks


def merged_sources(parts: list[IndexMarks]) -> dict | None:
    """The sources of indexes joined into one: None when any part's are not known."""
    if any(p.sources is None for p in parts):
        return None
    return {shard: stamp for p in parts for shard, stamp in p.sources.items()}
