"""make: a Kaldi data directory (wav.scp, text, optional segments) into WeNet-style shards.

Four steps: ``match_utterances`` pairs transcripts with audio and lists what cannot be paired
(pure); ``probe_recordings`` reads audio headers for durations; ``plan_shards`` cuts the
utterances, in transcript order, into shards of about equal seconds or of a fixed count (pure);
``make_shard`` writes one shard (a task: result dict, never an exception for bad data).
``run_make`` ties them together like ``convert``: through ``lifecycle`` (output claimed and
locked, every file written atomically and verified, a journal to resume from) and
``executor.run_tasks`` (inline, a local pool or Ray; ``--split I/N`` writes slice I of the planned
shards, joined by ``shardkit merge-reports --command make``); OUT_DIR may be a URL.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np

from shardkit import __version__
from shardkit.commands.make.kaldi import (
    Segment,
    WavEntry,
    parse_segments,
    parse_text,
    parse_wav_scp,
    read_table,
    run_pipe,
)
from shardkit.errors import AudioError, ShardkitError, UsageError
from shardkit.io.audio import EMPTY_AUDIO, HEADER_CHECKS
from shardkit.io.codecs import CODECS, open_writer
from shardkit.io.files import HashingFile, load_report, output_unchanged, publish_list
from shardkit.io.remote import is_url
from shardkit.io.indexfile import ShardRecords, index_beside
from shardkit.io.tar import AUDIO_EXTENSIONS, TarWriter
from shardkit.io.text import EMPTY_TEXT, key_control_problem, text_problems
from shardkit.run.executor import run_tasks
from shardkit.io.files import AtomicFile, atomic_write_json
from shardkit.run.lifecycle import (
    Journal,
    claim_output,
    claimed_output_dir,
    os_reason,
    remove_leftovers,
    this_run,
    this_run_counts,
    verify_stream,
)
from shardkit.run.split import inputs_digest, slice_path, slice_record

MANIFEST = "make.json"
JOURNAL = ".make.journal.jsonl"
AUDIO_FORMATS = ("keep", "wav", "flac")
DEFAULT_SHARD_SECONDS = 3600.0
# Kaldi's extract-segments accepts a segment ending up to 0.5 s after its recording (--max-overshoot).
MAX_SEGMENT_OVERSHOOT = 0.5
_PROBE_CHUNK = 64


@dataclass(frozen=True)
class MakeSettings:
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
        return {"codec": self.codec, "level": self.level, "audio_format": self.audio_format,
                "resample": self.resample}


# a header a decoder refuses or reads differently is a finding under shardkit.io.audio's own check name
HEADER_FINDINGS = (*HEADER_CHECKS, EMPTY_AUDIO)


def finding(key: str, check: str, reason: str) -> dict:
    return {"key": key, "check": check, "reason": reason}


# ---------------------------------------------------------------- pairing (pure)

def check_key(key: str) -> str | None:
    """Why a key cannot name tar members (they would be unsafe to every reader), or None."""
    if key.startswith("/") or "\\" in key or ".." in key.split("/"):
        return f"key {key!r} would make an unsafe member name (absolute, backslash or '..')"
    return None


def match_utterances(wav: dict[str, WavEntry], texts: dict[str, str],
                     segments: dict[str, Segment] | None = None) -> tuple[list[dict], list[dict], list[dict]]:
    """Pair every transcript with its audio, in transcript order.

    Returns ``(utterances, findings, warnings)``. An utterance is ``{"key", "text", "recording",
    "start", "end"}`` (``start``/``end`` in seconds, None without segments). Findings name each key
    that is skipped and why; a recording no segment uses is only a warning (Kaldi's own
    ``fix_data_dir.sh`` drops those silently).
    """
    utterances: list[dict] = []
    findings: list[dict] = []
    for key, text in texts.items():
        recording, start, end = key, None, None
        if segments is not None:
            segment = segments.get(key)
            if segment is None:
                findings.append(finding(key, "no_segment", "in text but not in segments"))
                continue
            recording, start, end = segment.recording, segment.start, segment.end
        if recording not in wav:
            where = "in text but not in wav.scp" if segments is None else \
                f"its recording {recording!r} is not in wav.scp"
            findings.append(finding(key, "no_audio", where))
            continue
        problems = [("empty_transcript", "empty transcript" if not text.strip() else message) if check == EMPTY_TEXT
                    else (check, message) for check, message in text_problems(text)]
        if (control := key_control_problem(key)) is not None:
            problems.append(control)
        if problems:  # an utterance a tokenizer or a list line cannot take is not packed
            findings += [finding(key, check, message) for check, message in problems]
            continue
        unsafe = check_key(key)
        if unsafe:
            findings.append(finding(key, "unsafe_key", unsafe))
            continue
        utterances.append({"key": key, "text": text, "recording": recording, "start": start, "end": end})
    warnings: list[dict] = []
    if segments is None:
        findings += [finding(key, "no_transcript", "in wav.scp but not in text") for key in wav if key not in texts]
    else:
        findings += [finding(utt, "no_transcript", "in segments but not in text") for utt in segments
                     if utt not in texts]
        used = {s.recording for s in segments.values()}
        warnings += [finding(key, "unused_recording", "in wav.scp but no segment uses it") for key in wav
                     if key not in used]
    return utterances, findings, warnings


# ---------------------------------------------------------------- durations

def probe_recording(entry: WavEntry) -> dict:
    """Header facts of one recording: seconds, sample_rate, channels, and what identifies the source.

    A pipe entry's command runs here for its header and again when its shard is written: nothing
    is kept between the two (the audio may be large, and memory stays at one utterance).
    """
    from shardkit.io.audio import probe

    try:
        if entry.is_pipe:
            info = probe(run_pipe(entry.location, key=entry.key))
            return {"seconds": info["duration"], "sample_rate": info["sample_rate"], "channels": info["channels"],
                    "source": {"command": entry.location}}
        from shardkit.commands.make.sources._probe import (
            probe_audio,  # WAV headers by shardkit's parser, others by soundfile
        )

        facts = probe_audio(entry.location)
        if isinstance(facts, str):
            return {"error": str(facts), "check": getattr(facts, "check", "unreadable_audio")}
        seconds, rate, channels, size, mtime_ns = facts
        source = ({"url": entry.location, "name": entry.location, "size": size} if is_url(entry.location)
                  else {"path": entry.location, "size": size, "mtime_ns": mtime_ns})  # checked when read again
        return {"seconds": seconds, "sample_rate": rate, "channels": channels, "source": source}
    except ShardkitError as err:
        return {"error": err.reason, "check": err.check if err.check in HEADER_FINDINGS else "unreadable_audio"}
    except OSError as err:
        return {"error": f"cannot read {entry.location} ({err.strerror or err})"}


def _probe_chunk(entries: list[WavEntry]) -> list[dict]:
    return [probe_recording(e) for e in entries]


def attach_durations(utterances: list[dict], probes: dict[str, dict]) -> tuple[list[dict], list[dict]]:
    """Give each utterance its ``seconds`` and source facts (pure); unreadable or out-of-range ones become findings."""
    kept, findings = [], []
    for utt in utterances:
        info = probes[utt["recording"]]
        if "error" in info:
            findings.append(finding(utt["key"], info.get("check", "unreadable_audio"), info["error"]))
            continue
        total = info["seconds"]
        start, end = utt["start"], utt["end"]
        if start is None:
            seconds = total
        else:
            stop = total if end is None else end
            if start >= total or stop > total + MAX_SEGMENT_OVERSHOOT:
                findings.append(finding(utt["key"], "segment_out_of_range",
                                        f"segment {start:g}-{stop:g} s lies outside recording {utt['recording']!r} "
                                        f"({total:.3f} s)"))
                continue
            seconds = min(stop, total) - start
        kept.append({**utt, "seconds": round(seconds, 6), "sample_rate": info["sample_rate"],
                     "source": info["source"]})
    return kept, findings


# ---------------------------------------------------------------- planning (pure)

def plan_shards(durations: list[float], *, shard_duration: float | None = None,
                utts_per_shard: int | None = None) -> list[list[int]]:
    """Cut utterance indices, in order, into shards; returns one index list per shard.

    By count: ``utts_per_shard`` each (WeNet's rule), the last one shorter. By duration:
    ``ceil(total / shard_duration)`` shards, cut where the running total is closest to each
    multiple of ``total / n``, so all shards hold about equal seconds (never a small leftover);
    a shard may exceed ``shard_duration`` by less than one utterance.
    """
    cuts = plan_cuts(durations, shard_duration=shard_duration, utts_per_shard=utts_per_shard)
    return [list(range(a, b)) for a, b in zip(cuts[:-1], cuts[1:])]


def plan_cuts(durations, *, shard_duration: float | None = None, utts_per_shard: int | None = None) -> list[int]:
    """``plan_shards`` as boundaries: shard ``k`` holds utterances ``cuts[k]:cuts[k + 1]`` (no list per
    utterance, for large manifests); ``[]`` when there is no utterance."""
    count = len(durations)
    if count == 0:
        return []
    if utts_per_shard is not None:
        if utts_per_shard < 1:
            raise ValueError("utts_per_shard must be at least 1")
        return list(range(0, count, utts_per_shard)) + [count]
    if shard_duration is None or shard_duration <= 0:
        raise ValueError("shard_duration must be positive")
    running = np.cumsum(np.asarray(durations, dtype=np.float64))
    total = float(running[-1])
    shards = min(count, max(1, math.ceil(total / shard_duration - 1e-9)))
    cuts = [0]
    for k in range(1, shards):
        target = total * k / shards
        cut = int(np.searchsorted(running, target))  # first index whose running total reaches target
        if cut > 0 and target - running[cut - 1] < running[cut] - target:
            cut -= 1
        # each shard keeps at least one utterance, and leaves one for each shard after it
        cut = min(max(cut + 1, cuts[-1] + 1), count - (shards - k))
        cuts.append(cut)
    cuts.append(count)
    return cuts


def shard_fingerprint(utterances: list[dict], settings: MakeSettings) -> str:
    """What a shard's bytes depend on: its utterances (text, source identity, cut) and the output settings."""
    content = {"settings": settings.output_affecting(),
               "utterances": [[u["key"], u["text"], u["source"], u["start"], u["end"]]
                              + ([u["channel"]] if u.get("channel") is not None else []) for u in utterances]}
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


# ---------------------------------------------------------------- audio of one utterance

def to_int16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1) to 16-bit PCM, clipping anything beyond full scale.

    A plain ``(x * 32768).astype(int16)`` turns +1.0 into -32768 (a full-scale click of the
    opposite sign); resampling overshoots full scale near clipped peaks, so this matters.
    """
    return np.clip(np.rint(samples.astype(np.float64) * 32768.0), -32768, 32767).astype(np.int16)


def _keep_extension(location: str, fmt: str) -> str:
    from shardkit.io.audio import EXTENSION_FORMATS

    ext = os.path.splitext(location)[1].lstrip(".").lower()
    return ext if ext in AUDIO_EXTENSIONS and EXTENSION_FORMATS.get(ext) == fmt else fmt


def _source_bytes(utt: dict) -> bytes:
    source = utt["source"]
    if "command" in source:
        return run_pipe(source["command"], key=utt["key"])
    if "path" not in source:  # a URL, a tar member, a Parquet row: see shardkit.commands.make.sources.fetch
        from shardkit.commands.make.sources.fetch import source_bytes

        return source_bytes(source)
    with open(source["path"], "rb") as f:
        return f.read()


def _read_samples(utt: dict) -> tuple[np.ndarray, int]:
    """The utterance's samples as float32 (frames, channels), cut to its segment."""
    import soundfile as sf

    from shardkit.io.audio import UNKNOWN_FRAMES, decode, decode_torchaudio, open_soundfile, read_to_end, sniff_format

    source = utt["source"]
    if "path" not in source:
        data = _source_bytes(utt)
        try:
            samples, rate = decode(data, "float32")
        except AudioError:
            if sniff_format(data) not in ("m4a", "wma"):
                raise
            samples, rate = decode_torchaudio(data)  # what libsndfile cannot read, through FFmpeg (torch extra)
        first, last = _frame_range(utt, rate, len(samples))
        return samples[first:last], rate
    try:
        with open_soundfile(source["path"]) as f:
            rate = f.samplerate
            if f.frames >= UNKNOWN_FRAMES:  # a FLAC of unknown length: decoded to its end, then cut
                samples = read_to_end(f, "float32")
                first, last = _frame_range(utt, rate, len(samples))
                return samples[first:last], rate
            first, last = _frame_range(utt, rate, f.frames)
            f.seek(first)
            samples = f.read(last - first, dtype="float32", always_2d=True)
    except sf.LibsndfileError as err:
        raise AudioError(f"soundfile cannot decode {source['path']} ({err})") from err
    return samples, rate


def _frame_range(utt: dict, rate: int, frames: int) -> tuple[int, int]:
    if utt["start"] is None:
        return 0, frames
    first = min(frames, int(round(utt["start"] * rate)))
    last = frames if utt["end"] is None else min(frames, int(round(utt["end"] * rate)))
    return first, last


def utterance_audio(utt: dict, settings: MakeSettings) -> tuple[str, bytes]:
    """``(extension, audio bytes)`` of one utterance as it goes into the shard. Raises AudioError."""
    from shardkit.io.audio import probe, sniff_format

    if settings.audio_format == "keep":
        data = _source_bytes(utt)
        fmt = sniff_format(data)
        if fmt is None:
            raise AudioError("audio format not recognised from its bytes (not WAV, FLAC, Ogg, MP3, M4A, WMA)")
        if fmt == "wav":
            info = probe(data)
            if info["frames_declared"] > info["frames"]:
                raise AudioError(f"WAV header promises {info['frames_declared']} frames, the file holds "
                                 f"{info['frames']} (truncated)")
        location = utt["source"].get("path") or utt["source"].get("name") or ""
        return _keep_extension(location, fmt), data
    samples, rate = _read_samples(utt)
    channel = utt.get("channel")
    if channel is not None:
        if channel >= samples.shape[1]:
            raise AudioError(f"no channel {channel}: the audio has {samples.shape[1]}")
        samples = samples[:, channel:channel + 1]
    if len(samples) == 0:
        raise AudioError("no audio frames in the segment")
    if settings.resample and settings.resample != rate:
        import soxr

        samples = soxr.resample(samples, rate, settings.resample, quality="HQ")
        rate = settings.resample
    from shardkit.io.synth import encode

    return settings.audio_format, encode(to_int16(samples), rate, settings.audio_format, subtype="PCM_16")


# ---------------------------------------------------------------- one shard

READ_AHEAD_BYTES = 8 << 20  # the next utterance is read while this one is written when its file is this small


def _audio_or_error(utt: dict, settings: MakeSettings):
    try:
        return utterance_audio(utt, settings)
    except (AudioError, OSError) as err:
        return err


def read_ahead(utterances: list[dict], settings: MakeSettings):
    """``(utterance, (extension, audio bytes) or the AudioError/OSError)`` in order. The next utterance
    is read (and decoded, encoded) in a thread while the caller writes and hashes this one, so a cold
    disk's or a URL's latency overlaps the hashing; only a file or URL whose size is known and at most
    READ_AHEAD_BYTES, so that at most one large member is ever held."""
    from concurrent.futures import ThreadPoolExecutor

    def small(utt: dict) -> bool:  # a file or URL (a tar member is one seek away in a file already open)
        source = utt["source"]
        size = source.get("size")
        return ("path" in source or "url" in source) and isinstance(size, int) and size <= READ_AHEAD_BYTES

    with ThreadPoolExecutor(1, thread_name_prefix="shardkit-read-ahead") as reader:
        ahead = None
        for i, utt in enumerate(utterances):
            got = ahead.result() if ahead is not None else _audio_or_error(utt, settings)
            following = utterances[i + 1] if i + 1 < len(utterances) else None
            ahead = reader.submit(_audio_or_error, following, settings) if following and small(following) else None
            yield utt, got


def make_shard(dst: str, utterances: list[dict], settings: MakeSettings) -> dict:
    """Write one shard (``<key>.txt`` then ``<key>.<audio>`` per utterance) atomically.

    An utterance whose audio cannot be read is skipped and listed; a shard left with no
    utterance is not written (``status: empty``).
    """
    started = time.perf_counter()
    result: dict = {"output": None, "status": "failed", "error": None, "utterances": 0, "seconds": 0.0,
                    "tar_bytes": 0, "skipped": []}
    try:
        with AtomicFile(dst) as target:
            hashing = HashingFile(target.file)
            out = open_writer(hashing, settings.codec, settings.level)
            # the tar stream's digest, computed while writing, is what the read-back is checked against
            # (for a plain tar the file's own digest, which the report records anyway)
            stream = hashing if settings.codec == "none" else HashingFile(out)
            tar = TarWriter(stream)
            written: list[tuple[str, int]] = []
            # the index of what is written, as a by-product (offsets from the writer, facts from the header)
            indexed = ShardRecords.for_shard(dst)
            for utt, got in read_ahead(utterances, settings):
                if isinstance(got, AudioError):
                    check = got.check if got.check in HEADER_FINDINGS else "unreadable_audio"
                    result["skipped"].append(finding(utt["key"], check, got.reason))
                    continue
                if isinstance(got, OSError):
                    result["skipped"].append(finding(utt["key"], "unreadable_audio",
                                                     f"cannot read {got.filename or ''} ({got.strerror or got})"))
                    continue
                ext, audio = got
                text = utt["text"].encode("utf-8")
                for name, data in ((f"{utt['key']}.txt", text), (f"{utt['key']}.{ext}", audio)):
                    tar.add(name, data)
                    written.append((name, len(data)))
                    indexed.add_written(tar.offset, name, data, len(data))
                result["utterances"] += 1
                result["seconds"] += utt["seconds"]
            result["tar_bytes"] = tar.close()
            out.close()
            result["seconds"] = round(result["seconds"], 3)
            if result["utterances"] == 0:
                result["status"] = "empty"  # leaving the block unpublished removes the temporary file
            else:
                readback = verify_stream(written, stream.sha256.digest(), stream.size, shard=dst)
                target.commit(readback if settings.verify else None, sync_while_verifying=True)
                result["index_error"] = indexed.save()
                result["output"] = {"path": dst, "size": hashing.size, "sha256": hashing.sha256.hexdigest()}
                result["status"] = "ok"
    except ShardkitError as err:
        result["error"] = str(err.located(shard=dst))
    except OSError as err:
        result["error"] = f"{dst}: {os_reason(err)}" + (f" ({err.filename})" if err.filename else "")
    result["elapsed"] = round(time.perf_counter() - started, 4)
    return result


def _shard_task(args):
    dst, utterances, settings, fingerprint = args
    entry = make_shard(dst, utterances, settings)
    entry["fingerprint"] = fingerprint
    entry["keys"] = [u["key"] for u in utterances]
    return entry


def _shard_failed(task, error: ShardkitError) -> dict:
    """The entry of a shard task that raised (any library's exception) or whose worker died: that shard failed."""
    dst, _, _, fingerprint = task
    return {"output": None, "status": "failed", "error": str(error.located(shard=dst)), "utterances": 0,
            "seconds": 0.0, "tar_bytes": 0, "skipped": [], "fingerprint": fingerprint, "keys": []}


def _still_valid(entry: dict | None, fingerprint: str) -> bool:
    if not entry or entry.get("status") != "ok" or entry.get("fingerprint") != fingerprint:
        return False
    return output_unchanged(entry["output"]["path"], entry["output"]["size"], entry["output"]["sha256"])


# ---------------------------------------------------------------- the run

@dataclass
class MakeReport:
    out_dir: str
    data_list: str
    manifest: str
    shards: list[dict] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    slice: dict | None = None  # with --split: the slice of the planned shards this run wrote
    index: str | None = None  # index.parquet beside data.list (None: see index_note)
    index_note: str | None = None

    @property
    def skipped_utterances(self) -> list[dict]:
        return self.findings + [s for e in self.shards for s in e.get("skipped", [])]

    def summary(self) -> dict:
        listed = [e for e in self.shards if e["status"] in ("ok", "skipped")]
        counts = {s: sum(1 for e in self.shards if e["status"] == s) for s in ("ok", "skipped", "failed", "empty")}
        skipped = self.skipped_utterances
        return {
            "command": "make",
            "out_dir": self.out_dir,
            "data_list": self.data_list,
            "manifest": self.manifest,
            "shards": len(listed),
            "shard_status": counts,
            "this_run": this_run_counts(self.shards),
            **({"slice": self.slice} if self.slice else {}),
            "utterances": sum(e["utterances"] for e in listed),
            "audio_seconds": round(sum(e["seconds"] for e in listed), 3),
            "bytes_out": sum(e["output"]["size"] for e in listed),
            "skipped_utterances": len(skipped),
            "skipped_by_check": {c: sum(1 for s in skipped if s["check"] == c) for c in
                                 sorted({s["check"] for s in skipped})},
            "findings": skipped,
            "warnings": len(self.warnings),
            "failures": [{"shard": e["planned_path"], "error": e["error"]} for e in self.shards
                         if e["status"] == "failed"],
            "seconds": round(self.seconds, 3),
            "index": self.index, **({"index_note": self.index_note} if self.index_note else {}),
        }

    def recorded_summary(self) -> dict:
        """The summary make.json keeps (findings are listed beside it)."""
        return {k: v for k, v in self.summary().items() if k not in ("findings", "slice", "index", "index_note")}

    @property
    def exit_code(self) -> int:
        return 1 if self.skipped_utterances or any(e["status"] == "failed" for e in self.shards) else 0


def load_data_dir(wav_scp: str, text: str, segments: str | None) -> tuple[dict, dict, dict | None]:
    return (parse_wav_scp(read_table(wav_scp), wav_scp), parse_text(read_table(text), text),
            parse_segments(read_table(segments), segments) if segments else None)


def check_settings(settings: MakeSettings, *, has_segments: bool) -> None:
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


def refuse_pipes(wav: dict[str, WavEntry], wav_scp: str) -> None:
    pipes = [e for e in wav.values() if e.is_pipe]
    if pipes:
        first = pipes[0]
        raise UsageError(f"line {first.line}: key {first.key!r} is a command pipe ({first.location} |)"
                         f"{f' and {len(pipes) - 1} more entries are too' if len(pipes) > 1 else ''}; "
                         f"shardkit make reads audio files only unless --allow-pipes lets it run these commands",
                         shard=wav_scp)


def probe_recordings(entries: list[WavEntry], *, jobs: int | None = None, executor: str = "local",
                     ray_address: str | None = None) -> dict[str, dict]:
    chunks = [entries[i:i + _PROBE_CHUNK] for i in range(0, len(entries), _PROBE_CHUNK)]
    results = [infos for _, infos in run_tasks(_probe_chunk, chunks, jobs=jobs, executor=executor,
                                                ray_address=ray_address, ordered=True)]
    return {e.key: info for chunk, infos in zip(chunks, results) for e, info in zip(chunk, infos)}


def run_make(
    wav_scp: str,
    text: str,
    out_dir: str,
    settings: MakeSettings,
    *,
    segments: str | None = None,
    jobs: int | None = None,
    overwrite: bool = False,
    on_plan: Callable[[int], None] | None = None,
    on_result: Callable[[dict], None] | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    split: tuple[int, int] | None = None,
) -> MakeReport:
    """Pack a Kaldi data directory into shards under ``out_dir`` (a folder or a URL); see the module docstring.

    ``executor``/``ray_address``: where probing and shard writing run (shardkit.run.executor).
    ``split=(I, N)``: every slice plans the same shards, then writes only slice I of N of them,
    reported as make.slice-I-of-N.json and data.slice-I-of-N.list for ``shardkit merge-reports``.
    """
    check_settings(settings, has_segments=segments is not None)
    wav, texts, segs = load_data_dir(wav_scp, text, segments)
    if not settings.allow_pipes:
        refuse_pipes(wav, wav_scp)
    if not texts:
        raise UsageError("holds no transcripts", shard=text)
    inputs = [p for p in (wav_scp, text, segments) if p]
    inputs += [os.path.abspath(e.location) for e in wav.values() if not e.is_pipe and not is_url(e.location)]
    started = time.perf_counter()
    return claimed_run(out_dir, inputs, split, lambda out, journal_dir: _make(
        wav, texts, segs, wav_scp, text, segments, out, journal_dir, settings, inputs, overwrite=overwrite,
        on_plan=on_plan, on_result=on_result, started=started, jobs=jobs, executor=executor,
        ray_address=ray_address, split=split))


def _make(wav, texts, segs, wav_scp, text, segments, out_dir, journal_dir, settings, inputs, *, overwrite, on_plan,
          on_result, started, jobs, executor, ray_address, split) -> MakeReport:
    utterances, findings, warnings = match_utterances(wav, texts, segs)
    needed = list(dict.fromkeys(u["recording"] for u in utterances))
    # relative paths are relative to where the command runs, as in Kaldi recipes
    probes = probe_recordings([wav[r] if wav[r].is_pipe or is_url(wav[r].location)
                               else replace(wav[r], location=os.path.abspath(wav[r].location))
                               for r in needed], jobs=jobs, executor=executor, ray_address=ray_address)
    utterances, unreadable = attach_durations(utterances, probes)
    findings += unreadable
    utterances, key_map, repeated = map_member_keys(utterances)
    findings += repeated

    plan = plan_shards([u["seconds"] for u in utterances], shard_duration=settings.shard_duration,
                       utts_per_shard=settings.utts_per_shard)
    recorded_inputs = {"wav_scp": os.path.abspath(wav_scp), "text": os.path.abspath(text),
                       "segments": os.path.abspath(segments) if segments else None}
    return write_shards(len(plan), lambda i: [utterances[j] for j in plan[i]], findings, warnings, recorded_inputs,
                        inputs, out_dir, journal_dir, settings, overwrite=overwrite, on_plan=on_plan,
                        on_result=on_result, started=started, jobs=jobs, executor=executor, ray_address=ray_address,
                        split=split, extra={"key_map": key_map})


def map_member_keys(utterances: list[dict]) -> tuple[list[dict], dict[str, str], list[dict]]:
    """Keys with a '.' (or other characters a tar name or WeNet cannot carry) become their
    ``sources.member_key``; returns the utterances, ``{original: mapped}`` and a finding for each
    key that maps onto one already used."""
    from shardkit.commands.make.sources import member_key

    key_map: dict[str, str] = {}
    kept, repeated, seen = [], [], {u["key"] for u in utterances}
    for utt in utterances:
        mapped = member_key(utt["key"])
        if mapped != utt["key"]:
            if mapped in seen:
                repeated.append(finding(utt["key"], "duplicate_key", f"its member key {mapped!r} is already used"))
                continue
            seen.add(mapped)
            key_map[utt["key"]] = mapped
            utt = {**utt, "key": mapped}
        kept.append(utt)
    return kept, key_map, repeated


def claimed_run(out_dir: str, claim_inputs: list[str], split: tuple[int, int] | None, body: Callable[[str, str], MakeReport]) -> MakeReport:
    """``body(out_dir, journal_dir)`` inside ``lifecycle.claimed_output_dir`` (OUT_DIR claimed, created
    and locked; a URL's journal in a local folder)."""
    with claimed_output_dir(out_dir, claim_inputs, "make", split) as (out_dir, journal_dir):
        return body(out_dir, journal_dir)


@dataclass
class _ShardPlan:
    """The shards one run writes and where its records go: ``tasks`` are ``(path, index, settings,
    fingerprint)``; under ``--split`` only this slice's block, with the slice's own report, list and
    journal names, so that slices sharing OUT_DIR never write the same file."""
    tasks: list[tuple]
    manifest_path: str
    data_list: str
    journal_path: str
    reports: list[str]
    slice_info: dict | None = None


def _plan_writes(count: int, shard_utterances: Callable[[int], list[dict]], claim_inputs: list[str], out_dir: str,
                 journal_dir: str, settings: MakeSettings, split: tuple[int, int] | None) -> _ShardPlan:
    """Name every planned shard and claim the names (no input may be overwritten), then narrow to
    this slice: every slice plans the same shards, so each can work out its own block alone."""
    suffix = ".tar" + CODECS[settings.codec].suffix
    join = (lambda name: f"{out_dir}/{name}") if is_url(out_dir) else (lambda name: os.path.join(out_dir, name))
    tasks = [(join(f"{settings.prefix}{i:09d}{suffix}"), i, settings, shard_fingerprint(shard_utterances(i), settings))
             for i in range(count)]
    if not is_url(out_dir):
        claim_output(out_dir, claim_inputs, [t[0] for t in tasks], what="OUT_DIR")
    plan = _ShardPlan(tasks, join(MANIFEST), join("data.list"), os.path.join(journal_dir, JOURNAL), [join(MANIFEST)])
    if split is not None:  # every slice planned the same shards; each writes its own block of them
        paths = [t[0] for t in tasks]
        plan.slice_info = slice_record(paths, *split)
        plan.slice_info["inputs_sha256"] = inputs_digest(paths + [t[3] for t in tasks])
        plan.tasks = tasks[plan.slice_info["start"]:plan.slice_info["stop"]]
        plan.manifest_path, plan.data_list, plan.journal_path = (
            slice_path(p, *split) for p in (plan.manifest_path, plan.data_list, plan.journal_path))
        plan.reports.insert(0, plan.manifest_path)
    return plan


def _previous_entries(plan: _ShardPlan, journal: Journal, overwrite: bool) -> dict[str, dict]:
    """What earlier runs recorded per shard path (their reports, then the journal of a killed run,
    which wins), so a rerun can skip shards still valid; nothing with ``overwrite``."""
    previous: dict[str, dict] = {}
    if not overwrite:
        for entry in [e for path in plan.reports for e in (load_report(path) or {}).get("shards", [])] + journal.load():
            if entry.get("output"):
                previous[entry["output"]["path"]] = entry
    return previous


def _clear_leftovers(tasks: list[tuple], out_dir: str) -> None:
    """Remove the temporary files of a killed run (its lock died with it), and on a store its
    temporary keys, before any shard is written under the same names."""
    remove_leftovers(t[0] for t in tasks)
    if is_url(out_dir):
        from shardkit.io.files import remove_temporary_keys

        remove_temporary_keys([t[0] for t in tasks])


def _split_done(tasks: list[tuple], previous: dict[str, dict], overwrite: bool,
                on_result) -> tuple[dict[int, dict], list[tuple[int, tuple]]]:
    """Sort the tasks into shards a previous run finished with the same fingerprint (reported as
    skipped right away, so progress counts them) and ``(index, task)`` pairs still to write."""
    results: dict[int, dict] = {}
    todo = []
    for i, task in enumerate(tasks):
        entry = previous.get(task[0])
        if not overwrite and _still_valid(entry, task[3]):
            results[i] = {**entry, "status": "skipped", "this_run": "skipped", "planned_path": task[0]}
            if on_result:
                on_result(results[i])
        else:
            todo.append((i, task))
    return results, todo


def _write_todo(todo: list[tuple[int, tuple]], shard_utterances: Callable[[int], list[dict]], results: dict[int, dict],
                journal: Journal, on_result, *, jobs: int | None, executor: str, ray_address: str | None) -> None:
    """Write the shards left to do through the executor, journaling each result as it arrives so
    that a killed run resumes; the utterances of a shard are built only when it is handed out."""
    def with_members(task):
        return (task[0], shard_utterances(task[1]), *task[2:])

    try:
        for k, entry in run_tasks(_shard_task, [task for _, task in todo], jobs=jobs, executor=executor,
                                  ray_address=ray_address, prepare=with_members, on_error=_shard_failed):
            i, task = todo[k]
            entry["planned_path"] = task[0]
            entry["this_run"] = this_run(entry["status"])
            results[i] = entry
            journal.append(entry)
            if on_result:
                on_result(entry)
    finally:
        journal.close(remove=False)


def _write_records(plan: _ShardPlan, results: dict[int, dict], findings: list[dict], warnings: list[dict],
                   inputs: dict, settings: MakeSettings, out_dir: str, started: float,
                   extra: dict | None) -> MakeReport:
    """data.list (the shards that exist, in plan order) and make.json, written last so that a
    finished report always describes complete shards; a skipped shard is recorded as ok."""
    ordered = [results[i] for i in range(len(plan.tasks))]
    report = MakeReport(out_dir=out_dir, data_list=plan.data_list, manifest=plan.manifest_path,
                        shards=ordered, findings=findings, warnings=warnings,
                        seconds=time.perf_counter() - started, slice=plan.slice_info)
    listed = [e["output"]["path"] for e in ordered if e["status"] in ("ok", "skipped")]
    # a failed shard: data.partial.list, so that no list that looks finished lacks a shard
    report.data_list = publish_list(report.data_list, listed,
                                    complete=not any(e["status"] == "failed" for e in ordered))
    report.index, report.index_note = index_beside(report.data_list, listed)
    recorded = [{**e, "status": "ok"} if e["status"] == "skipped" else e for e in ordered]
    atomic_write_json(plan.manifest_path, {
        "tool": "shardkit", "version": __version__, "command": "make",
        "inputs": inputs,
        "settings": asdict(settings),
        **(extra or {}),
        "summary": report.recorded_summary(),
        "findings": report.skipped_utterances,
        "warnings": warnings,
        "shards": recorded,
        **({"slice": plan.slice_info} if plan.slice_info else {}),
    })
    return report


def write_shards(count: int, shard_utterances: Callable[[int], list[dict]], findings: list[dict],
                 warnings: list[dict], inputs: dict, claim_inputs: list[str], out_dir: str, journal_dir: str,
                 settings: MakeSettings, *, overwrite: bool, on_plan, on_result, started: float,
                 jobs: int | None, executor: str, ray_address: str | None, split: tuple[int, int] | None,
                 extra: dict | None = None) -> MakeReport:
    """Write the planned shards (``shard_utterances(i)``: the utterance dicts of shard ``i``, built
    just before the shard is handed to a worker, so that only the shards in flight are held), then
    data.list and make.json. ``inputs`` is recorded in make.json; ``claim_inputs`` are the files no
    output may be.

    Steps: plan (name, claim and slice), resume (earlier records, leftovers, shards still valid),
    write (the rest, journaled), record (data.list, make.json; the journal goes last)."""
    plan = _plan_writes(count, shard_utterances, claim_inputs, out_dir, journal_dir, settings, split)
    journal = Journal(plan.journal_path)
    previous = _previous_entries(plan, journal, overwrite)
    _clear_leftovers(plan.tasks, out_dir)
    if on_plan:
        on_plan(len(plan.tasks))
    results, todo = _split_done(plan.tasks, previous, overwrite, on_result)
    _write_todo(todo, shard_utterances, results, journal, on_result, jobs=jobs, executor=executor,
                ray_address=ray_address)
    report = _write_records(plan, results, findings, warnings, inputs, settings, out_dir, started, extra)
    journal.close(remove=True)
    return report


def merge_slice_reports(docs: list[dict], out_dir: str) -> dict:
    """The make.json one run over every planned shard would have written, from slice reports in order.

    Every slice found the same pairing findings (each put them before its own shards' skipped
    utterances); the summary is recomputed over all shards.
    """
    first = docs[0]
    own = sum(len(e.get("skipped") or []) for e in first["shards"])
    match_findings = first["findings"][:len(first["findings"]) - own]
    shards = [e for doc in docs for e in doc["shards"]]
    report = MakeReport(out_dir=out_dir, data_list=os.path.join(out_dir, "data.list"),
                        manifest=os.path.join(out_dir, MANIFEST),
                        shards=[{**e, "status": "skipped" if e.get("this_run") == "skipped" else e["status"]}
                                for e in shards],
                        findings=match_findings, warnings=first.get("warnings", []),
                        seconds=sum((doc.get("summary") or {}).get("seconds", 0) for doc in docs))
    merged = {k: v for k, v in first.items() if k not in ("slice", "shards")}
    merged["summary"] = report.recorded_summary()
    merged["findings"] = report.skipped_utterances
    merged["shards"] = shards
    return merged


def merge_reports(slices) -> dict:
    """merge-reports for make (``shardkit.run.merge.Slices`` in): the summary and skipped utterances are
    recomputed over every shard; a skipped utterance counts as a problem, as in a single run."""
    from shardkit.run.merge import write_merged

    merged = merge_slice_reports(slices.docs, slices.out_dir)
    return write_merged(slices, merged, skipped=len(merged.get("findings") or []))
