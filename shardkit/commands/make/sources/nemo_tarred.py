"""NeMo tarred audio datasets: ``audio_K.tar`` files and one manifest whose lines name their member
(``audio_filepath``), as NeMo's ``TarredAudioToCharDataset`` reads them: a member's lines are those whose
file id (``os.path.splitext(os.path.basename(...))[0]``) is the member's. The tars are the ``audio_K.tar``
beside the manifest, K from 0 up to the largest ``shard_id`` (NeMo's converter writes both). Every line
found in a tar is an utterance (key: the line's ``key`` field, which shardkit's NeMo layout keeps, else
``--key-field``, else the file id; a line with ``offset`` is a segment cut out of the member); a line
no tar holds is reported (NeMo counts it in the dataset's length and never reads it).
"""

from __future__ import annotations

import os
from typing import Iterator, NamedTuple

from shardkit.commands.make.sources import Entry, Skip, SourceOptions, json_lines
from shardkit.commands.make.sources._probe import check_of, probe_bytes
from shardkit.commands.make.sources.wds import CountingReader
from shardkit.errors import ShardkitError, UsageError
from shardkit.io.tar import iter_tar_members, open_shard, shard_reader


class _Line(NamedTuple):
    key: str
    text: object
    offset: object
    duration: object


def _file_id(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def is_tarred_manifest(path: str, first: dict) -> bool:
    return "shard_id" in first and os.path.exists(os.path.join(os.path.dirname(os.path.abspath(path)), "audio_0.tar"))


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    for manifest in paths:
        lines, count, skips = _load(manifest, options)
        yield from skips
        folder = os.path.dirname(os.path.abspath(manifest))
        for k in range(count):
            yield from _read_tar(os.path.join(folder, f"audio_{k}.tar"), lines)
        for file_id, rest in lines.items():
            yield from (Skip(line.key, "no_audio", f"{manifest}: no tar holds member {file_id!r} (NeMo never reads "
                                                   "this line)") for line in rest)


def _load(manifest: str, options: SourceOptions) -> tuple[dict[str, list[_Line]], int, list[Skip]]:
    """The manifest's lines by file id (only what an entry needs), the tar count, and the lines refused."""
    audio_field, text_field = options.audio_field or "audio_filepath", options.text_field or "text"
    lines: dict[str, list[_Line]] = {}
    skips, count = [], 0
    for number, obj, error in json_lines(manifest):
        audio = obj.get(audio_field) if obj is not None else None
        if not isinstance(audio, str) or not audio:
            skips.append(Skip(f"{manifest}:{number}", "bad_line", error or f"line {number} has no {audio_field!r}"))
            continue
        count = max(count, _shard_count(obj.get("shard_id")))
        file_id = _file_id(audio)
        lines.setdefault(file_id, []).append(_Line(_line_key(obj, file_id, options.key_field), obj.get(text_field),
                                                   obj.get("offset"), obj.get("duration")))
    if count == 0:
        raise UsageError("a NeMo tarred manifest's lines carry shard_id (the K of audio_K.tar)", shard=manifest)
    return lines, count, skips


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _shard_count(shard_id) -> int:
    """How many tars a line's ``shard_id`` implies (0 for none)."""
    return shard_id + 1 if isinstance(shard_id, int) and shard_id >= 0 else 0


def _line_key(obj: dict, file_id: str, key_field: str | None) -> str:
    """``--key-field``'s value, else the ``key`` shardkit's NeMo layout keeps, else the file id (with a segment's
    offset in milliseconds, as make --from nemo names segments)."""
    key = obj.get(key_field) if key_field else obj.get("key")
    if isinstance(key, str) and key:
        return key
    offset = obj.get("offset")
    return f"{file_id}-{round(float(offset) * 1000)}" if isinstance(offset, (int, float)) else file_id


def _read_tar(path: str, lines: dict[str, list[_Line]]) -> Iterator[Entry | Skip]:
    try:
        with open_shard(path) as f:
            reader = shard_reader(f, shard=path)
            plain = reader is f
            counting = CountingReader(reader)
            for name, data in iter_tar_members(counting, shard=path):
                offset = counting.count - (-len(data) % 512) - len(data) if plain else -1
                yield from _member_entries(path, name, data, offset, lines.pop(_file_id(name), []))
    except ShardkitError as err:
        yield Skip(err.member or path, err.check, f"{err} (the tar's members after it are lost)")


def _member_entries(path: str, name: str, data: bytes, offset: int, member_lines: list[_Line]):
    """The entries of the lines one member holds (its audio probed once)."""
    facts = probe_bytes(data) if member_lines else None
    if isinstance(facts, str):
        yield from (Skip(line.key, check_of(facts), f"{path}: member {name!r}: {facts}") for line in member_lines)
        return
    for line in member_lines:
        yield _line_entry(line, path, name, offset, len(data), facts)


def _line_entry(line: _Line, path: str, name: str, offset: int, size: int,
                facts: tuple[float, int, int]) -> Entry | Skip:
    """One line's utterance: the whole member, or with ``offset`` the segment it names; or why not."""
    if not isinstance(line.text, str):
        return Skip(line.key, "no_transcript", f"{path}: member {name!r}: its line has no text")
    seconds, rate, channels = facts
    segment = line.offset is not None
    if segment and not (_number(line.offset) and _number(line.duration)):
        return Skip(line.key, "bad_line", f"{path}: member {name!r}: a segment needs a numeric offset and duration "
                                          f"(got {line.offset!r}, {line.duration!r})")
    return Entry(line.key, line.text, name, container=path, pos=offset, size=size,
                 start=float(line.offset) if segment else 0.0, duration=float(line.duration) if segment else None,
                 segment=segment, total=seconds, rate=rate, channels=channels)
