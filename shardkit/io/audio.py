"""Audio members as bytes: format sniffing, WAV header parsing, decoding through the byte-stream path.

PCM WAV is decoded with numpy straight from the member bytes after parsing the RIFF header (the
fast path a reader needs); everything else goes through soundfile (libsndfile) from
``io.BytesIO``; torchaudio is an optional backend where the caller asks for it. The header is
parsed independently of the decoder, so a WAV whose header promises more frames than its bytes
hold is caught (neither soundfile nor torchaudio notices).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np

from shardkit.errors import AudioError

WAVE_FORMAT_PCM = 1
WAVE_FORMAT_IEEE_FLOAT = 3
WAVE_FORMAT_EXTENSIBLE = 0xFFFE
_UNKNOWN_SIZE = (0, 0xFFFFFFFF)


def sniff_format(data: bytes) -> str | None:
    """Container format from the content: wav, flac, ogg, mp3, m4a, wma; None if unknown."""
    head = data[:16]
    if head[:4] in (b"RIFF", b"RF64", b"RIFX") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    if head[4:8] == b"ftyp":
        return "m4a"
    if head[:4] == b"\x30\x26\xb2\x75":
        return "wma"
    return None


# extensions that name one container (ogg and opus are both Ogg)
EXTENSION_FORMATS = {"wav": "wav", "flac": "flac", "ogg": "ogg", "opus": "ogg", "mp3": "mp3", "m4a": "m4a",
                     "wma": "wma"}


@dataclass(frozen=True)
class WavInfo:
    format_tag: int  # 1 PCM, 3 float (after resolving WAVE_FORMAT_EXTENSIBLE)
    channels: int
    sample_rate: int
    bits: int
    block_align: int
    data_offset: int
    frames_declared: int  # what the header promises
    frames_present: int  # what the bytes hold

    @property
    def is_pcm(self) -> bool:
        return self.format_tag == WAVE_FORMAT_PCM and self.bits in (8, 16, 24, 32)

    @property
    def subtype(self) -> str:
        if self.format_tag == WAVE_FORMAT_IEEE_FLOAT:
            return {32: "FLOAT", 64: "DOUBLE"}.get(self.bits, f"FLOAT{self.bits}")
        return {8: "PCM_U8", 16: "PCM_16", 24: "PCM_24", 32: "PCM_32"}.get(self.bits, f"PCM{self.bits}")


def parse_wav_header(data: bytes) -> WavInfo:
    """Parse a RIFF/WAVE header (walking chunks up to ``data``). Raises AudioError."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise AudioError("not a RIFF/WAVE file")
    pos = 12
    fmt = None
    while pos + 8 <= len(data):
        chunk_id = data[pos:pos + 4]
        (chunk_size,) = struct.unpack_from("<I", data, pos + 4)
        body = pos + 8
        if chunk_id == b"fmt ":
            if chunk_size < 16 or body + 16 > len(data):
                raise AudioError("WAV fmt chunk is too short")
            tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", data, body)
            if tag == WAVE_FORMAT_EXTENSIBLE and chunk_size >= 40 and body + 26 <= len(data):
                (tag,) = struct.unpack_from("<H", data, body + 24)
            fmt = (tag, channels, rate, bits, align)
        elif chunk_id == b"data":
            if fmt is None:
                raise AudioError("WAV data chunk comes before its fmt chunk")
            tag, channels, rate, bits, align = fmt
            if channels < 1 or rate < 1 or align < 1:
                raise AudioError(f"WAV header is invalid (channels={channels}, rate={rate}, block_align={align})")
            available = len(data) - body
            declared = available if chunk_size in _UNKNOWN_SIZE else chunk_size
            return WavInfo(tag, channels, rate, bits, align, body, declared // align, min(declared, available) // align)
        pos = body + chunk_size + (chunk_size & 1)
    raise AudioError("WAV has no data chunk" if fmt else "WAV has no fmt chunk")


def _pcm_to_array(data: bytes, info: WavInfo, dtype: str) -> np.ndarray:
    count = info.frames_present * info.channels
    if info.bits == 16:
        pcm = np.frombuffer(data, "<i2", count, info.data_offset)
        scale = 1 / 32768
    elif info.bits == 32:
        pcm = np.frombuffer(data, "<i4", count, info.data_offset)
        scale = 1 / 2147483648
    elif info.bits == 8:
        pcm = np.frombuffer(data, "u1", count, info.data_offset).astype(np.int16) - 128
        scale = 1 / 128
    else:  # 24-bit: widen each 3-byte sample into the top of an int32
        raw = np.frombuffer(data, "u1", count * 3, info.data_offset).reshape(-1, 3)
        wide = np.zeros((count, 4), np.uint8)
        wide[:, 1:] = raw
        pcm = wide.view("<i4").reshape(-1)
        scale = 1 / 2147483648
    if dtype == "int16" and info.bits == 16:
        out = pcm
    elif dtype in ("int16", "int32"):
        raise AudioError(f"cannot decode {info.bits}-bit PCM to {dtype} without loss")
    else:
        out = np.multiply(pcm, scale, dtype=np.float32 if dtype == "float32" else np.float64)
    return out.reshape(-1, info.channels)


def decode(data: bytes, dtype: str = "float32", *, fmt: str | None = None) -> tuple[np.ndarray, int]:
    """Decode audio bytes in full: ``(samples of shape (frames, channels), sample_rate)``.

    PCM WAV decodes with numpy (fast); other formats through soundfile from ``io.BytesIO``.
    Raises AudioError naming the cause.
    """
    fmt = fmt or sniff_format(data)
    if fmt == "wav" and data[:4] == b"RIFF":
        info = parse_wav_header(data)
        if info.is_pcm and (info.bits != 8 or dtype != "int16"):
            return _pcm_to_array(data, info, dtype), info.sample_rate
    return decode_soundfile(data, dtype)


def decode_soundfile(data: bytes, dtype: str = "float32") -> tuple[np.ndarray, int]:
    try:
        with open_soundfile(io.BytesIO(data)) as f:  # a FLAC of unknown length is read to its end
            return read_to_end(f, dtype), f.samplerate
    except Exception as err:  # libsndfile reports every failure as a generic error
        raise AudioError(f"soundfile cannot decode it ({err})") from err


def read_to_end(f, dtype: str) -> np.ndarray:
    """Every remaining frame of an open ``SoundFile`` as (frames, channels), also when its length is
    unknown (``f.read()`` would ask for SF_COUNT_MAX frames there)."""
    if f.frames < UNKNOWN_FRAMES:
        return f.read(dtype=dtype, always_2d=True)
    blocks = []
    while len(block := f.read(1 << 16, dtype=dtype, always_2d=True)):
        blocks.append(block)
    return np.concatenate(blocks) if blocks else np.zeros((0, f.channels), dtype)


def decode_torchaudio(data: bytes) -> tuple[np.ndarray, int]:
    """``torchaudio.load(io.BytesIO(data))``, the call WeNet makes; samples as (frames, channels)."""
    try:
        import torchaudio
    except ImportError as err:
        raise AudioError("the torchaudio backend needs the torch extra: pip install 'shardkit[torch]'") from err
    try:
        waveform, rate = torchaudio.load(io.BytesIO(data))
    except Exception as err:
        raise AudioError(f"torchaudio cannot decode it ({type(err).__name__}: {err})") from err
    return waveform.numpy().T, rate


# libsndfile reports SF_COUNT_MAX frames for a stream whose header leaves its length unknown
UNKNOWN_FRAMES = 1 << 62


def open_soundfile(path_or_file):
    """``soundfile.SoundFile`` for reading a path or a file object; one whose header leaves its length
    unknown (``frames >= UNKNOWN_FRAMES``: a FLAC written to a pipe) is opened as a stream, which can
    be read to its end (its ``frames`` still says unknown)."""
    import soundfile as sf

    f = sf.SoundFile(path_or_file)
    if f.frames < UNKNOWN_FRAMES:
        return f
    f.close()
    if hasattr(path_or_file, "seek"):
        path_or_file.seek(0)
    return _StreamSoundFile(path_or_file)


def _StreamSoundFile(path_or_file):
    """A ``soundfile.SoundFile`` read as the stream it is: soundfile seeks to "position + frames
    read" after every read, which libsndfile cannot do at the end of a FLAC of unknown length."""
    import soundfile as sf

    class StreamSoundFile(sf.SoundFile):
        def seekable(self) -> bool:
            return False

    return StreamSoundFile(path_or_file)


def flac_streaminfo(head: bytes) -> tuple[int, int, int] | None:
    """``(sample_rate, channels, total_samples)`` from a FLAC stream's first 42 bytes (STREAMINFO is
    always its first block; total 0 = the encoder did not know the length); None if not FLAC."""
    if len(head) < 42 or head[:4] != b"fLaC" or head[4] & 0x7F != 0:
        return None
    bits = int.from_bytes(head[18:26], "big")  # rate 20 bits, channels-1 3, bits-1 5, total samples 36
    return bits >> 44, ((bits >> 41) & 7) + 1, bits & ((1 << 36) - 1)


def flac_total_samples(head: bytes) -> int | None:
    """STREAMINFO's total samples (0: unknown); None if ``head`` is not the start of a FLAC stream."""
    info = flac_streaminfo(head)
    return None if info is None else info[2]


def probe(data: bytes) -> dict:
    """Header facts without a full decode: format, subtype, sample_rate, channels, frames, duration.

    For WAV, ``frames`` is what the bytes hold and ``frames_declared`` what the header promises.
    A length the header leaves unknown (a streamed FLAC's STREAMINFO says 0) is counted by decoding:
    there is no other way to learn it.
    """
    fmt = sniff_format(data)
    if fmt == "wav" and data[:4] == b"RIFF":
        info = parse_wav_header(data)
        return {"format": "wav", "subtype": info.subtype, "sample_rate": info.sample_rate,
                "channels": info.channels, "frames": info.frames_present, "frames_declared": info.frames_declared,
                "duration": info.frames_present / info.sample_rate}
    return probe_file(io.BytesIO(data))


def probe_file(path_or_file) -> dict:
    """``probe`` facts of a whole audio file (a path or a seekable file object), read by soundfile."""
    import soundfile as sf

    try:
        info = sf.info(path_or_file)
    except Exception as err:
        raise AudioError(f"cannot read the audio header ({err})") from err
    frames = info.frames if info.frames < UNKNOWN_FRAMES else count_frames(path_or_file)
    if hasattr(path_or_file, "seek"):
        path_or_file.seek(0)
        head = path_or_file.read(16)
    else:
        with open(path_or_file, "rb") as f:
            head = f.read(16)
    return {"format": sniff_format(head) or info.format.lower(), "subtype": info.subtype,
            "sample_rate": info.samplerate, "channels": info.channels, "frames": frames, "frames_declared": frames,
            "duration": frames / info.samplerate if info.samplerate else 0.0}


def count_frames(path_or_file) -> int:
    """Frames of an audio file whose header leaves its length unknown, by decoding it block by block."""
    if hasattr(path_or_file, "seek"):
        path_or_file.seek(0)
    frames = 0
    try:
        with _StreamSoundFile(path_or_file) as f:
            block = np.empty((1 << 16, f.channels), np.int16)
            while (got := len(f.read(out=block, dtype="int16"))) == len(block):
                frames += got
            return frames + got
    except Exception as err:
        raise AudioError(f"cannot decode it to count its frames (its header leaves the length unknown; {err})"
                         ) from err
