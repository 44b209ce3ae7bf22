"""Transcripts read back from shards at the places an index records their ``.txt`` members: what a
symbol table or BPE model needs to count tokens (an index keeps only ``text_chars``).

A plain shard is read by seeks, a compressed one decompressed once, streaming. A transcript that
is cut short or not UTF-8 is a ShardkitError naming the shard and the offset.
"""

from __future__ import annotations

from typing import Sequence

from shardkit.errors import ShardkitError
from shardkit.run.events import Events


def read_transcripts(shard: str, ranges: Sequence[tuple[int, int]]) -> list[str]:
    """The transcripts at ``(offset, size)`` of the decompressed tar of ``shard`` (ranges ascending,
    as an index records its members), stripped as WeNet's reader strips them.

    A plain shard is read by seeks; a compressed one is decompressed once, streaming.
    """
    from shardkit.io.codecs import detect_codec, iter_decompressed
    from shardkit.io.tar import ChunkReader, open_shard

    out: list[str] = []
    with open_shard(shard) as f:
        codec = detect_codec(f.peek(16)[:16]) if hasattr(f, "peek") else None
        if codec == "none":
            for offset, size in ranges:
                f.seek(offset)
                out.append(_text(f.read(size), size, shard, offset))
            return out
        reader = ChunkReader(iter_decompressed(f, shard=shard, codec=codec))
        position = 0
        for offset, size in ranges:
            if offset < position:
                raise ShardkitError(f"transcript ranges out of order at offset {offset}", shard=shard)
            _skip(reader, offset - position)
            out.append(_text(reader.read(size), size, shard, offset))
            position = offset + size
    return out


def _skip(reader, n: int) -> None:
    while n > 0:
        chunk = reader.read(min(n, 1 << 20))
        if not chunk:
            return
        n -= len(chunk)


def _text(data: bytes, size: int, shard: str, offset: int) -> str:
    if len(data) != size:
        raise ShardkitError(f"the transcript at offset {offset} is cut short (the shard changed since it was "
                            "indexed?)", shard=shard)
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ShardkitError(f"the transcript at offset {offset} is not UTF-8", shard=shard) from None


def transcripts_by_shard(shards: Sequence[str], shard_of, ranges: Sequence[tuple[int, int]],
                         events: Events | None = None) -> list[str]:
    """Transcripts of many utterances, read shard by shard: utterance i is in ``shards[shard_of[i]]``
    at ``ranges[i]`` = (offset, size) of its ``.txt`` member in the decompressed tar. ``events``: a
    ``done`` per shard read (its result ``{"shard": path}``)."""
    import numpy as np

    shard_of = np.asarray(shard_of, np.int64)
    texts: list[str] = [""] * len(shard_of)
    if not len(shard_of):
        return texts
    order = np.lexsort((np.asarray([r[0] for r in ranges], np.int64), shard_of))
    cuts = np.flatnonzero(np.diff(shard_of[order])) + 1
    for picked in np.split(order, cuts):
        sid = int(shard_of[picked[0]])
        for i, text in zip(picked.tolist(), read_transcripts(shards[sid], [ranges[i] for i in picked.tolist()])):
            texts[i] = text
        if events is not None:
            events.done({"shard": shards[sid]})
    return texts
