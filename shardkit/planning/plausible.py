"""What a number of bytes can hold: a bound no audio codec passes, for plans built from index records.

Pure (numbers in, numbers out). The tightest lossless case is FLAC's: a frame of at most 65,535 samples in at
least 10 bytes (a mono constant subframe) — 6,554 frames a byte. Lossy codecs at their lowest rates hold far
fewer (Opus at 6 kb/s: 64 frames a byte at 48 kHz). An utterance claiming more frames than
``MAX_FRAMES_PER_BYTE`` times its bytes is a header lie, not audio, and a plan must not be built on it.
"""

from __future__ import annotations

MAX_FRAMES_PER_BYTE = 8192


def impossible_duration(seconds: float, sample_rate: float | None, member_bytes: float | None) -> str | None:
    """Why ``seconds`` of audio at ``sample_rate`` cannot be in ``member_bytes`` bytes, or None when it can
    (or when the record does not say its rate or bytes)."""
    if not sample_rate or member_bytes is None or seconds != seconds:  # NaN is refused elsewhere
        return None
    frames = seconds * sample_rate
    most = max(member_bytes, 0) * MAX_FRAMES_PER_BYTE
    if frames <= most:
        return None
    return (f"{seconds:.3f} s at {sample_rate:g} Hz ({frames:.0f} frames) cannot be held in {member_bytes:g} bytes "
            f"(no codec stores more than {MAX_FRAMES_PER_BYTE} frames a byte): its header lies")
