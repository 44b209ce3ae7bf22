"""NeMo manifests: JSON lines with ``audio_filepath``, ``duration``, ``text`` and optional ``offset``.

Relative paths resolve against the manifest's folder, as NeMo does. With ``offset`` the line is a
segment ``[offset, offset + duration)`` of a longer file, cut out sample-exactly. The key is the
audio file's stem, with the offset in milliseconds appended for a segment (``stem-12340``),
unless ``--key-field`` names a field.
"""

from __future__ import annotations

import os
from typing import Iterator, NamedTuple

from shardkit.commands.make.sources import Entry, Skip, SourceOptions, json_lines
from shardkit.io.remote import is_url


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class _Fields(NamedTuple):
    """The fields a line is read from (``--audio-field``, ``--text-field``, ``--key-field``; key None: the stem)."""

    audio: str
    text: str
    key: str | None


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    """Every line of the NeMo manifests in ``paths``, in source order, as ``Entry`` (one utterance) or
    ``Skip`` (key and reason). ``options`` may rename the audio and text fields (default audio_filepath,
    text) and name a key field. Streams: one line at a time.
    """
    fields = _Fields(options.audio_field or "audio_filepath", options.text_field or "text", options.key_field)
    for path in paths:
        yield from _read_manifest(path, fields)


def _read_manifest(path: str, fields: _Fields) -> Iterator[Entry | Skip]:
    """The entries of one manifest; a run of lines naming one audio file resolves its path (and stem) once."""
    base = os.path.dirname(os.path.abspath(path))
    last_raw = last_resolved = stem = None
    for number, obj, error in json_lines(path):
        if obj is None:
            yield Skip(f"{path}:{number}", "bad_line", error)
            continue
        audio = obj.get(fields.audio)
        if not isinstance(audio, str) or not audio:
            yield Skip(f"{path}:{number}", "no_audio", f"line {number} has no {fields.audio!r} path")
            continue
        if audio != last_raw:
            last_raw = last_resolved = audio
            if not is_url(audio):
                last_resolved = os.path.normpath(os.path.join(base, os.path.expanduser(audio)))
            stem = os.path.splitext(os.path.basename(last_resolved))[0]
        yield _line(obj, last_resolved, stem, path, number, fields)


def _line(obj: dict, audio: str, stem: str, path: str, number: int, fields: _Fields) -> Entry | Skip:
    """Line ``number`` of manifest ``path``, its audio resolved: its entry, or why it is skipped. The key
    is the ``--key-field`` value, else the audio's stem (with a segment's offset in milliseconds)."""
    offset = obj.get("offset")
    segment = offset is not None
    start = _number(offset) if segment else 0.0
    duration = obj.get("duration")
    seconds = _number(duration) if duration is not None else None
    if fields.key:
        key = _field_key(obj.get(fields.key))
    else:
        key = f"{stem}-{round(start * 1000)}" if segment and start is not None else stem
    if not key:
        return Skip(f"{path}:{number}", "bad_line", f"line {number} has no {fields.key!r} key")
    problem = _timing_problem(offset, start, duration, seconds, segment)
    if problem:
        return Skip(key, "bad_line", f"{path}:{number}: {problem}")
    text = obj.get(fields.text)
    if not isinstance(text, str):
        return Skip(key, "no_transcript", f"{path}:{number}: no {fields.text!r} string")
    return Entry(key, text, audio, start=start, duration=seconds, segment=segment)


def _field_key(value) -> str | None:
    """A ``--key-field`` value as a key: a string, or an integer's digits (None for anything else)."""
    return value if isinstance(value, str) else (str(value) if isinstance(value, int) else None)


def _timing_problem(offset, start: float | None, duration, seconds: float | None, segment: bool) -> str | None:
    """What is wrong with a line's offset and duration, or None."""
    if start is None or start < 0:
        return f"offset {offset!r} is not a number >= 0"
    if duration is not None and (seconds is None or seconds <= 0):
        return f"duration {duration!r} is not a positive number"
    if segment and seconds is None:
        return "a segment (offset given) needs a duration"
    return None
