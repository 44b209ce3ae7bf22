"""NeMo tarred audio datasets: ``audio_K.tar`` files and one manifest whose lines name their member
(``audio_filepath``), read by :class:`shardkit.io.layouts.sources.NemoTarred` as NeMo's
``TarredAudioToCharDataset`` reads them (a member's lines are those whose file id is the member's). Every
line found in a tar is an entry (a line with ``offset`` a segment cut out of the member); a line no tar
holds, a member no line names and a damaged tar are skips naming where (nothing is left out silently).
"""

from __future__ import annotations

import os
from typing import Iterator

from shardkit.commands.make.sources import Entry, Skip, SourceOptions
from shardkit.commands.make.sources._probe import check_of, probe_member_once
from shardkit.io.layouts.sources import NemoTarred, SourceFinding


def is_tarred_manifest(path: str, first: dict) -> bool:
    return "shard_id" in first and os.path.exists(os.path.join(os.path.dirname(os.path.abspath(path)), "audio_0.tar"))


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    for manifest in paths:
        dataset = NemoTarred(manifest, key_field=options.key_field, text_field=options.text_field or "text",
                             audio_field=options.audio_field or "audio_filepath")
        facts: dict = {}
        for item in dataset:
            yield _skip(item) if isinstance(item, SourceFinding) else _entry(item, facts)


def _skip(finding: SourceFinding) -> Skip:
    return Skip(finding.member or finding.shard, finding.check, str(finding))


def _entry(utterance: dict, facts: dict) -> Entry | Skip:
    """One line's utterance (its member's audio probed once for all its lines), or why not."""
    found = probe_member_once(utterance, facts)
    if isinstance(found, str):
        return Skip(utterance["key"], check_of(found), f"{utterance['shard']}: member {utterance['member']!r}: {found}")
    seconds, rate, channels = found
    segment = utterance["duration"] is not None
    return Entry(utterance["key"], utterance["text"], utterance["member"], container=utterance["shard"],
                 pos=-1 if utterance["compressed"] else utterance["offset"], size=utterance["size"],
                 start=utterance["start"], duration=utterance["duration"], segment=segment, total=seconds, rate=rate,
                 channels=channels)
