"""WebDataset tars: per sample an audio member and its transcript in ``.json`` (``--text-field``,
default ``text``) or ``.txt``.

Read through shardkit's own tar parser (``tario.iter_tar_members``), so a hostile member (link,
device, ``..`` name, oversized) is refused the same way everywhere, and a damaged tar is reported
with the samples before the damage kept. Members group as WebDataset groups them: the key is
the name up to the first ``.`` of its last path component, the extension the rest; adjacent
members with one key form a sample. Audio: any container soundfile reads, plus mp3. For a plain
tar each audio member's data offset is recorded, so the writer reads it back with one seek.
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterator

from shardkit.commands.make.sources import TAR_SUFFIXES, Entry, Skip, SourceOptions, expand
from shardkit.commands.make.sources._probe import check_of, probe_bytes
from shardkit.errors import ShardkitError
from shardkit.io.tar import AUDIO_EXTENSIONS, iter_members_with_offsets

_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's base_plus_ext


def _samples(path: str, problems: list) -> Iterator[tuple[str, dict]]:
    """``(key, {ext: (data, offset, member name)})`` per WebDataset sample of one tar."""
    key, sample = None, {}
    for name, data, offset, compressed in iter_members_with_offsets(path, on_error=problems.append):
        match = _KEY_EXT.match(name)
        if match is None:
            continue  # no extension: WebDataset skips it too
        prefix, ext = match.group(1), match.group(2).lower()
        if prefix != key:
            if sample:
                yield key, sample
            key, sample = prefix, {}
        sample[ext] = (data, -1 if compressed else offset, name)
    if sample:
        yield key, sample


def _text(sample: dict, field: str) -> str | None:
    if "json" in sample:
        try:
            meta = json.loads(sample["json"][0])
        except (json.JSONDecodeError, UnicodeDecodeError):
            meta = None
        value = meta.get(field) if isinstance(meta, dict) else None
        if isinstance(value, str):
            return value
    if "txt" in sample:
        try:
            return sample["txt"][0].decode("utf-8").strip()
        except UnicodeDecodeError:
            return None
    return None


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    """Every sample of the WebDataset tars in ``paths``, in tar order, as ``Entry`` (its audio member's
    offset and size) or ``Skip``; the transcript from ``options.text_field`` (default text)."""
    field = options.text_field or "text"
    for path in expand(paths, TAR_SUFFIXES):
        yield from _read_tar(os.path.abspath(path), field)


def _read_tar(path: str, field: str) -> Iterator[Entry | Skip]:
    """The samples of one tar, each problem the parser met in its place; a damaged tar ends its samples."""
    problems: list[ShardkitError] = []
    try:
        for key, sample in _samples(path, problems):
            while problems:
                err = problems.pop(0)
                yield Skip(err.member or path, err.check, str(err))
            yield _sample(key, sample, path, field)
    except ShardkitError as err:
        yield Skip(path, "bad_tar", f"{err.reason} (samples after it are lost)")
    for err in problems:
        yield Skip(err.member or path, err.check, str(err))


def _sample(key: str, sample: dict, path: str, field: str) -> Entry | Skip:
    """One sample's entry (its audio member probed), or why it is skipped."""
    audio_ext = next((e for e in sample if e.rsplit(".", 1)[-1] in AUDIO_EXTENSIONS), None)
    if audio_ext is None:
        return Skip(key, "no_audio", f"{path}: sample has no audio member ({', '.join(sample)})")
    text = _text(sample, field)
    if text is None:
        return Skip(key, "no_transcript", f"{path}: sample has no .txt or .json {field!r} transcript")
    data, offset, name = sample[audio_ext]
    facts = probe_bytes(data)
    if isinstance(facts, str):
        return Skip(key, check_of(facts), f"{path}: member {name!r}: {facts}")
    seconds, rate, channels = facts
    return Entry(key, text, name, container=path, pos=offset, size=len(data), total=seconds, rate=rate,
                 channels=channels)
