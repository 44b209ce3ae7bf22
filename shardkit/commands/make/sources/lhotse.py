"""Lhotse manifests: a CutSet, or a RecordingSet with a SupervisionSet (``.jsonl`` or ``.jsonl.gz``).

Read with the ``lhotse`` library (the ``lhotse`` extra; it pulls torch, so it is not part of the
default install). Every supervision becomes one utterance, cut sample-exactly out of its
recording (``start``/``duration`` of the supervision, plus the cut's own start for a CutSet); the
key is the supervision id, the transcript its text. A multi-channel recording gives the channel
named by ``--channel``, else the supervision's own channel. Recordings whose audio is a file or a
URL are read (a ``command`` source only with ``--allow-pipes``); in-memory audio, MixedCuts and
recordings with transforms (speed perturbation, resampling) are reported and skipped.
"""

from __future__ import annotations

import os
from typing import Iterator, NamedTuple

from shardkit.commands.make.sources import Entry, Skip, SourceOptions, manifest_kind
from shardkit.errors import UsageError
from shardkit.io.remote import is_url


def _lhotse():
    try:
        import lhotse
    except ImportError:
        raise UsageError("reading Lhotse manifests needs the lhotse library: pip install 'shardkit[lhotse]'") from None
    return lhotse


class _Source(NamedTuple):
    type: str
    channels: tuple
    source: str


class _Recording(NamedTuple):
    """What an utterance needs of a lhotse Recording (a RecordingSet's recordings are all held)."""

    id: str
    sources: tuple
    transforms: bool


def _compact(recording) -> _Recording:
    return _Recording(recording.id, tuple(_Source(s.type, tuple(s.channels), s.source if isinstance(s.source, str)
                                                  else "") for s in recording.sources), bool(recording.transforms))


def _utterance(sup, recording, offset: float, options: SourceOptions) -> Entry | Skip:
    key = sup.id
    if sup.text is None:
        return Skip(key, "no_transcript", "supervision has no text")
    if recording is None:
        return Skip(key, "no_audio", f"recording {sup.recording_id!r} is not in the RecordingSet")
    if recording.transforms:
        return Skip(key, "unsupported_source", f"recording {recording.id!r} has transforms (speed, volume, "
                                               "resampling): apply them with lhotse first")
    picked = _source_and_channel(sup, recording, options.channel)
    if isinstance(picked, Skip):
        return picked
    source, channel = picked
    audio = _audio(source, options.allow_pipes)
    if audio is None:
        return Skip(key, "unsupported_source", f"recording {recording.id!r} has a {source.type!r} audio source"
                                               f"{' (needs --allow-pipes)' if source.type == 'command' else ''}")
    return Entry(key, sup.text, audio, start=max(0.0, offset + sup.start), duration=float(sup.duration),
                 segment=True, channel=channel)


def _source_and_channel(sup, recording, channel: int | None) -> tuple[_Source, int | None] | Skip:
    """The recording's source holding the channel asked for (``--channel``, else the supervision's own)
    and that channel's index within it (None: every channel of a one-source recording, or a mono file)."""
    if channel is None:
        channel = _own_channel(sup)
    if channel is None:
        if len(recording.sources) > 1:
            return Skip(sup.id, "unsupported_source", f"recording {recording.id!r} keeps each channel in its own "
                                                      "file: choose one with --channel")
        return recording.sources[0], None
    channels = sorted({c for s in recording.sources for c in s.channels})
    if channel not in channels:
        return Skip(sup.id, "no_such_channel", f"recording {recording.id!r} has channels {channels}, not {channel}")
    source = next(s for s in recording.sources if channel in s.channels)
    return source, source.channels.index(channel) if len(source.channels) > 1 else None


def _own_channel(sup) -> int | None:
    """The supervision's channel: an int, or the one channel of a list (None for several)."""
    if isinstance(sup.channel, int):
        return sup.channel
    return sup.channel[0] if len(sup.channel) == 1 else None


def _audio(source: _Source, allow_pipes: bool) -> str | None:
    """Where the source's audio is read from (a path, a URL or ``pipe:`` command), or None when it cannot be."""
    if source.type == "file" or source.type == "url":
        return source.source if source.type == "url" or is_url(source.source) else os.path.abspath(source.source)
    if source.type == "command" and allow_pipes:
        return f"pipe:{source.source}"
    return None


def _cuts(path: str, options: SourceOptions) -> Iterator[Entry | Skip]:
    lhotse = _lhotse()
    for cut in lhotse.CutSet.from_jsonl_lazy(path):
        if type(cut).__name__ != "MonoCut" or not getattr(cut, "has_recording", False):
            yield Skip(cut.id, "unsupported_source", f"{type(cut).__name__} without one recording: "
                                                     "only MonoCuts with a recording are read")
            continue
        for sup in cut.supervisions:
            yield _utterance(sup, cut.recording, cut.start, options)


def _supervisions(recordings_path: str, supervisions_path: str, options: SourceOptions) -> Iterator[Entry | Skip]:
    lhotse = _lhotse()
    recordings = {r.id: _compact(r) for r in lhotse.RecordingSet.from_jsonl_lazy(recordings_path)}
    for sup in lhotse.SupervisionSet.from_jsonl_lazy(supervisions_path):
        yield _utterance(sup, recordings.get(sup.recording_id), 0.0, options)


_KINDS = ("lhotse-cuts", "lhotse-recordings", "lhotse-supervisions")


def _manifests(paths: list[str]) -> tuple[list[str], list[str], list[str]]:
    """The CutSets, RecordingSets and SupervisionSets among ``paths``; a UsageError for anything else, a
    RecordingSet without its SupervisionSet (or the reverse), or more than one pair."""
    kinds = {path: manifest_kind(path) for path in paths}
    other = [p for p, k in kinds.items() if k not in _KINDS]
    if other:
        raise UsageError("not a Lhotse CutSet, RecordingSet or SupervisionSet manifest", shard=other[0])
    cuts, recordings, supervisions = ([p for p, k in kinds.items() if k == kind] for kind in _KINDS)
    if len(recordings) != len(supervisions):
        raise UsageError("a Lhotse RecordingSet needs its SupervisionSet (and the reverse): give both, "
                         "e.g. recordings.jsonl.gz supervisions.jsonl.gz")
    if len(recordings) > 1:
        raise UsageError("give at most one RecordingSet with its SupervisionSet (or CutSets)")
    return cuts, recordings, supervisions


def read(paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    """Every utterance of the Lhotse manifests in ``paths`` (a CutSet's MonoCuts, or a RecordingSet with
    its SupervisionSet), as ``Entry`` or ``Skip``; UsageError for any other manifest or an unpaired set."""
    cuts, recordings, supervisions = _manifests(paths)
    for path in cuts:
        yield from _cuts(path, options)
    if recordings:
        yield from _supervisions(recordings[0], supervisions[0], options)
