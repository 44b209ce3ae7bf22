"""What a make run is asked for (``MakeSettings``), the names of its records, and the one shape of a
finding (an utterance left out, with the check that left it out and why)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from shardkit.errors import UsageError
from shardkit.io.audio import EMPTY_AUDIO, HEADER_CHECKS
from shardkit.io.codecs import CODECS

MANIFEST = "make.json"
JOURNAL = ".make.journal.jsonl"
AUDIO_FORMATS = ("keep", "wav", "flac")
DEFAULT_SHARD_SECONDS = 3600.0


@dataclass(frozen=True)
class MakeSettings:
    """What ``make`` writes: codec and level, the audio format (``keep`` copies source bytes), resampling,
    the shard size (by duration or utterance count), whether pipes run, the shard name prefix, and read-back
    verification.
    """
    codec: str = "zst"
    level: int | None = 3
    audio_format: str = "keep"  # keep: source bytes untouched; wav/flac: decoded and re-encoded as 16-bit PCM
    resample: int | None = None
    shard_duration: float | None = DEFAULT_SHARD_SECONDS
    utts_per_shard: int | None = None
    allow_pipes: bool = False
    prefix: str = "shards_"
    verify: bool = True  # read each shard back before it is named; the bytes written are the same either way

    def output_affecting(self) -> dict:
        """The settings that change a shard's bytes: part of each shard's fingerprint, so a rerun with
        other ones rewrites instead of resuming.
        """
        return {"codec": self.codec, "level": self.level, "audio_format": self.audio_format,
                "resample": self.resample}


# a header a decoder refuses or reads differently is a finding under shardkit.io.audio's own check name
HEADER_FINDINGS = (*HEADER_CHECKS, EMPTY_AUDIO)


def finding(key: str, check: str, reason: str) -> dict:
    """A skipped utterance as the report lists it: its key, the check and the reason."""
    return {"key": key, "check": check, "reason": reason}


def check_settings(settings: MakeSettings, *, has_segments: bool) -> None:
    """Refuse settings that cannot go together (UsageError saying which option to use): an unknown codec
    or audio format, ``keep`` with segments or resampling, both or neither shard size.
    """
    if settings.codec not in CODECS:
        raise UsageError(f"unknown codec {settings.codec!r}; choose from {', '.join(CODECS)}")
    if settings.audio_format not in AUDIO_FORMATS:
        raise UsageError(f"unknown audio format {settings.audio_format!r}; choose from {', '.join(AUDIO_FORMATS)}")
    if settings.audio_format == "keep" and has_segments:
        raise UsageError("--audio-format keep copies whole source files, but with --segments each utterance is "
                         "cut from its recording and must be re-encoded: use --audio-format wav or flac")
    if settings.audio_format == "keep" and settings.resample:
        raise UsageError("--audio-format keep copies source bytes untouched, so it cannot --resample: "
                         "use --audio-format wav or flac")
    if (settings.shard_duration is None) == (settings.utts_per_shard is None):
        raise UsageError("give one of --shard-duration and --utts-per-shard")


def shard_fingerprint(utterances: list[dict], settings: MakeSettings) -> str:
    """What a shard's bytes depend on: its utterances (text, source identity, cut) and the output settings."""
    content = {"settings": settings.output_affecting(),
               "utterances": [[u["key"], u["text"], u["source"], u["start"], u["end"]]
                              + ([u["channel"]] if u.get("channel") is not None else []) for u in utterances]}
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()
