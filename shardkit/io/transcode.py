"""Lossless audio transcoding of members inside convert: PCM WAV <-> FLAC, samples verified.

Only lossless, exactly reversible conversions happen: integer PCM WAV (8/16/24-bit) to FLAC at
the same bit depth, rate and channels, and FLAC back to WAV. Everything else (lossy formats,
float or 32-bit WAV, members that do not decode) is kept byte for byte and reported, so nothing
is lost and nothing is silently re-encoded. Every encoded member is proven to give exactly the
source's samples, and a mismatch fails the shard: FLAC through libFLAC's verify mode (``io.libflac``: each
frame decoded as it is made) where a libFLAC writing soundfile's very bytes is found, otherwise (and for
WAV) by decoding the finished member again.
"""

from __future__ import annotations

import hashlib
import io
import sys

import numpy as np
import soundfile as sf

from shardkit.errors import AudioError, VerificationError
from shardkit.io import interrupts, libflac
from shardkit.io.audio import (
    AUDIO_HEADER,
    DECODED_TOO_LONG,
    DEFAULT_MAX_DECODED_SECONDS,
    FLAC_MD5,
    IMPLAUSIBLE_LENGTH,
    MAX_TRANSCODE_PCM_BYTES,
    TRUNCATED,
    AudioHeaderError,
    PcmMd5,
    flac_bits,
    flac_md5,
    header_facts,
    open_soundfile,
    parse_wav_header,
    read_to_end,
    sniff_format,
    stable_message,
    too_long,
)
from shardkit.io.tar import AUDIO_EXTENSIONS, split_key

# FLAC holds integer PCM up to 24 bits; libsndfile's subtypes for each depth
_WAV_TO_FLAC_SUBTYPE = {"PCM_U8": "PCM_S8", "PCM_16": "PCM_16", "PCM_24": "PCM_24"}
_FLAC_TO_WAV_SUBTYPE = {"PCM_S8": "PCM_U8", "PCM_16": "PCM_16", "PCM_24": "PCM_24"}
_FLAC_BITS = {"PCM_S8": 8, "PCM_16": 16, "PCM_24": 24}


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


_BLOCK = 1 << 16  # frames decoded, encoded and compared at a time: no decoded copy of a member exists whole
_FLAC_MAX_RATE = 655350  # what a FLAC frame header can state (libFLAC's encoder refuses more)
TRANSCODE_ERROR = "transcode_error"  # an unexpected failure inside transcoding: the member is kept, a problem


def decodes_to(encoded: bytes, samples: np.ndarray, sample_rate: int) -> bool:
    """Whether ``encoded`` decodes to exactly ``samples`` (as ``read_pcm`` returns them) at ``sample_rate``."""
    try:
        with sf.SoundFile(io.BytesIO(encoded)) as f:
            dtype = np.dtype("int16" if f.subtype in _NARROW_SUBTYPES else "int32")
            if f.samplerate != sample_rate or f.channels != samples.shape[1] or dtype != samples.dtype:
                return False
            done = 0
            for block in f.blocks(blocksize=_BLOCK, dtype=dtype.name, always_2d=True):
                if not np.array_equal(block, samples[done:done + len(block)]):
                    return False
                done += len(block)
            return done == len(samples)
    except Exception:  # libsndfile raises plain RuntimeError/LibsndfileError: it does not decode
        return False


def encode_pcm(samples: np.ndarray, sample_rate: int, fmt: str, subtype: str, flac_level: int | None) -> bytes:
    """``samples`` (frames x channels) encoded with soundfile as ``fmt`` ("WAV", "FLAC") and ``subtype``
    ("PCM_16", ...); ``flac_level`` 0-8 sets FLAC's compression. Returns the file's bytes.
    """
    buf = io.BytesIO()
    kwargs = {}
    if fmt == "FLAC" and flac_level is not None:
        kwargs["compression_level"] = flac_level / 8
    sf.write(buf, samples, sample_rate, format=fmt, subtype=subtype, **kwargs)
    return buf.getvalue()


class Kept(Exception):
    """A member that stays as it is: ``reason``, and ``check`` when that is a problem (a finding)."""

    def __init__(self, reason: str, check: str | None = None):
        super().__init__(reason)
        self.reason, self.check = reason, check


def transcode_member(name: str, data: bytes, target: str, flac_level: int | None = None, verify: bool = True,
                     max_decoded_seconds: float | None = DEFAULT_MAX_DECODED_SECONDS):
    """``(new_name, new_data, info)`` for one member; unchanged bytes where no lossless change applies.

    ``info`` is None for non-audio members, else a dict with ``key``, ``member``, ``action``
    ("transcoded" or "kept"), the reason when kept (with ``problem: true`` and its ``check`` when the
    member's header and its decode disagree, or it does not decode), and ``pcm_sha256`` when samples
    were transcoded. The samples written are exactly those libsndfile decodes (a 16-bit PCM WAV's data
    chunk), streamed in blocks, and only when they agree with the header's facts; with ``verify`` the
    written member is proven to decode to them (libFLAC's verify mode, else a second decode).
    """
    key, ext = split_key(name)
    if ext.lower() not in AUDIO_EXTENSIONS:
        return name, data, None
    info = {"key": key, "member": name, "action": "kept"}
    try:
        facts = _transcodable(data, target, max_decoded_seconds)
        encoded, done, proven = _stream_transcode(data, facts, target, flac_level, verify)
        if verify and not proven and not _same_samples(encoded, data, done["subtype"]):
            raise VerificationError(f"{target} encoding did not reproduce the samples exactly", member=name)
    except Kept as kept:
        info["reason"] = kept.reason
        if kept.check is not None:
            info.update(problem=True, check=kept.check)
        return name, data, info
    info.update(action="transcoded", to=target, **done)
    return f"{key}.{target}", encoded, info


def _transcodable(data: bytes, target: str, max_seconds: float | None) -> dict:
    """The header facts of a member to transcode to ``target``; raises Kept for one that stays as it is."""
    fmt = sniff_format(data)
    _refuse_other_format(fmt, target, data)
    try:
        facts = header_facts(data)
    except AudioHeaderError as err:
        raise Kept(err.reason, err.check) from None
    except AudioError as err:
        raise Kept(f"{fmt.upper()} header does not parse ({err.reason})", "decode") from None
    if fmt == "wav" and facts["subtype"] not in _WAV_TO_FLAC_SUBTYPE:
        raise Kept(f"{facts['subtype']} WAV has no lossless FLAC form")
    if facts["frames_declared"] > facts["frames"]:
        raise Kept("truncated WAV (header promises more frames than present)", TRUNCATED)
    if target == "flac" and facts["sample_rate"] > _FLAC_MAX_RATE:
        raise Kept(f"{facts['sample_rate']} Hz has no FLAC form")
    _refuse_too_long(facts, max_seconds)
    return facts


def _refuse_other_format(fmt: str | None, target: str, data: bytes) -> None:
    """Kept unless the member is the lossless source format of ``target`` (a RIFF WAV for FLAC, FLAC for WAV)."""
    source_fmt = "wav" if target == "flac" else "flac"
    if fmt != source_fmt:
        if fmt is None:
            raise Kept("unknown or damaged audio bytes", "decode")
        if fmt in ("wav", "flac"):
            raise Kept(f"already {fmt}")
        raise Kept(f"lossy format ({fmt}): never re-encoded")
    if fmt == "wav" and data[:4] != b"RIFF":
        raise Kept(f"{data[:4].decode('latin-1')} WAV is kept as it is")


def _refuse_too_long(facts: dict, max_seconds: float | None) -> None:
    """Kept (a problem) when the member decodes to more than ``max_seconds`` or than transcoding holds."""
    message = too_long(facts["frames"], facts["sample_rate"], max_seconds)
    pcm_bytes = facts["frames"] * facts["channels"] * 4
    if message is None and pcm_bytes > MAX_TRANSCODE_PCM_BYTES:
        message = f"decodes to {pcm_bytes >> 20} MiB of samples, above the {MAX_TRANSCODE_PCM_BYTES >> 20} MiB " \
                  "transcoding holds"
    if message is not None:
        raise Kept(message, DECODED_TOO_LONG)


def _stream_transcode(data: bytes, facts: dict, target: str, flac_level: int | None,
                      verify: bool) -> tuple[bytes, dict, bool]:
    """Decode ``data`` with libsndfile block by block into the ``target`` encoder; check the decode against
    the header ``facts`` (and a FLAC's MD5 signature). ``(encoded, facts of the samples written, proven)``,
    ``proven`` when the encoder itself verified every sample (libFLAC's verify mode)."""
    mapping = _WAV_TO_FLAC_SUBTYPE if target == "flac" else _FLAC_TO_WAV_SUBTYPE
    expected_md5 = flac_md5(data)
    try:
        with _open_source(data, target) as src:
            subtype, rate, channels = src.subtype, src.samplerate, src.channels
            _refuse_other_stream(src, facts, mapping, target)
            dtype = np.dtype("int16" if subtype in _NARROW_SUBTYPES else "int32")
            digest = hashlib.sha256(f"{rate}:{channels}:{dtype.str}:".encode())
            md5 = PcmMd5(flac_bits(data)) if expected_md5 is not None else None
            out = _open_encoder(target, rate, channels, mapping[subtype], flac_level, verify)
            try:
                frames = _copy_blocks(src, out, dtype, facts["frames"], digest, md5)
                encoded = out.finish()
            finally:
                out.close()
    except (Kept, VerificationError):
        raise
    except Exception as err:  # libsndfile's generic errors, an encoder refusing its input
        raise Kept(f"does not transcode ({type(err).__name__}: {stable_message(err)})", "decode") from None
    _refuse_other_decode(frames, facts["frames"], md5, expected_md5)
    return encoded, {"pcm_sha256": digest.hexdigest(), "frames": frames, "sample_rate": rate,
                     "channels": channels, "subtype": subtype}, out.verifying


def _open_source(data: bytes, target: str):
    """The source's samples to encode: a 16-bit PCM WAV's data chunk as it is (those bytes are the samples
    libsndfile decodes, on a little-endian machine), libsndfile's decoder otherwise."""
    if target == "flac" and sys.byteorder == "little":
        info = parse_wav_header(data)
        if info.is_pcm and info.bits == 16:
            return _PcmWav(data, info)
    return open_soundfile(io.BytesIO(data))


class _PcmWav:
    """A 16-bit PCM WAV's samples, straight from its data chunk, read block by block like a ``soundfile.SoundFile``."""

    subtype = "PCM_16"
    # the samples are in memory already (the member's bytes): a larger block only widens the int32 copy libFLAC
    # takes (1 MiB a channel), and a member of up to 16 s at 16 kHz goes in one call, without per-block Python
    block_frames = 1 << 18

    def __init__(self, data: bytes, info):
        self.samplerate, self.channels = info.sample_rate, info.channels
        self.samples = np.frombuffer(data, "<i2", info.frames_present * info.channels,
                                     info.data_offset).reshape(-1, info.channels)
        self.done = 0

    def read(self, frames: int, dtype: str, always_2d: bool = True) -> np.ndarray:
        block = self.samples[self.done:self.done + frames]
        self.done += len(block)
        return block

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.samples = None


class _SoundfileEncoder:
    """soundfile's writer into memory, with the ``write``/``finish``/``close`` of ``libflac.VerifiedEncoder``."""

    verifying = False  # its bytes are proven by decoding them again (``_same_samples``)

    def __init__(self, target: str, rate: int, channels: int, subtype: str, flac_level: int | None):
        self.buf = io.BytesIO()
        kwargs = {"compression_level": flac_level / 8} if target == "flac" and flac_level is not None else {}
        self.file = sf.SoundFile(self.buf, "w", rate, channels, subtype, format=target.upper(), **kwargs)

    def write(self, block: np.ndarray) -> None:
        self.file.write(block)

    def finish(self) -> bytes:
        self.file.close()
        return self.buf.getvalue()

    def close(self) -> None:
        self.file.close()


def _open_encoder(target: str, rate: int, channels: int, subtype: str, flac_level: int | None, verify: bool):
    """libFLAC in verify mode for a verified FLAC where it writes soundfile's bytes, else soundfile (without
    verify mode libFLAC's path gains nothing: the encoders alone run level, benchmarks/results/2026-11-28-flac.md)."""
    lib = libflac.encoder_library(flac_level) if target == "flac" and verify else None
    if lib is not None:
        return libflac.VerifiedEncoder(lib, rate, channels, _FLAC_BITS[subtype], flac_level, verify)
    return _SoundfileEncoder(target, rate, channels, subtype, flac_level)


def _refuse_other_decode(frames: int, header_frames: int, md5, expected_md5: bytes | None) -> None:
    """Kept (a problem) when the decode gave other frames than the header says, or samples whose MD5 is not
    the one in a FLAC's STREAMINFO."""
    if frames != header_frames:
        raise Kept(f"libsndfile decodes {'more than ' if frames > header_frames else ''}{frames} frames, the "
                   f"header says {header_frames}", IMPLAUSIBLE_LENGTH if frames < header_frames else AUDIO_HEADER)
    if md5 is not None and md5.digest() != expected_md5:
        raise Kept("the decoded samples do not match the MD5 signature in STREAMINFO", FLAC_MD5)


def _refuse_other_stream(src, facts: dict, mapping: dict, target: str) -> None:
    """Kept when libsndfile reads other channels or rate than the header says, or a subtype ``target`` cannot hold."""
    rate, channels = src.samplerate, src.channels
    if (rate, channels) != (facts["sample_rate"], facts["channels"]):
        raise Kept(f"libsndfile reads {channels} channels at {rate} Hz, the header says "
                   f"{facts['channels']} at {facts['sample_rate']} Hz", AUDIO_HEADER)
    if src.subtype not in mapping:
        raise Kept(f"{src.subtype} has no lossless {target} form")


def _copy_blocks(src, out, dtype, max_frames: int, digest, md5) -> int:
    """Decode ``src`` block by block into ``out``, hashing the samples (and the FLAC MD5); the frames decoded,
    stopping at the first block past ``max_frames`` (the caller reports the excess)."""
    frames = 0
    while len(block := src.read(getattr(src, "block_frames", _BLOCK), dtype=dtype.name, always_2d=True)):
        frames += len(block)
        if frames > max_frames:
            break
        out.write(block)
        digest.update(memoryview(np.ascontiguousarray(block)).cast("B"))
        if md5 is not None:
            md5.update(block)
    return frames


def _same_samples(encoded: bytes, source: bytes, subtype: str) -> bool:
    """Whether ``encoded`` decodes to exactly the samples libsndfile decodes from ``source``, block by block."""
    dtype = "int16" if subtype in _NARROW_SUBTYPES else "int32"
    try:
        with sf.SoundFile(io.BytesIO(encoded)) as a, open_soundfile(io.BytesIO(source)) as b:
            if (a.samplerate, a.channels) != (b.samplerate, b.channels):
                return False
            while True:
                x = a.read(_BLOCK, dtype=dtype, always_2d=True)
                y = b.read(_BLOCK, dtype=dtype, always_2d=True)
                if not np.array_equal(x, y):
                    return False
                if not len(x):
                    return True
    except Exception:  # libsndfile raises plain RuntimeError/LibsndfileError: it does not decode
        return False


def make_transform(settings):
    """The per-member transform that convert applies for ``--audio flac|wav``. A failure nobody foresaw keeps
    the member as it is, as a problem naming shard and key (check ``transcode_error``), never the run's."""

    def transform(shard: str, name: str, data: bytes):
        try:
            result = transcode_member(name, data, settings.audio, settings.flac_level, settings.verify,
                                      getattr(settings, "max_decoded_seconds", DEFAULT_MAX_DECODED_SECONDS))
        except VerificationError as err:
            interrupts.check()  # libsndfile's callbacks swallow Ctrl-C: the failure may be the signal's
            raise err.located(shard=shard, member=name)
        except Exception as err:  # noqa: BLE001 - whatever it was, the member is kept and named
            interrupts.check()
            key = split_key(name)[0]
            return name, data, {"key": key, "member": name, "action": "kept", "problem": True,
                                "check": TRANSCODE_ERROR,
                                "reason": f"{shard}: key {key!r}: transcoding raised {type(err).__name__}: "
                                          f"{stable_message(err)}"}
        interrupts.check()
        return result

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
    """The version of the libsndfile soundfile links, which reports record (it decides FLAC's bytes)."""
    return sf.__libsndfile_version__
