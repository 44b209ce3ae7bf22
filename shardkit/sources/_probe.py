"""Header facts of audio bytes already in hand (a tar member, a Parquet cell): never a full decode."""

from __future__ import annotations

from ..audio import probe
from ..errors import AudioError


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
