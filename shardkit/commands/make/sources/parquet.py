"""Hugging Face-style Parquet: an ``audio`` column of ``{bytes, path}``, ``text`` and ``id`` columns.

Files or folders of ``.parquet`` files, streamed with ``pyarrow`` (the ``parquet`` extra) one
small batch of a row group at a time, never loaded whole. Audio bytes are probed for their
duration where they are read; a row whose ``bytes`` is null reads the file at ``path``
(relative to the Parquet file's folder). Column names are settable (``--audio-field``,
``--text-field``, ``--key-field``); without the key column, the key is the stem of the audio's
``path``, else ``FILESTEM-ROW``.
"""

from __future__ import annotations

import os
from typing import Iterator, NamedTuple

from shardkit.commands.make.sources import Entry, Skip, SourceOptions, expand
from shardkit.commands.make.sources._probe import check_of, probe_bytes
from shardkit.errors import UsageError
from shardkit.io.remote import is_url

BATCH_ROWS = 64


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError("reading Parquet needs pyarrow: pip install 'shardkit[parquet]'") from None
    return pq


def open_parquet(path: str):
    """A pyarrow ParquetFile for ``path``; UsageError naming the file when it is missing or not Parquet."""
    pq = _pyarrow_parquet()
    try:
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise UsageError("no such file", shard=path) from None
    except Exception as err:  # pyarrow raises ArrowInvalid/OSError for a damaged file
        raise UsageError(f"not a readable Parquet file ({err})", shard=path) from None


class _Columns(NamedTuple):
    """The columns rows are read from (``--audio-field``, ``--text-field``, ``--key-field``)."""

    audio: str
    text: str
    key: str


class _File(NamedTuple):
    """Where rows come from: the Parquet file, its folder (relative audio paths) and its stem (keys)."""

    path: str
    base: str
    stem: str


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    """Every row of the Parquet files in ``paths``, in source order, as ``Entry`` (one utterance) or
    ``Skip`` (key and reason). ``options`` may rename the audio, text and key columns (default audio,
    text, id). Streams: one batch at a time.
    """
    columns = _Columns(options.audio_field or "audio", options.text_field or "text", options.key_field or "id")
    for path in expand(paths, (".parquet",)):
        path = os.path.abspath(path)
        yield from _read_file(path, columns, key_given=bool(options.key_field))


def _read_file(path: str, columns: _Columns, *, key_given: bool) -> Iterator[Entry | Skip]:
    """The rows of one file, one small batch of a row group at a time."""
    pf = open_parquet(path)
    read_columns = _read_columns(pf.schema_arrow.names, path, columns, key_given)
    file = _File(path, os.path.dirname(path), os.path.splitext(os.path.basename(path))[0])
    number = 0
    for group in range(pf.num_row_groups):
        row = 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=read_columns):
            table = batch.to_pydict()
            keys = table[columns.key] if columns.key in table else [None] * batch.num_rows
            for audio, text, key in zip(table[columns.audio], table[columns.text], keys):
                yield _row(audio, text, key, columns, file, group, row, number)
                row += 1
                number += 1


def _read_columns(names: list[str], path: str, columns: _Columns, key_given: bool) -> list[str]:
    """The columns to read; a UsageError naming the file's columns when one asked for is missing."""
    for needed in (columns.audio, columns.text):
        if needed not in names:
            raise UsageError(f"has no {needed!r} column (columns: {', '.join(names)})", shard=path)
    if key_given and columns.key not in names:
        raise UsageError(f"has no {columns.key!r} column (columns: {', '.join(names)})", shard=path)
    return [columns.audio, columns.text] + ([columns.key] if columns.key in names else [])


def _cell(audio) -> tuple[str, bytes | None]:
    """``(name, bytes)`` of an audio cell: a ``{bytes, path}`` struct, bytes, or a path."""
    if isinstance(audio, dict):
        return audio.get("path") or "", audio.get("bytes")
    if isinstance(audio, bytes):
        return "", audio
    if isinstance(audio, str):
        return audio, None
    return "", None


def _row(audio, text, key, columns: _Columns, file: _File, group: int, row: int, number: int) -> Entry | Skip:
    """One row's entry (audio bytes probed where they are), or why it is skipped; ``key`` None or empty:
    the stem of the audio's path, else ``FILESTEM-NUMBER``."""
    name, data = _cell(audio)
    if key is None or key == "":
        key = os.path.splitext(os.path.basename(name))[0] if name else f"{file.stem}-{number:09d}"
    key = str(key)
    if not isinstance(text, str):
        return Skip(key, "no_transcript", f"{file.path}: row group {group}, row {row}: no {columns.text!r} string")
    if data is None:
        if not name:
            return Skip(key, "no_audio", f"{file.path}: row group {group}, row {row}: the {columns.audio!r} cell "
                                         "holds neither bytes nor a path")
        return Entry(key, text, name if is_url(name) else os.path.join(file.base, name))
    facts = probe_bytes(data)
    if isinstance(facts, str):
        return Skip(key, check_of(facts), f"{file.path}: row group {group}, row {row}: {facts}")
    seconds, rate, channels = facts
    return Entry(key, text, name, container=file.path, pos=group, size=row, total=seconds, rate=rate,
                 channels=channels)
