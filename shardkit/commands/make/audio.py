"""The audio of one utterance as it goes into a shard: the source bytes kept, or decoded, cut to its
segment and channel, resampled and re-encoded as 16-bit PCM (``MakeSettings.audio_format``)."""

from __future__ import annotations

import os

import numpy as np

from shardkit.commands.make.kaldi import run_pipe
from shardkit.commands.make.settings import MakeSettings
from shardkit.errors import AudioError
from shardkit.io.tar import AUDIO_EXTENSIONS


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


def _decoded_bytes(utt: dict) -> tuple[np.ndarray, int]:
    """The samples of an utterance whose source is not a file (a command, URL, tar member, Parquet cell)."""
    from shardkit.io.audio import decode, decode_torchaudio, sniff_format

    data = _source_bytes(utt)
    try:
        samples, rate = decode(data, "float32")
    except AudioError:
        if sniff_format(data) not in ("m4a", "wma"):
            raise
        samples, rate = decode_torchaudio(data)  # what libsndfile cannot read, through FFmpeg (torch extra)
    first, last = _frame_range(utt, rate, len(samples))
    return samples[first:last], rate


def _read_samples(utt: dict) -> tuple[np.ndarray, int]:
    """The utterance's samples as float32 (frames, channels), cut to its segment."""
    import soundfile as sf

    from shardkit.io.audio import UNKNOWN_FRAMES, open_soundfile, read_to_end

    source = utt["source"]
    if "path" not in source:
        return _decoded_bytes(utt)
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
    if settings.audio_format == "keep":
        return _kept_audio(utt)
    return _encoded_audio(utt, settings)


def _kept_audio(utt: dict) -> tuple[str, bytes]:
    """The source bytes untouched, named by the format they hold; a truncated WAV is refused."""
    from shardkit.io.audio import probe, sniff_format

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


def _encoded_audio(utt: dict, settings: MakeSettings) -> tuple[str, bytes]:
    """The utterance decoded, cut to its segment and channel, resampled when asked, encoded as 16-bit PCM."""
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
