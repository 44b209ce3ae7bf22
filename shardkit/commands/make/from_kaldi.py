"""make from a Kaldi data directory (wav.scp, text, optional segments): ``run_make``.

The directory is read and checked before OUT_DIR is claimed; inside the claim, transcripts are paired
with their audio (``pairing``), each recording's header is probed for its duration (in parallel, never
a full decode), the utterances are cut into shards (``shardkit.planning.shard_cuts``) and ``write``
writes them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

from shardkit.commands.make.kaldi import WavEntry, parse_segments, parse_text, parse_wav_scp, read_table, run_pipe
from shardkit.commands.make.pairing import attach_durations, map_member_keys, match_utterances
from shardkit.commands.make.report import MakeReport
from shardkit.commands.make.settings import HEADER_FINDINGS, MakeSettings, check_settings
from shardkit.commands.make.write import PlannedShards, claimed_run, write_shards
from shardkit.errors import ShardkitError, UsageError
from shardkit.io.remote import is_url
from shardkit.planning.shard_cuts import plan_shards
from shardkit.run.options import RunOptions

_PROBE_CHUNK = 64


def load_data_dir(wav_scp: str, text: str, segments: str | None) -> tuple[dict, dict, dict | None]:
    """A Kaldi data directory's tables: ``(wav.scp entries, transcripts, segments or None)``; a UsageError
    names a bad line."""
    return (parse_wav_scp(read_table(wav_scp), wav_scp), parse_text(read_table(text), text),
            parse_segments(read_table(segments), segments) if segments else None)


def refuse_pipes(wav: dict[str, WavEntry], wav_scp: str) -> None:
    """Refuse a wav.scp with command pipes (UsageError naming the first and how many more) unless --allow-pipes."""
    pipes = [e for e in wav.values() if e.is_pipe]
    if pipes:
        first = pipes[0]
        raise UsageError(f"line {first.line}: key {first.key!r} is a command pipe ({first.location} |)"
                         f"{f' and {len(pipes) - 1} more entries are too' if len(pipes) > 1 else ''}; "
                         f"shardkit make reads audio files only unless --allow-pipes lets it run these commands",
                         shard=wav_scp)


def probe_recording(entry: WavEntry) -> dict:
    """Header facts of one recording: seconds, sample_rate, channels, and what identifies the source.

    A pipe entry's command runs here for its header and again when its shard is written: nothing
    is kept between the two (the audio may be large, and memory stays at one utterance).
    """
    try:
        if entry.is_pipe:
            return _probe_pipe(entry)
        return _probe_location(entry.location)
    except ShardkitError as err:
        return {"error": err.reason, "check": err.check if err.check in HEADER_FINDINGS else "unreadable_audio"}
    except OSError as err:
        return {"error": f"cannot read {entry.location} ({err.strerror or err})"}


def _probe_pipe(entry: WavEntry) -> dict:
    from shardkit.io.audio import probe

    info = probe(run_pipe(entry.location, key=entry.key))
    return {"seconds": info["duration"], "sample_rate": info["sample_rate"], "channels": info["channels"],
            "source": {"command": entry.location}}


def _probe_location(location: str) -> dict:
    """A file's or URL's header facts and identity (checked when it is read again to be written)."""
    from shardkit.commands.make.sources._probe import (
        probe_audio,  # WAV headers by shardkit's parser, others by soundfile
    )

    facts = probe_audio(location)
    if isinstance(facts, str):
        return {"error": str(facts), "check": getattr(facts, "check", "unreadable_audio")}
    seconds, rate, channels, size, mtime_ns = facts
    source = ({"url": location, "name": location, "size": size} if is_url(location)
              else {"path": location, "size": size, "mtime_ns": mtime_ns})
    return {"seconds": seconds, "sample_rate": rate, "channels": channels, "source": source}


def _probe_chunk(entries: list[WavEntry]) -> list[dict]:
    return [probe_recording(e) for e in entries]


def probe_recordings(entries: list[WavEntry], options: RunOptions | None = None) -> dict[str, dict]:
    """``probe_recording`` of every entry, in chunks through the executor; ``{key: facts}``."""
    options = options or RunOptions()
    chunks = [entries[i:i + _PROBE_CHUNK] for i in range(0, len(entries), _PROBE_CHUNK)]
    results = [infos for _, infos in options.run_tasks(_probe_chunk, chunks, ordered=True)]
    return {e.key: info for chunk, infos in zip(chunks, results) for e, info in zip(chunk, infos)}


@dataclass(frozen=True)
class DataDir:
    """A Kaldi data directory: its three file names and what they hold (``segs`` None without segments)."""

    wav_scp: str
    text: str
    segments: str | None
    wav: dict[str, WavEntry]
    texts: dict[str, str]
    segs: dict | None

    def claim_inputs(self) -> list[str]:
        """The files no output may be: the directory's own and every local audio file it names."""
        inputs = [p for p in (self.wav_scp, self.text, self.segments) if p]
        return inputs + [os.path.abspath(e.location) for e in self.wav.values()
                         if not e.is_pipe and not is_url(e.location)]

    def recorded(self) -> dict:
        """The directory's files as make.json records them (absolute paths; segments None when absent)."""
        return {"wav_scp": os.path.abspath(self.wav_scp), "text": os.path.abspath(self.text),
                "segments": os.path.abspath(self.segments) if self.segments else None}


def read_data_dir(wav_scp: str, text: str, segments: str | None, *, allow_pipes: bool) -> DataDir:
    """The directory parsed; command pipes refused unless allowed, and a directory without transcripts refused."""
    wav, texts, segs = load_data_dir(wav_scp, text, segments)
    if not allow_pipes:
        refuse_pipes(wav, wav_scp)
    if not texts:
        raise UsageError("holds no transcripts", shard=text)
    return DataDir(wav_scp, text, segments, wav, texts, segs)


def run_make(wav_scp: str, text: str, out_dir: str, settings: MakeSettings, options: RunOptions | None = None, *,
             segments: str | None = None) -> MakeReport:
    """Pack a Kaldi data directory into shards under ``out_dir`` (a folder or a URL); see the module docstring.

    ``options`` (:class:`~shardkit.run.options.RunOptions`): jobs, executor and Ray address (where
    probing and shard writing run), overwrite, progress (one stage, ``make``, a ``done`` event per
    shard), and ``split=(I, N)``: every slice plans the same shards, then writes only slice I of N of
    them, reported as make.slice-I-of-N.json and data.slice-I-of-N.list for ``shardkit merge-reports``.
    """
    options = options or RunOptions()
    check_settings(settings, has_segments=segments is not None)
    data = read_data_dir(wav_scp, text, segments, allow_pipes=settings.allow_pipes)
    claim_inputs = data.claim_inputs()
    started = time.perf_counter()
    return claimed_run(out_dir, claim_inputs, options.split, lambda out, journal_dir: write_shards(
        plan_data_dir(data, claim_inputs, settings, options, started), out, journal_dir, settings, options))


def plan_data_dir(data: DataDir, claim_inputs: list[str], settings: MakeSettings, options: RunOptions,
                  started: float) -> PlannedShards:
    """Pair, probe (through the executor), check and cut the directory's utterances into shards."""
    utterances, findings, warnings = match_utterances(data.wav, data.texts, data.segs)
    needed = list(dict.fromkeys(u["recording"] for u in utterances))
    # relative paths are relative to where the command runs, as in Kaldi recipes
    probes = probe_recordings([_absolute(data.wav[r]) for r in needed], options)
    utterances, unreadable = attach_durations(utterances, probes)
    findings += unreadable
    utterances, key_map, repeated = map_member_keys(utterances)
    findings += repeated
    plan = plan_shards([u["seconds"] for u in utterances], shard_duration=settings.shard_duration,
                       utts_per_shard=settings.utts_per_shard)
    return PlannedShards(len(plan), lambda i: [utterances[j] for j in plan[i]], findings, warnings, data.recorded(),
                         claim_inputs, started, extra={"key_map": key_map})


def _absolute(entry: WavEntry) -> WavEntry:
    if entry.is_pipe or is_url(entry.location):
        return entry
    return replace(entry, location=os.path.abspath(entry.location))
