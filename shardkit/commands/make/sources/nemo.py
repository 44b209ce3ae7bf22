"""NeMo manifests: JSON lines with ``audio_filepath``, ``duration``, ``text`` and optional ``offset``.

Relative paths resolve against the manifest's folder, as NeMo does. With ``offset`` the line is a
segment ``[offset, offset + duration)`` of a longer file, cut out sample-exactly. The key is the
audio file's stem, with the offset in milliseconds appended for a segment (``stem-12340``),
unless ``--key-field`` names a field.
"""

from __future__ import annotations

import os
from typing import Iterator

from shardkit.commands.make.sources import Entry, Skip, SourceOptions, json_lines
from shardkit.io.remote import is_url


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    audio_field = options.audio_field or "audio_filepath"
    text_field = options.text_field or "text"
    for path in paths:
        base = os.path.dirname(os.path.abspath(path))
        last_raw = last_resolved = None
        for number, obj, error in json_lines(path):
            where = f"{path}:{number}"
            if obj is None:
                yield Skip(where, "bad_line", error)
                continue
            audio = obj.get(audio_field)
            if not isinstance(audio, str) or not audio:
                yield Skip(where, "no_audio", f"line {number} has no {audio_field!r} path")
                continue
            if audio == last_raw:
                audio = last_resolved
            else:
                last_raw = audio
                if not is_url(audio):
                    audio = os.path.normpath(os.path.join(base, os.path.expanduser(audio)))
                last_resolved = audio
            offset = obj.get("offset")
            segment = offset is not None
            start = _number(offset) if segment else 0.0
            duration = obj.get("duration")
            seconds = _number(duration) if duration is not None else None
            if options.key_field:
                key = obj.get(options.key_field)
                key = key if isinstance(key, str) else (str(key) if isinstance(key, int) else None)
            else:
                key = os.path.splitext(os.path.basename(audio))[0]
                if segment and start is not None:
                    key = f"{key}-{round(start * 1000)}"
            text = obj.get(text_field)
            if not key:
                yield Skip(where, "bad_line", f"line {number} has no {options.key_field!r} key")
            elif start is None or start < 0:
                yield Skip(key, "bad_line", f"{where}: offset {offset!r} is not a number >= 0")
            elif duration is not None and (seconds is None or seconds <= 0):
                yield Skip(key, "bad_line", f"{where}: duration {duration!r} is not a positive number")
            elif segment and seconds is None:
                yield Skip(key, "bad_line", f"{where}: a segment (offset given) needs a duration")
            elif not isinstance(text, str):
                yield Skip(key, "no_transcript", f"{where}: no {text_field!r} string")
            else:
                yield Entry(key, text, audio, start=start, duration=seconds, segment=segment)
