"""Lossless audio transcoding of members inside convert: PCM WAV <-> FLAC, samples verified.

Only lossless, exactly reversible conversions happen: integer PCM WAV (8/16/24-bit) to FLAC at
the same bit depth, rate and channels, and FLAC back to WAV. Everything else (lossy formats,
float or 32-bit WAV, members that do not decode) is kept byte for byte and reported, so nothing
is lost and nothing is silently re-encoded. Every encoded member is decoded again at once and
must give exactly the source's samples; a mismatch fails the shard.
"""

from __future__ import annotations

import hashlib
import io

import numpy as np
import soundfile as sf

from shardkit.errors import AudioError, VerificationError
from shardkit.io.audio import open_soundfile, parse_wav_header, read_to_end, sniff_format
from shardkit.io.tar import AUDIO_EXTENSIONS, split_key

# FLAC holds integer PCM up to 24 bits; libsndfile's subtypes for each depth
_WAV_TO_FLAC_SUBTYPE = {"PCM_U8": "PCM_S8", "PCM_16": "PCM_16", "PCM_24": "PCM_24"}
_FLAC_TO_WAV_SUBTYPE = {"PCM_S8": "PCM_U8", "PCM_16": "PCM_16", "PCM_24": "PCM_24"}


def pcm_digest(samples: np.ndarray, sample_rate: int) -> str:
    """Digest of decoded integer samples (as ``read_pcm`` returns them), rate and channel count."""
    h = hashlib.sha256(f"{sample_rate}:{samples.shape[1]}:{samples.dtype.str}:".encode())
    h.update(memoryview(np.ascontiguousarray(samples)).cast("B"))  # the same bytes, without a copy
    return h.hexdigest()


# 16 bits and fewer fit int16 exactly (libsndfile left-justifies 8-bit samples); 24 bits need int32
_NARROW_SUBTYPES = ("PCM_16", "PCM_U8", "PCM_S8")


def read_pcm(data: bytes) -> tuple[np.ndarray, int, str]:
    """Exact integer samples of a WAV/FLAC member: (array (frames, channels), rate, subtype).

    int16 for sources of up to 16 bits, int32 (left-justified) for 24-bit: the narrowest exact form,
    so a 16-bit WAV and its FLAC decode to identical arrays and digests.
    """
    try:
        with open_soundfile(io.BytesIO(data)) as f:  # a FLAC of unknown length is read to its end
            dtype = "int16" if f.subtype in _NARROW_SUBTYPES else "int32"
            return read_to_end(f, dtype), f.samplerate, f.subtype
    except Exception as err:  # libsndfile raises plain RuntimeError/LibsndfileError
        raise AudioError(f"does not decode ({err})") from err


_VERIFY_BLOCK = 1 << 18  # frames compared at a time: the decoded copy never exists whole


def decodes_to(encoded: bytes, samples: np.ndarray, sample_rate: int) -> bool:
    """Whether ``encoded`` decodes to exactly ``samples`` (as ``read_pcm`` returns them) at ``sample_rate``."""
    try:
        with sf.SoundFile(io.BytesIO(encoded)) as f:
            dtype = np.dtype("int16" if f.subtype in _NARROW_SUBTYPES else "int32")
            if f.samplerate != sample_rate or f.channels != samples.shape[1] or dtype != samples.dtype:
                return False
            done = 0
            for block in f.blocks(blocksize=_VERIFY_BLOCK, dtype=dtype.name, always_2d=True):
                if not np.array_equal(block, samples[done:done + len(block)]):
                    return False
                done += len(block)
            return done == len(samples)
    except Exception:  # libsndfile raises plain RuntimeError/LibsndfileError: it does not decode
        return False


def encode_pcm(samples: np.ndarray, sample_rate: int, fmt: str, subtype: str, flac_level: int | None) -> bytes:
    buf = io.BytesIO()
    kwargs = {}
    if fmt == "FLAC" and flac_level is not None:
        kwargs["compression_level"] = flac_level / 8
    sf.write(buf, samples, sample_rate, format=fmt, subtype=subtype, **kwargs)
    return buf.getvalue()


def transcode_member(name: str, data: bytes, target: str, flac_level: int | None = None, verify: bool = True):
    """``(new_name, new_data, info)`` for one member; unchanged bytes where no lossless change applies.

    ``info`` is None for non-audio members, else a dict with ``key``, ``member``, ``action``
    ("transcoded" or "kept"), the reason when kept, and ``pcm_sha256`` when samples were decoded.
    """
    key, ext = split_key(name)
    if ext.lower() not in AUDIO_EXTENSIONS:
        return name, data, None
    info = {"key": key, "member": name, "action": "kept"}
    fmt = sniff_format(data)
    source_fmt = "wav" if target == "flac" else "flac"
    if fmt != source_fmt:
        if fmt is None:
            info.update(reason="unknown or damaged audio bytes", problem=True)
        elif fmt in ("wav", "flac"):
            info["reason"] = f"already {fmt}"
        else:
            info["reason"] = f"lossy format ({fmt}): never re-encoded"
        return name, data, info
    if fmt == "wav":
        try:
            header = parse_wav_header(data)
        except AudioError as err:
            info.update(reason=f"WAV header does not parse ({err.reason})", problem=True)
            return name, data, info
        if header.format_tag != 1 or header.subtype not in _WAV_TO_FLAC_SUBTYPE:
            info["reason"] = f"{header.subtype} WAV has no lossless FLAC form"
            return name, data, info
        if header.frames_present < header.frames_declared:
            info.update(reason="truncated WAV (header promises more frames than present)", problem=True)
            return name, data, info
    try:
        if fmt == "wav" and header.bits == 16:  # the common case, read straight from the bytes
            samples = np.frombuffer(data, "<i2", header.frames_present * header.channels,
                                    header.data_offset).reshape(-1, header.channels)
            rate, subtype = header.sample_rate, "PCM_16"
        else:
            samples, rate, subtype = read_pcm(data)
    except AudioError as err:
        info.update(reason=err.reason, problem=True)
        return name, data, info
    mapping = _WAV_TO_FLAC_SUBTYPE if target == "flac" else _FLAC_TO_WAV_SUBTYPE
    if subtype not in mapping:
        info["reason"] = f"{subtype} has no lossless {target} form"
        return name, data, info
    if len(samples) == 0:
        info.update(reason="no audio frames", problem=True)
        return name, data, info
    encoded = encode_pcm(samples, rate, target.upper(), mapping[subtype], flac_level)
    if verify and not decodes_to(encoded, samples, rate):
        raise VerificationError(f"{target} encoding did not reproduce the samples exactly", member=name)
    info.update(action="transcoded", to=target, pcm_sha256=pcm_digest(samples, rate), frames=len(samples),
                sample_rate=rate, channels=samples.shape[1], subtype=subtype)
    return f"{key}.{target}", encoded, info


def make_transform(settings):
    """The per-member transform that convert applies for ``--audio flac|wav``."""

    def transform(shard: str, name: str, data: bytes):
        try:
            return transcode_member(name, data, settings.audio, settings.flac_level, settings.verify)
        except VerificationError as err:
            raise err.located(shard=shard, member=name)

    return transform


def summarize(entries: list[dict]) -> dict:
    """Counts of transcoded and kept members (with reasons) over a run's manifest entries."""
    counts: dict[str, int] = {"transcoded": 0}
    kept: dict[str, int] = {}
    for entry in entries:
        for info in entry.get("transcoded") or []:
            if info["action"] == "transcoded":
                counts["transcoded"] += 1
            else:
                reason = info.get("reason", "kept")
                kept[reason] = kept.get(reason, 0) + 1
    counts["kept"] = sum(kept.values())
    return {**counts, "kept_by_reason": kept}


def libsndfile_version() -> str:
    return sf.__libsndfile_version__
