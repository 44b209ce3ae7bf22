"""Header facts of audio: bytes in hand (a tar member, a Parquet cell) or a file, URL or command;
never a full decode."""

from __future__ import annotations

import os

from ..audio import parse_wav_header, probe
from ..errors import AudioError, ShardkitError
from ..remote import is_url


def probe_bytes(data: bytes) -> tuple[float, int, int] | str:
    """``(seconds, sample_rate, channels)``, or the reason the bytes are not usable audio."""
    if not data:
        return "empty audio"
    try:
        info = probe(data)
    except AudioError as err:
        facts = probe_torchcodec(data)  # m4a, wma, ...: what libsndfile does not read
        return facts if facts is not None else err.reason
    if info["sample_rate"] <= 0 or info["frames"] <= 0:
        return f"holds no audio ({info['frames']} frames)"
    if info["frames_declared"] > info["frames"]:
        return f"WAV header promises {info['frames_declared']} frames, the data holds {info['frames']} (truncated)"
    return info["frames"] / info["sample_rate"], info["sample_rate"], info["channels"]


def probe_torchcodec(data: bytes) -> tuple[float, int, int] | None:
    """Header facts through torchcodec/FFmpeg (the torch extra) for containers libsndfile cannot read;
    None when it is not installed or cannot read them either."""
    from ..audio import sniff_format

    if sniff_format(data) not in ("m4a", "wma", "mp3", "ogg"):
        return None
    try:
        from torchcodec.decoders import AudioDecoder

        meta = AudioDecoder(data).metadata
    except Exception:  # not installed, or FFmpeg cannot open it: the soundfile reason stands
        return None
    seconds = meta.duration_seconds_from_header
    if not seconds or not meta.sample_rate:
        return None
    return float(seconds), int(meta.sample_rate), int(meta.num_channels or 1)


def probe_audio(location: str) -> tuple | str:
    """``(seconds, sample_rate, channels, size, mtime_ns)`` of a file, URL or ``pipe:`` command
    from its header, or the reason it cannot be read."""
    import soundfile as sf

    try:
        if location.startswith("pipe:") or is_url(location):
            if location.startswith("pipe:"):
                from ..kaldi import run_pipe

                data = run_pipe(location[5:], key=location)
            else:
                from .fetch import _url_bytes

                data = _url_bytes(location)
            facts = probe_bytes(data)
            return facts if isinstance(facts, str) else (*facts, len(data), 0)
        with open(location, "rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(1 << 16)
        if head[:4] == b"RIFF" and head[8:12] == b"WAVE":  # PCM WAV: our own header parser, ~30x faster
            try:
                wav = parse_wav_header(head)
            except ShardkitError:
                wav = None
            unknown_size = wav is not None and wav.frames_declared * wav.block_align == len(head) - wav.data_offset
            if wav is not None and not (unknown_size and st.st_size > len(head)):
                present = (st.st_size - wav.data_offset) // wav.block_align
                if wav.frames_declared > present:
                    return f"{location}: WAV header promises {wav.frames_declared} frames, the file holds " \
                           f"{present} (truncated)"
                if wav.frames_declared <= 0:
                    return f"{location} holds no audio (0 frames)"
                return (wav.frames_declared / wav.sample_rate, wav.sample_rate, wav.channels, st.st_size,
                        st.st_mtime_ns)
        try:
            info = sf.info(location)
        except Exception as err:  # libsndfile reports every failure as one generic error
            return f"cannot read the audio header of {location} ({err})"
        if info.samplerate <= 0 or info.frames <= 0:
            return f"{location} holds no audio ({info.frames} frames)"
        return info.frames / info.samplerate, info.samplerate, info.channels, st.st_size, st.st_mtime_ns
    except ShardkitError as err:
        return err.reason
    except OSError as err:
        return f"cannot read {location} ({err.strerror or err})"
