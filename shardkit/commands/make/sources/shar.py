"""Lhotse Shar folders: per shard ``cuts.NNNNNN.jsonl.gz`` and ``recording.NNNNNN.tar``, as ``CutSet.from_shar``
reads them, here without lhotse (:class:`shardkit.io.layouts.sources.SharFolder`, through shardkit's own tar
parser). Every supervision becomes one utterance (key: its id, transcript: its text), cut out of the cut's
audio when it covers only part of it. For a plain tar the audio member's data offset is recorded, so the
writer reads it back with one seek.
"""

from __future__ import annotations

import os
from typing import Iterator

from shardkit.commands.make.sources import Entry, Skip, SourceOptions
from shardkit.commands.make.sources._probe import check_of, probe_member_once
from shardkit.io.layouts.sources import SharFolder, SourceFinding, holds_shar_files


def is_shar_folder(names: list[str]) -> bool:
    """Whether a folder's file names are a Shar folder's (make's format detection)."""
    return holds_shar_files(names)


def shard_files(folder: str) -> list[tuple[str, str]]:
    """(cuts file, recording tar) per shard, in lhotse's order (sorted names)."""
    return SharFolder(folder).pairs


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    for folder in paths:
        facts: dict = {}
        for item in SharFolder(os.path.abspath(folder)):
            if isinstance(item, SourceFinding):
                yield Skip(item.member or item.shard, item.check, str(item))
            else:
                yield _entry(item, facts)


def _entry(utterance: dict, facts: dict) -> Entry | Skip:
    """A supervision's utterance: the whole audio member, or the part of it the supervision covers."""
    found = probe_member_once(utterance, facts)
    if isinstance(found, str):
        return Skip(utterance["fields"]["id"], check_of(found), f"{utterance['shard']}: member {utterance['member']!r}: {found}")
    seconds, rate, channels = found
    start = utterance["start"]
    duration = float(seconds if utterance["duration"] is None else utterance["duration"])
    whole = start <= 0 and abs(duration - seconds) < 1 / rate
    channel = utterance["channel"]
    return Entry(utterance["key"], utterance["text"] or "", utterance["member"], container=utterance["shard"],
                 pos=-1 if utterance["compressed"] else utterance["offset"], size=utterance["size"],
                 start=0.0 if whole else start, duration=None if whole else duration, segment=not whole,
                 channel=channel if channels > 1 and isinstance(channel, int) else None, total=seconds, rate=rate,
                 channels=channels)
