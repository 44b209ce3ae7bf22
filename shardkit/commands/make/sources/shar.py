"""Lhotse Shar folders: per shard ``cuts.NNNNNN.jsonl.gz`` and ``recording.NNNNNN.tar``, as ``CutSet.from_shar``
reads them, here without lhotse: the cuts are JSON lines, the recording tar holds per cut its audio
``{cut_id}.{ext}`` then its ``Recording`` as ``{cut_id}.json`` (``.nodata``/``.nometa`` for a cut without
audio), read through shardkit's own tar parser. Every supervision becomes one utterance (key: its id,
transcript: its text), cut out of the cut's audio when it covers only part of it. For a plain tar the
audio member's data offset is recorded, so the writer reads it back with one seek.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from typing import Iterator

from shardkit.commands.make.sources import Entry, Skip, SourceOptions
from shardkit.commands.make.sources._probe import check_of, probe_bytes
from shardkit.commands.make.sources.wds import CountingReader
from shardkit.errors import ShardkitError, UsageError
from shardkit.io.tar import iter_tar_members, open_shard, shard_reader


def is_shar_folder(names: list[str]) -> bool:
    return any(n.startswith("cuts.") and ".jsonl" in n for n in names) and \
        any(n.startswith("recording.") and ".tar" in n for n in names)


def shard_files(folder: str) -> list[tuple[str, str]]:
    """(cuts file, recording tar) per shard, in lhotse's order (sorted names)."""
    names = os.listdir(folder)
    cuts = sorted(n for n in names if n.split(".")[0] == "cuts" and ".jsonl" in n)
    recordings = sorted(n for n in names if n.split(".")[0] == "recording" and ".tar" in n)
    if not cuts or len(cuts) != len(recordings):
        raise UsageError(f"a Lhotse Shar folder holds as many cuts.NNNNNN.jsonl.gz as recording.NNNNNN.tar files "
                         f"(found {len(cuts)} and {len(recordings)})", shard=folder)
    return [(os.path.join(folder, c), os.path.join(folder, r)) for c, r in zip(cuts, recordings)]


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    for folder in paths:
        for cuts, recordings in shard_files(os.path.abspath(folder)):
            yield from _read_shard(cuts, recordings)


def _audio_members(path: str) -> Iterator[tuple[str, bytes, int]]:
    """``(name, data, data offset or -1)`` of each audio (or ``.nodata``) member; the JSON that follows each
    is the Recording, whose facts the audio's own header gives again."""
    with open_shard(path) as f:
        reader = shard_reader(f, shard=path)
        plain = reader is f
        counting = CountingReader(reader)
        for index, (name, data) in enumerate(iter_tar_members(counting, shard=path)):
            if index % 2 == 0:
                yield name, data, counting.count - (-len(data) % 512) - len(data) if plain else -1


def _cuts(path: str) -> Iterator[dict]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)
    except (OSError, EOFError, ValueError, zlib.error) as err:
        raise ShardkitError(f"cannot read its cuts ({err})", shard=path) from None


def _read_shard(cuts_path: str, tar_path: str) -> Iterator[Entry | Skip]:
    members = _audio_members(tar_path)
    try:
        for cut in _cuts(cuts_path):
            name, data, offset = next(members, (None, b"", -1))
            if name is None or os.path.splitext(name)[0] != cut.get("id"):
                raise ShardkitError(f"cut {cut.get('id')!r} has no audio member in its place (found {name!r})",
                                    shard=tar_path)
            yield from _entries(cut, name, data, offset, tar_path)
    except ShardkitError as err:
        yield Skip(err.member or tar_path, err.check, f"{err} (the shard's cuts after it are lost)")


def _entries(cut: dict, name: str, data: bytes, offset: int, tar_path: str) -> Iterator[Entry | Skip]:
    """One entry per supervision of ``cut`` (its audio probed once)."""
    supervisions = cut.get("supervisions") or []
    if name.endswith(".nodata"):
        yield from (Skip(s.get("id", cut["id"]), "no_audio", f"{tar_path}: cut {cut['id']!r} has no recording")
                    for s in supervisions)
        return
    facts = probe_bytes(data)
    if isinstance(facts, str):
        yield Skip(cut["id"], check_of(facts), f"{tar_path}: member {name!r}: {facts}")
        return
    for sup in supervisions:
        yield _supervision_entry(sup, cut["id"], name, tar_path, offset, len(data), facts)


def _supervision_entry(sup: dict, cut_id: str, name: str, tar_path: str, offset: int, size: int,
                       facts: tuple[float, int, int]) -> Entry:
    """A supervision's utterance: the whole audio member, or the part of it the supervision covers."""
    seconds, rate, channels = facts
    start, duration = float(sup.get("start", 0.0)), float(sup.get("duration", seconds))
    whole = start <= 0 and abs(duration - seconds) < 1 / rate
    channel = sup.get("channel")
    return Entry(sup.get("id", cut_id), (sup.get("text") or "").strip(), name, container=tar_path, pos=offset,
                 size=size, start=0.0 if whole else start, duration=None if whole else duration, segment=not whole,
                 channel=channel if channels > 1 and isinstance(channel, int) else None, total=seconds, rate=rate,
                 channels=channels)
