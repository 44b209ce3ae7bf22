"""Plan's columns of a shard list: per utterance its shard, key, corpus, seconds and the filter's
fields, from index files (Parquet a row group at a time, column by column; JSON lines a line at a
time) or from the records of shards indexed now (:class:`UttColumns`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shardkit.errors import ShardkitError
from shardkit.wenet_conf.blocks import TRAINER_FIELDS, RecordTrainer, concat_blocks, table_trainer_block


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
class ColumnCollector:
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
        """The utterance columns collected so far, as one :class:`UttColumns` in index order."""
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


def _folder(shard: str) -> str:
    """A row without a corpus belongs to its shard's folder (as ``shardkit index`` names it)."""
    return os.path.basename(os.path.dirname(os.path.abspath(shard))) or "corpus"


def index_columns(index_files: Sequence[str], *, want_txt: bool, keep: set[str] | None = None) -> UttColumns:
    """Columns of every record of the index files (in file order), or only of shards in ``keep``.

    Parquet is read a row group at a time, column by column (no per-row dict); JSON lines a line at a time.
    An index cut short, or one whose stamped shards (of ``keep``) changed since it was indexed, is a
    ShardkitError naming it (``shardkit.io.indexmarks``).
    """
    from shardkit.io.indexfile import is_parquet

    cols = ColumnCollector(want_txt)
    for path in index_files:
        if is_parquet(path):
            marks = _add_parquet(cols, path, want_txt, keep)
        else:
            marks = _add_jsonl(cols, path, keep)
        marks.check_sources(keep, digest=False)  # (plan's reader: it opens no shard; a stat each)
    return cols.columns()


def _add_parquet(cols: ColumnCollector, path: str, want_txt: bool, keep: set[str] | None):
    """The rows of a Parquet index, a record batch at a time (a row group's error names the group); its marks."""
    from shardkit.io.indexfile import open_parquet_index, read_row_group
    from shardkit.io.indexmarks import parquet_marks

    pf = open_parquet_index(path)
    marks = parquet_marks(path, pf)
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
    return marks


def _add_jsonl(cols: ColumnCollector, path: str, keep: set[str] | None):
    """The records of a JSON lines index, a line at a time; a line that is no record is an error naming it,
    and so is a file cut short. Its marks (``shardkit.io.indexmarks.IndexMarks``)."""
    from shardkit.io.indexfile import loads, open_index, parse_index_line
    from shardkit.io.indexmarks import JsonlMarks

    add = cols.add
    marks = JsonlMarks(path)
    number = 0
    with open_index(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or marks.take(line, number):
                continue
            marks.add(line)
            try:
                record = loads(line)
                shard = record["shard"]
            except (ValueError, KeyError, TypeError):
                parse_index_line(line, path=path, number=number)  # raises the precise error
                raise ShardkitError(f"line {number} is not an index record", shard=path) from None
            if keep is None or shard in keep:
                add(record, path, number)
    return marks.finish(number)
