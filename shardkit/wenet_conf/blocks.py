"""The filter's columns of index rows, as balance and plan collect them in their one read of an index:
frames, sample rate and transcript length (and where each ``.txt`` member is, when a tokenizer
needs the transcripts), in compact dtypes, with the first row the filter cannot use.

A JSON lines index gives them a record at a time (:class:`RecordTrainer`), a Parquet index a table
at a time, column by column (:func:`table_trainer_block`): both give the same :class:`TrainerBlock`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shardkit.wenet_conf.dtypes import compact

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
        out = TrainerBlock(compact(np.array(self.frames, np.int64)),
                           compact(np.array(self.rate, np.int64), np.uint16, np.int32),
                           compact(np.array(self.chars, np.int64), np.uint16, np.int32), txt, self.problem)
        self.frames, self.rate, self.chars, self.txt, self.problem = [], [], [], [], None
        return out


def table_trainer_block(table, path: str, first_row: int, want_txt: bool, rows: np.ndarray | None = None,
                        check_all: bool = True) -> TrainerBlock:
    """The filter's columns of rows ``rows`` (None: all) of a Parquet index's pyarrow table (or batch)
    whose first row is row ``first_row`` of ``path``: straight from the columns, no per-row object.

    ``check_all``: the problem reported is the first of every row (balance checks every row it reads),
    else of ``rows`` only. A null, absent or non-finite field is what a JSON line without it is.
    """
    n = table.num_rows
    values, bad = _trainer_columns(table, n)
    checked = np.ones(n, bool) if check_all or rows is None else np.isin(np.arange(n), rows)
    txt, no_txt = _txt_columns(table, n) if want_txt else (None, np.zeros(n, bool))
    problem = _first_problem(table, checked, bad, no_txt, path, first_row)
    if rows is not None:
        values = [v[rows] for v in values]
        txt = None if txt is None else txt[rows]
    return TrainerBlock(compact(values[0]), compact(values[1], np.uint16, np.int32),
                        compact(values[2], np.uint16, np.int32), txt, problem)


def _trainer_columns(table, n: int) -> tuple[list[np.ndarray], np.ndarray]:
    """(int64 values of each of TRAINER_FIELDS, rows where any is missing)."""
    names = table.schema.names
    bad = np.zeros(n, bool)
    values = []
    for name in TRAINER_FIELDS:
        value, missing = _int_column(table.column(name) if name in names else None, n, name)
        values.append(value)
        bad |= missing
    return values, bad


def _first_problem(table, checked: np.ndarray, bad: np.ndarray, no_txt: np.ndarray, path: str,
                   first_row: int) -> tuple[str, str] | None:
    """(message, where) of the first checked row the filter cannot use, None when every one is usable."""
    first = np.flatnonzero(checked & (bad | no_txt))
    if not len(first):
        return None
    row = int(first[0])
    key = table.column("key")[row].as_py()
    why = LACKS if bad[row] else "names no .txt member"
    return f"index record of {key!r} {why}", f"{path}: row {first_row + row}"


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


def _where(path: str, number: int | None) -> str:
    return path if number is None else f"{path}: line {number}"


def _txt_range(record: dict) -> tuple[int, int] | None:
    name = record["key"] + ".txt"
    for member in record.get("members", ()):
        if member[0] == name:
            return int(member[1]), int(member[2])
    return None

