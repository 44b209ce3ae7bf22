"""WeNet's raw format: ``data.list`` with one JSON object per line, ``{"key", "wav", "txt"}``.

``wav`` is a local path (relative to the folder the command runs in, as WeNet opens it) or a URL.
Durations come from the audio headers.
"""

from __future__ import annotations

import os
from typing import Iterator

from shardkit.commands.make.sources import Entry, Skip, SourceOptions, json_lines
from shardkit.io.remote import is_url


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    """Every line of the WeNet raw lists in ``paths``, in source order, as ``Entry`` (one utterance) or
    ``Skip`` (key and reason). ``options`` may rename the key, audio and text fields (default key, wav,
    txt). Streams: one line at a time.
    """
    fields = (options.key_field or "key", options.audio_field or "wav", options.text_field or "txt")
    for path in paths:
        yield from _read_list(path, *fields)


def _read_list(path: str, key_field: str, audio_field: str, text_field: str) -> Iterator[Entry | Skip]:
    """The entries of one list, in its order; a line without a key, audio path or transcript is skipped."""
    for number, obj, error in json_lines(path):
        if obj is None:
            yield Skip(f"{path}:{number}", "bad_line", error)
            continue
        key, wav, text = obj.get(key_field), obj.get(audio_field), obj.get(text_field)
        where = f"{path}:{number}"
        if not isinstance(key, str) or not key:
            yield Skip(where, "bad_line", f"line {number} has no {key_field!r} string")
        elif not isinstance(wav, str) or not wav:
            yield Skip(key, "no_audio", f"{where}: no {audio_field!r} path")
        elif not isinstance(text, str):
            yield Skip(key, "no_transcript", f"{where}: no {text_field!r} string")
        else:
            yield Entry(key, text, wav if is_url(wav) else os.path.abspath(wav))
