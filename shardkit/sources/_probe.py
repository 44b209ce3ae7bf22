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
        return err.reason
    if info["sample_rate"] <= 0 or info["frames"] <= 0:
        return f"holds no audio ({info['frames']} frames)"
    if info["frames_declared"] > info["frames"]:
        return f"WAV header promises {info['frames_declared']} frames, the data holds {info['frames']} (truncated)"
    return info["frames"] / info["sample_rate"], info["sample_rate"], info["channels"]
