"""Kaldi data directories: ``wav.scp``, ``text`` and ``segments`` as plain Python values.

The parsers take lines and return dicts (pure, testable without files); ``read_table`` is the only
I/O. Every malformed line is a UsageError that names the file and line number, because a data
directory that does not parse is an input mistake, not a data finding.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Iterable

from shardkit.errors import AudioError, UsageError


@dataclass(frozen=True)
class WavEntry:
    """One ``wav.scp`` line: a file path, or a shell command whose stdout is the audio (``cmd |``)."""

    key: str
    location: str  # the path, or the command without its trailing '|'
    is_pipe: bool
    line: int


@dataclass(frozen=True)
class Segment:
    """One ``segments`` line: utterance ``utt`` is [start, end) seconds of recording ``recording``.

    ``end`` is None for Kaldi's ``-1`` (to the end of the recording).
    """

    utt: str
    recording: str
    start: float
    end: float | None
    line: int


def _split(lines: Iterable[str]) -> Iterable[tuple[int, str, str]]:
    """(line number, key, rest) for each non-blank line; rest is the line after the key, stripped."""
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        parts = line.strip().split(maxsplit=1)
        yield number, parts[0], parts[1].strip() if len(parts) > 1 else ""


def _duplicate(key: str, number: int, first_line: int, source: str) -> UsageError:
    return UsageError(f"line {number}: key {key!r} appears twice (first on line {first_line})", shard=source)


def parse_wav_scp(lines: Iterable[str], source: str = "wav.scp") -> dict[str, WavEntry]:
    """``key path`` or ``key command |`` per line, in file order."""
    entries: dict[str, WavEntry] = {}
    for number, key, rest in _split(lines):
        if key in entries:
            raise _duplicate(key, number, entries[key].line, source)
        if not rest:
            raise UsageError(f"line {number}: key {key!r} has no path", shard=source)
        is_pipe = rest.endswith("|")
        location = rest[:-1].strip() if is_pipe else rest
        if is_pipe and not location:
            raise UsageError(f"line {number}: key {key!r} has an empty command before '|'", shard=source)
        entries[key] = WavEntry(key, location, is_pipe, number)
    return entries


def parse_text(lines: Iterable[str], source: str = "text") -> dict[str, str]:
    """``key transcript`` per line, in file order; a key alone on its line has an empty transcript."""
    texts: dict[str, str] = {}
    numbers: dict[str, int] = {}
    for number, key, rest in _split(lines):
        if key in texts:
            raise _duplicate(key, number, numbers[key], source)
        texts[key] = rest
        numbers[key] = number
    return texts


def parse_segments(lines: Iterable[str], source: str = "segments") -> dict[str, Segment]:
    """``utt recording start end`` per line (seconds; ``end`` -1 means to the end of the recording)."""
    segments: dict[str, Segment] = {}
    for number, utt, rest in _split(lines):
        if utt in segments:
            raise _duplicate(utt, number, segments[utt].line, source)
        fields = rest.split()
        if len(fields) != 3:
            raise UsageError(f"line {number}: expected 'utt recording start end', got {len(fields) + 1} fields",
                             shard=source)
        recording, start_text, end_text = fields
        try:
            start, end = float(start_text), float(end_text)
        except ValueError:
            raise UsageError(f"line {number}: start/end {start_text!r} {end_text!r} are not numbers",
                             shard=source) from None
        if start < 0:
            raise UsageError(f"line {number}: segment {utt!r} starts before 0 ({start})", shard=source)
        if end == -1:
            segments[utt] = Segment(utt, recording, start, None, number)
            continue
        if end <= start:
            raise UsageError(f"line {number}: segment {utt!r} ends ({end}) before it starts ({start})", shard=source)
        segments[utt] = Segment(utt, recording, start, end, number)
    return segments


def read_table(path: str) -> list[str]:
    """The lines of a Kaldi table file (UTF-8), split on ``\n`` only as Kaldi does (a CR inside a line is part of
    it; one before the ``\n`` is stripped with it); a missing or undecodable file is a UsageError."""
    try:
        with open(path, encoding="utf-8", newline="\n") as f:  # lines end at \n only: a bare CR is text
            return f.readlines()
    except FileNotFoundError:
        raise UsageError("no such file", shard=path) from None
    except UnicodeDecodeError as err:
        raise UsageError(f"not UTF-8 text ({err.reason} at byte {err.start})", shard=path) from None
    except OSError as err:
        raise UsageError(f"cannot read ({err.strerror or err})", shard=path) from None


def run_pipe(command: str, *, key: str, timeout: float = 600) -> bytes:
    """Run a ``wav.scp`` command the way Kaldi does (``sh -c``) and return its stdout, the audio bytes."""
    try:
        done = subprocess.run(command, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AudioError(f"command timed out after {timeout:.0f} s: {command}", member=key) from None
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise AudioError(f"command exited {done.returncode}: {command} ({tail[0]})", member=key)
    if not done.stdout:
        raise AudioError(f"command wrote no audio: {command}", member=key)
    return done.stdout
