"""Audio bytes of one utterance whose source is not a plain file: a URL, a tar member, a Parquet cell.

Used by ``make``'s writer (``make.audio._source_bytes``) inside the worker processes. A shard's
utterances come in source order, so each process keeps one forward cursor per compressed tar and
the last Parquet row group it read: a shard costs one pass over its part of the source.
"""

from __future__ import annotations

import os

from shardkit.commands.make.sources._probe import _url_bytes  # noqa: F401  (fetch's, kept beside the probe)
from shardkit.errors import AudioError

_cursors: dict[str, tuple] = {}  # compressed tar -> (member iterator, index of the next member)
_row_group: dict = {}  # (parquet path, row group, column) -> list of audio cells


def source_bytes(source: dict) -> bytes:
    """The audio bytes of one entry's recorded source: a file, a URL, a member of a tar or a Parquet
    cell; a URL whose size changed since planning raises AudioError naming it.
    """
    if "url" in source:
        data = _url_bytes(source["url"])
        if "size" in source:
            _check_size(source["url"], source["size"], len(data))
        return data
    if "tar" in source:
        return _tar_bytes(source)
    if "parquet" in source:
        return _parquet_bytes(source)
    raise AudioError(f"unknown audio source {sorted(source)}")


def _check_unchanged(path: str, size: int, mtime_ns: int) -> None:
    st = os.stat(path)
    if st.st_size != size or st.st_mtime_ns != mtime_ns:
        raise AudioError(f"{path} changed since it was read for planning")


def _check_size(url: str, planned: int, size: int) -> None:
    """A URL has no mtime to compare: its size at planning (``probe_audio``) must still be its size."""
    if size != planned:
        raise AudioError(f"{url} changed since it was read for planning ({planned} bytes then, {size} now)")


def _tar_bytes(source: dict) -> bytes:
    path, member = source["tar"], source["member"]
    _check_unchanged(path, source["tar_size"], source["tar_mtime_ns"])
    if source["offset"] >= 0:  # plain tar: one seek
        with open(path, "rb") as f:
            f.seek(source["offset"])
            data = f.read(source["size"])
        if len(data) != source["size"]:
            raise AudioError(f"{path}: member {member!r} is cut short")
        return data
    from shardkit.io.tar import iter_shard_members

    for attempt in range(2):
        cursor = _cursors.get(path)
        if cursor is None or attempt:
            _cursors.pop(path, None)
            cursor = iter_shard_members(path, on_error=lambda err: None)
        for name, data in cursor:
            if name == member:
                _cursors.clear()
                _cursors[path] = cursor
                return data
    raise AudioError(f"{path}: member {member!r} is not in the tar")


def _parquet_bytes(source: dict) -> bytes:
    from shardkit.commands.make.sources.parquet import open_parquet

    path, group, row, column = source["parquet"], source["row_group"], source["row"], source["column"]
    _check_unchanged(path, source["file_size"], source["file_mtime_ns"])
    cells = _row_group.get((path, group, column))
    if cells is None:
        _row_group.clear()
        table = open_parquet(path).read_row_group(group, columns=[column])
        cells = table.column(column).to_pylist()
        _row_group[(path, group, column)] = cells
    cell = cells[row]
    data = cell.get("bytes") if isinstance(cell, dict) else cell
    if not isinstance(data, bytes):
        raise AudioError(f"{path}: row group {group}, row {row} holds no audio bytes")
    return data
