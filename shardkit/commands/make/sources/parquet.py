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
from typing import Iterator

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
    pq = _pyarrow_parquet()
    try:
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise UsageError("no such file", shard=path) from None
    except Exception as err:  # pyarrow raises ArrowInvalid/OSError for a damaged file
        raise UsageError(f"not a readable Parquet file ({err})", shard=path) from None


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    audio_field = options.audio_field or "audio"
    text_field = options.text_field or "text"
    key_field = options.key_field or "id"
    for path in expand(paths, (".parquet",)):
        path = os.path.abspath(path)
        pf = open_parquet(path)
        names = pf.schema_arrow.names
        for needed in (audio_field, text_field):
            if needed not in names:
                raise UsageError(f"has no {needed!r} column (columns: {', '.join(names)})", shard=path)
        if options.key_field and key_field not in names:
            raise UsageError(f"has no {key_field!r} column (columns: {', '.join(names)})", shard=path)
        columns = [audio_field, text_field] + ([key_field] if key_field in names else [])
        stem = os.path.splitext(os.path.basename(path))[0]
        base = os.path.dirname(path)
        number = 0
        for group in range(pf.num_row_groups):
            row = 0
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns):
                table = batch.to_pydict()
                for i in range(batch.num_rows):
                    yield _row(table, i, audio_field, text_field, key_field, path, base, stem, group, row, number)
                    row += 1
                    number += 1


def _row(table, i, audio_field, text_field, key_field, path, base, stem, group, row, number) -> Entry | Skip:
    audio = table[audio_field][i]
    text = table[text_field][i]
    name = ""
    data = None
    if isinstance(audio, dict):
        name = audio.get("path") or ""
        data = audio.get("bytes")
    elif isinstance(audio, (bytes, str)):
        data, name = (audio, "") if isinstance(audio, bytes) else (None, audio)
    key = table[key_field][i] if key_field in table else None
    if key is None or key == "":
        key = os.path.splitext(os.path.basename(name))[0] if name else f"{stem}-{number:09d}"
    key = str(key)
    where = f"{path}: row group {group}, row {row}"
    if not isinstance(text, str):
        return Skip(key, "no_transcript", f"{where}: no {text_field!r} string")
    if data is None:
        if not name:
            return Skip(key, "no_audio", f"{where}: the {audio_field!r} cell holds neither bytes nor a path")
        return Entry(key, text, name if is_url(name) else os.path.join(base, name))
    facts = probe_bytes(data)
    if isinstance(facts, str):
        return Skip(key, check_of(facts), f"{where}: {facts}")
    seconds, rate, channels = facts
    return Entry(key, text, name, container=path, pos=group, size=row, total=seconds, rate=rate, channels=channels)
