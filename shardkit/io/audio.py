"""Audio members as bytes: format sniffing, WAV header parsing, decoding through the byte-stream path.

PCM WAV is decoded with numpy straight from the member bytes after parsing the RIFF header (the
fast path a reader needs); everything else goes through soundfile (libsndfile) from
``io.BytesIO``; torchaudio is an optional backend where the caller asks for it. The header is
parsed independently of the decoder, so a WAV whose header promises more frames than its bytes
hold is caught (neither soundfile nor torchaudio notices).

``header_facts`` is what every header reader (index, make, validate before its decode, convert before it
transcodes) asks: facts the member's bytes can hold, or an AudioHeaderError whose ``check`` names what a
decoder would refuse or read differently (HEADER_CHECKS). The decoders are the judge: each rule here
matches what libsndfile, FFmpeg and libFLAC do with such a header, and the property tests in
``tests/io/test_audio_headers.py`` hold it to libsndfile's decode.
"""

from __future__ import annotations

import dataclasses
import io
import re
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


# Check names of the header facts a decoder would refuse or read differently (validate, index and make
# report them under these names): each is a finding, never a choice between readings.
AUDIO_FORMAT = "audio_format"  # no decoder reads it: unknown format tag or sub-format GUID, 0 or >32 bits
AUDIO_HEADER = "audio_header"  # fields that contradict each other: block align, rate 0, two fmt or data chunks
AUDIO_CHANNELS = "audio_channels"  # 0 channels, or more than libsndfile reads (1024)
FLAC_METADATA = "flac_metadata"  # metadata blocks past the end of the member, no STREAMINFO first
FLAC_STREAMINFO = "flac_streaminfo"  # STREAMINFO invalid or contradicting the first frame header
IMPLAUSIBLE_LENGTH = "implausible_length"  # a length the member's bytes cannot hold (or that its decode denies)
EMPTY_AUDIO = "empty_audio"
TRUNCATED = "truncated"
FLAC_MD5 = "flac_md5"  # a FLAC whose MD5 signature is set and does not match its decoded samples
DECODED_TOO_LONG = "decoded_too_long"  # decodes to more than --max-decoded-seconds
HEADER_CHECKS = (AUDIO_FORMAT, AUDIO_HEADER, AUDIO_CHANNELS, FLAC_METADATA, FLAC_STREAMINFO, IMPLAUSIBLE_LENGTH)

MAX_CHANNELS = 1024  # libsndfile's SF_MAX_CHANNELS: it refuses more
MAX_SAMPLE_RATE = (1 << 31) - 1  # libsndfile's int samplerate


class AudioHeaderError(AudioError):
    """A header a decoder refuses or reads differently; ``check`` names which kind (see HEADER_CHECKS)."""

    def __init__(self, check: str, reason: str, *, shard: str | None = None, member: str | None = None):
        self.check = check
        super().__init__(reason, shard=shard, member=member)

    def _format(self) -> str:
        """``SHARD: member MEMBER: CHECK: REASON``: where a failure is one line (index's ``failures``), the check
        is named in it; ``reason`` stays the bare cause for reports that give the check apart."""
        location = super()._format()
        return location[:len(location) - len(self.reason)] + f"{self.check}: {self.reason}"


class HeaderBeyondHead(Exception):
    """The header reaches past the bytes in hand: ``needed`` bytes of the member are needed (not an error)."""

    def __init__(self, needed: int):
        super().__init__(f"the header needs the first {needed} bytes")
        self.needed = needed


@dataclass(frozen=True)
class WavInfo:
    """What a WAV header says, checked: the format (after resolving WAVE_FORMAT_EXTENSIBLE), channels,
    rate, bits, where the samples start, and how many frames the header promises against how many the
    bytes hold (a difference is a truncated or padded member).
    """
    format_tag: int  # 1 PCM, 3 float (after resolving WAVE_FORMAT_EXTENSIBLE), else a codec libsndfile decodes
    channels: int
    sample_rate: int
    bits: int
    block_align: int  # channels x bytes per sample for PCM and float (checked), the fmt field otherwise
    data_offset: int
    frames_declared: int  # what the header promises
    frames_present: int  # what the bytes hold

    @property
    def is_pcm(self) -> bool:
        """Integer PCM of 8, 16, 24 or 32 bits: what shardkit's fast decoder converts itself."""
        return self.format_tag == WAVE_FORMAT_PCM and self.bits in (8, 16, 24, 32)

    @property
    def is_linear(self) -> bool:
        """PCM or float: its frames follow from the data chunk's size; other codecs' only from libsndfile."""
        return self.format_tag in (WAVE_FORMAT_PCM, WAVE_FORMAT_IEEE_FLOAT)

    @property
    def subtype(self) -> str:
        """The libsndfile subtype that reads these samples (``PCM_16``, ``FLOAT``, ...), for reports."""
        if self.format_tag == WAVE_FORMAT_IEEE_FLOAT:
            return {32: "FLOAT", 64: "DOUBLE"}.get(self.bits, f"FLOAT{self.bits}")
        if self.format_tag != WAVE_FORMAT_PCM:
            return f"WAVE_FORMAT_{self.format_tag:#06x}"
        # libsndfile reads 1-8 bits as unsigned bytes, 9-16 as 16-bit and so on: the container decides
        return {1: "PCM_U8", 2: "PCM_16", 3: "PCM_24", 4: "PCM_32"}[(self.bits + 7) // 8]


# WAVE_FORMAT_EXTENSIBLE sub-format GUIDs: the format tag, then this fixed tail (KSDATAFORMAT_SUBTYPE_*)
_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")


def _wav_format(body: bytes, chunk_size: int) -> tuple[int, int, int, int, int]:
    """``(tag, channels, rate, bits, block_align)`` of a fmt chunk, checked as the decoders read it."""
    if chunk_size < 16 or len(body) < 16:
        raise AudioHeaderError(AUDIO_HEADER, f"WAV fmt chunk is too short ({chunk_size} bytes)")
    tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", body, 0)
    if tag == WAVE_FORMAT_EXTENSIBLE:
        tag = _extensible_subformat(body, chunk_size)
    if channels < 1 or channels > MAX_CHANNELS:
        raise AudioHeaderError(AUDIO_CHANNELS, f"WAV header says {channels} channels (decoders read 1 to "
                                               f"{MAX_CHANNELS})")
    if rate < 1 or rate > MAX_SAMPLE_RATE:
        raise AudioHeaderError(AUDIO_HEADER, f"WAV sample rate {rate} Hz is no rate a decoder reads")
    if tag == WAVE_FORMAT_PCM and not 1 <= bits <= 32 or tag == WAVE_FORMAT_IEEE_FLOAT and bits not in (32, 64):
        raise AudioHeaderError(AUDIO_FORMAT, f"WAV {'PCM' if tag == 1 else 'float'} with {bits} bits per sample "
                                             "is no format a decoder reads")
    if tag in (WAVE_FORMAT_PCM, WAVE_FORMAT_IEEE_FLOAT) and align != channels * ((bits + 7) // 8):
        raise AudioHeaderError(AUDIO_HEADER, f"WAV block align {align} contradicts {channels} channels of {bits} "
                                             f"bits (decoders read {channels * ((bits + 7) // 8)}-byte frames)")
    return tag, channels, rate, bits, align


def _extensible_subformat(body: bytes, chunk_size: int) -> int:
    """The format tag a WAVE_FORMAT_EXTENSIBLE fmt chunk's sub-format GUID names (PCM or float only)."""
    if chunk_size < 40 or len(body) < 40:
        raise AudioHeaderError(AUDIO_FORMAT, "WAVE_FORMAT_EXTENSIBLE fmt chunk is too short for its sub-format")
    guid = bytes(body[24:40])
    if guid[2:] != _GUID_TAIL or struct.unpack_from("<H", guid)[0] not in (WAVE_FORMAT_PCM, WAVE_FORMAT_IEEE_FLOAT):
        raise AudioHeaderError(AUDIO_FORMAT, f"WAVE_FORMAT_EXTENSIBLE sub-format {guid.hex()} is no format a "
                                             "decoder reads")
    return struct.unpack_from("<H", guid)[0]


def parse_wav_header(data, size: int | None = None) -> WavInfo:
    """Parse a RIFF/WAVE header, walking every chunk in ``data`` (the member's bytes or its first part;
    ``size`` is the member's whole size). Raises AudioError (AudioHeaderError with its check for a
    header the decoders refuse or read differently: unknown formats, contradicting fields, a second fmt
    or data chunk), or HeaderBeyondHead when the fmt or data chunk lies past the bytes in hand."""
    size = len(data) if size is None else size
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise AudioError("not a RIFF/WAVE file")
    pos = 12
    fmt = None
    found = None  # (data_offset, chunk_size) of the data chunk
    while pos + 8 <= size:
        if pos + 8 > len(data):
            if found is None:
                raise HeaderBeyondHead(pos + 8)
            break  # the part after the data chunk is not in hand: nothing more to check there
        chunk_id = bytes(data[pos:pos + 4])  # slices, not a memoryview: an mmap'd member must close after
        (chunk_size,) = struct.unpack_from("<I", data, pos + 4)
        body = pos + 8
        if chunk_id == b"fmt ":
            if fmt is not None:
                raise AudioHeaderError(AUDIO_HEADER, "WAV has two fmt chunks (decoders disagree on which counts)")
            if body + min(chunk_size, 40) > len(data) and body + min(chunk_size, 40) <= size:
                raise HeaderBeyondHead(body + min(chunk_size, 40))
            fmt = _wav_format(bytes(data[body:body + min(chunk_size, 40)]), chunk_size)
        elif chunk_id == b"data":
            if found is not None:
                raise AudioHeaderError(AUDIO_HEADER, "WAV has two data chunks (decoders read only one of them)")
            if fmt is None:
                raise AudioError("WAV data chunk comes before its fmt chunk")
            found = (body, chunk_size)
            if chunk_size == 0xFFFFFFFF:
                break  # a streamed WAV: the data runs to the end
        pos = body + chunk_size + (chunk_size & 1)
    if found is None:
        raise AudioError("WAV has no data chunk" if fmt else "WAV has no fmt chunk")
    tag, channels, rate, bits, align = fmt
    body, chunk_size = found
    available = max(0, size - body)
    declared = available if chunk_size == 0xFFFFFFFF else chunk_size  # 0 is 0 frames to libsndfile
    step = max(align, 1)  # (another codec's block align is not a frame size: its frames come from libsndfile)
    return WavInfo(tag, channels, rate, bits, align, body, declared // step, min(declared, available) // step)


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


_ADDRESS = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")


def stable_message(err: BaseException) -> str:
    """An exception's message without the object addresses decoders put in it (``<_io.BytesIO object at
    0x7f...>``): findings and reports must not differ from one run to the next."""
    text = getattr(err, "error_string", None) or str(err)
    return _ADDRESS.sub(r"<\1>", text)


def decode_soundfile(data: bytes, dtype: str = "float32") -> tuple[np.ndarray, int]:
    """Decode a whole audio member with soundfile: ``(frames x channels array of dtype, sample rate)``.
    Any failure is an AudioError carrying libsndfile's message (the caller adds shard and member).
    """
    try:
        with open_soundfile(io.BytesIO(data)) as f:  # a FLAC of unknown length is read to its end
            return read_to_end(f, dtype), f.samplerate
    except Exception as err:  # libsndfile reports every failure as a generic error
        raise AudioError(f"soundfile cannot decode it ({stable_message(err)})") from err


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
        raise AudioError(f"torchaudio cannot decode it ({type(err).__name__}: {stable_message(err)})") from err
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


@dataclass(frozen=True)
class FlacInfo:
    """A FLAC member's STREAMINFO: rate, channels, bits, block sizes, the total samples (0 when the
    encoder did not know), the MD5 of the decoded samples, and where the first frame starts.
    """
    sample_rate: int
    channels: int
    bits: int
    min_block: int
    max_block: int
    total_samples: int  # 0: the encoder did not know the length
    md5: bytes
    frames_offset: int  # where the first frame starts
    first_block: int = 0  # the first frame's block size: every frame's but the last in a fixed-blocksize stream


_FLAC_RATES = {1: 88200, 2: 176400, 3: 192000, 4: 8000, 5: 16000, 6: 22050, 7: 24000, 8: 32000, 9: 44100,
               10: 48000, 11: 96000}
_FLAC_BITS = {1: 8, 2: 12, 4: 16, 5: 20, 6: 24, 7: 32}


def _crc8(data) -> int:
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def parse_flac_header(data, size: int | None = None) -> FlacInfo:
    """STREAMINFO, every metadata block's extent and the first frame header of a FLAC member (``data`` its
    bytes or their first part, ``size`` its whole size). Raises AudioHeaderError for what libFLAC (the
    trainer's decoder) refuses or reads differently, HeaderBeyondHead when the header lies past ``data``."""
    size = len(data) if size is None else size
    min_block, max_block, rate, channels, bits, total = _streaminfo_fields(data, size)
    pos = _flac_metadata_end(data, size)
    info = FlacInfo(rate, channels, bits, min_block, max_block, total, bytes(data[26:42]), pos)
    if pos < size:  # a stream with no frame at all decodes to 0 frames: the caller's empty_audio
        info = dataclasses.replace(info, first_block=_check_first_frame(data, size, info))
    return info


def _streaminfo_fields(data, size: int) -> tuple[int, int, int, int, int, int]:
    """STREAMINFO's ``(min block, max block, rate, channels, bits, total samples)``, checked as libFLAC and
    FFmpeg read them."""
    if size < 42 or len(data) < 42 or data[:4] != b"fLaC" or data[4] & 0x7F != 0 or data[5:8] != b"\0\0\x22":
        raise AudioHeaderError(FLAC_METADATA, "FLAC does not start with its 34-byte STREAMINFO block")
    fields = int.from_bytes(data[8:26], "big")  # 16 + 16 + 24 + 24 + 20 + 3 + 5 + 36 bits
    min_block, max_block = fields >> 128, (fields >> 112) & 0xFFFF
    rate, channels = (fields >> 44) & 0xFFFFF, ((fields >> 41) & 7) + 1
    bits, total = ((fields >> 36) & 31) + 1, fields & ((1 << 36) - 1)
    if max_block < 16 or max_block < min_block:  # (FFmpeg refuses a maximum below 16; some encoders write a
        # minimum below 16 for a short last block, which decoders take)
        raise AudioHeaderError(FLAC_STREAMINFO, f"FLAC STREAMINFO block sizes {min_block}..{max_block} are invalid "
                                                "(maximum 16 at least, minimum not above maximum)")
    if rate == 0 or bits < 4:
        raise AudioHeaderError(FLAC_STREAMINFO, f"FLAC STREAMINFO says {rate} Hz, {bits} bits: no decoder reads it")
    return min_block, max_block, rate, channels, bits, total


def _flac_metadata_end(data, size: int) -> int:
    """Where the first frame starts: past every metadata block, each checked to lie within the member and to
    have a valid type (STREAMINFO only first)."""
    pos, last, number = 4, False, 0
    while not last:
        if pos + 4 > size:
            raise AudioHeaderError(FLAC_METADATA, f"FLAC metadata block {number} starts past the end of the member")
        if pos + 4 > len(data):
            raise HeaderBeyondHead(pos + 4)
        last, kind = bool(data[pos] & 0x80), data[pos] & 0x7F
        length = int.from_bytes(data[pos + 1:pos + 4], "big")
        if kind == 127 or (number > 0 and kind == 0):
            raise AudioHeaderError(FLAC_METADATA, f"FLAC metadata block {number} has an invalid type ({kind})")
        pos += 4 + length
        if pos > size:
            raise AudioHeaderError(FLAC_METADATA, f"FLAC metadata block {number} (type {kind}, {length} bytes) runs "
                                                  f"past the end of the member ({size} bytes)")
        number += 1
    return pos


def _utf8_number(head: bytes, i: int) -> tuple[int, int] | None:
    """FLAC's UTF-8-coded frame or sample number at ``head[i]``: ``(value, next index)``, None if malformed."""
    first = head[i]
    if first < 0x80:
        return first, i + 1
    ones = 8 - (~first & 0xFF).bit_length()
    if not 2 <= ones <= 7 or i + ones > len(head):
        return None
    value = first & (0x7F >> ones)
    for byte in head[i + 1:i + ones]:
        if byte & 0xC0 != 0x80:
            return None
        value = (value << 6) | (byte & 0x3F)
    return value, i + ones


def _frame_header(head: bytes, info: FlacInfo) -> tuple[bool, int, int, list[str]] | None:
    """``(variable blocking, frame or sample number, block size, contradictions with STREAMINFO)`` of the frame
    header at the start of ``head``; None when it is no frame header (sync, reserved codes, CRC-8)."""
    if len(head) < 6 or head[0] != 0xFF or head[1] & 0xFE != 0xF8 or head[3] & 1:
        return None
    codes = _frame_codes(head)
    if codes is None:
        return None
    block_code, rate_code, channel_code, bits_code = codes
    number = _utf8_number(head, 4)
    if number is None:
        return None
    number, i = number
    sizes = _block_and_rate(head, i, block_code, rate_code, info.sample_rate)
    if sizes is None:
        return None
    block, rate, i = sizes
    if _crc8(head[:i]) != head[i]:
        return None
    channels = channel_code + 1 if channel_code < 8 else 2
    bits = _FLAC_BITS.get(bits_code, info.bits)
    return bool(head[1] & 1), number, block, _streaminfo_contradictions(info, channels, rate, bits, block)


def _frame_codes(head: bytes) -> tuple[int, int, int, int] | None:
    """The frame header's block size, sample rate, channel and sample size codes; None for a reserved one."""
    block_code, rate_code = head[2] >> 4, head[2] & 15
    channel_code, bits_code = head[3] >> 4, (head[3] >> 1) & 7
    if block_code == 0 or rate_code == 15 or channel_code > 10 or bits_code == 3:
        return None
    return block_code, rate_code, channel_code, bits_code


def _block_and_rate(head: bytes, i: int, block_code: int, rate_code: int,
                    streaminfo_rate: int) -> tuple[int, int, int] | None:
    """``(block size, sample rate, index of the CRC-8)`` from the frame header's codes and the fields after
    the frame number at ``head[i]``; None when those fields run past ``head``."""
    extra = {6: 1, 7: 2}.get(block_code, 0)
    rate_extra = {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    if i + extra + rate_extra >= len(head):
        return None
    block = int.from_bytes(head[i:i + extra], "big") + 1 if extra else (
        192 if block_code == 1 else 576 << (block_code - 2) if block_code <= 5 else 256 << (block_code - 8))
    i += extra
    value = int.from_bytes(head[i:i + rate_extra], "big")
    rate = {12: value * 1000, 13: value, 14: value * 10}.get(rate_code, _FLAC_RATES.get(rate_code, streaminfo_rate))
    return block, rate, i + rate_extra


def _streaminfo_contradictions(info: FlacInfo, channels: int, rate: int, bits: int, block: int) -> list[str]:
    """Where a frame header says otherwise than STREAMINFO (libFLAC refuses such a stream)."""
    problems = []
    if channels != info.channels:
        problems.append(f"{channels} channels, STREAMINFO {info.channels}")
    if rate != info.sample_rate:
        problems.append(f"{rate} Hz, STREAMINFO {info.sample_rate} Hz")
    if bits != info.bits:
        problems.append(f"{bits} bits, STREAMINFO {info.bits}")
    if block > info.max_block:
        problems.append(f"a block of {block} samples, STREAMINFO at most {info.max_block}")
    return problems


def _check_first_frame(data, size: int, info: FlacInfo) -> int:
    """The first frame header against STREAMINFO (libFLAC refuses a stream where they differ); its block size."""
    pos = info.frames_offset
    need = min(pos + 16, size)
    if need > len(data):
        raise HeaderBeyondHead(need)
    head = bytes(data[pos:need])
    if len(head) < 6 or head[0] != 0xFF or head[1] & 0xFE != 0xF8:
        raise AudioHeaderError(FLAC_METADATA, "FLAC metadata is not followed by a frame (no frame sync code)")
    frame = _frame_header(head, info)
    if frame is None:
        raise AudioHeaderError(FLAC_STREAMINFO, "FLAC first frame header is damaged (reserved codes or CRC-8)")
    if frame[3]:
        raise AudioHeaderError(FLAC_STREAMINFO, "FLAC first frame contradicts STREAMINFO: " + "; ".join(frame[3]))
    return frame[2]


_LAST_FRAME_WINDOW = 1 << 20  # how far from the end the last frame header is looked for


def flac_frames_total(data, info: FlacInfo) -> int | None:
    """The samples a whole FLAC member's frames hold, from its last frame header (its first sample plus its
    block size), or None when no frame header is found near the end. A cheap cross-check of STREAMINFO's
    total: a false sync in the audio gives another number, which then only costs a decode to count."""
    size = len(data)
    start = max(info.frames_offset, size - _LAST_FRAME_WINDOW)
    tail = bytes(data[start:size])
    pos = len(tail) - 6
    while pos >= 0 and (pos := tail.rfind(b"\xff", 0, pos + 1)) >= 0:
        frame = _frame_header(tail[pos:pos + 16], info)
        if frame is not None and not frame[3]:
            variable, number, block, _ = frame
            return (number if variable else number * (info.first_block or info.max_block)) + block
        pos -= 1
    return None


# Bounds on what a FLAC's bytes can hold (RFC 9639 frame layout): a frame takes at least 8 bytes plus 2 a
# channel (a constant subframe of the smallest samples), and at most its samples verbatim plus 18 bytes
# plus 2 a channel; what lies past that (an ID3v1 tag) is allowed for by FLAC_TAIL_SLACK bytes.
FLAC_TAIL_SLACK = 4096
# A claim that decodes to more than this many bytes of PCM per byte of FLAC is counted by decoding before it
# is believed: speech compresses ~2x, only silence or a tone this much (a 64 KB FLAC of 5 hours exists).
FLAC_RATIO_TO_COUNT = 64


def flac_length_problem(info: FlacInfo, size: int) -> str | None:
    """Why STREAMINFO's total cannot be what the member's bytes hold, or None when it can (0 is unknown)."""
    total, audio_bytes = info.total_samples, size - info.frames_offset
    if not total:
        return None
    most = (audio_bytes // (8 + 2 * info.channels) + 1) * info.max_block
    if total > most:
        return (f"FLAC STREAMINFO claims {total} samples ({total / info.sample_rate:.1f} s); its {audio_bytes} "
                f"bytes of frames hold at most {most}")
    frames = -(-total // max(info.min_block, 1)) + 1
    largest = -(-total * info.channels * info.bits // 8) + frames * (18 + 2 * info.channels) + FLAC_TAIL_SLACK
    if audio_bytes > largest:
        return (f"FLAC STREAMINFO claims {total} samples; its {audio_bytes} bytes of frames hold more "
                f"(libsndfile stops at the claim, other decoders read on)")
    return None


def header_facts(data, size: int | None = None, *, count=None) -> dict:
    """``probe`` facts from a member's header, every one of them a fact its bytes can hold.

    ``data`` is the member's bytes (or a buffer over them: an mmap) or only their first part, ``size``
    the whole member's size. Raises AudioHeaderError (with its check) for a header that decoders refuse
    or would read differently, AudioError for one that does not parse, HeaderBeyondHead when more of
    the member is needed (a header past a large JUNK or PADDING block; a length only a decode can tell).
    ``count()`` (default: decode ``data`` with libsndfile) counts the frames of a whole member.
    """
    size = len(data) if size is None else size
    whole = len(data) >= size
    fmt = sniff_format(bytes(data[:16]))
    if fmt == "wav" and data[:4] == b"RIFF":
        return _wav_facts(data, size, whole)
    if fmt == "flac":
        return _flac_facts(data, size, whole, count)
    if not whole:
        raise HeaderBeyondHead(size)
    return _checked_facts(probe_file(io.BytesIO(data)), fmt)


def _wav_facts(data, size: int, whole: bool) -> dict:
    info = parse_wav_header(data, size)
    if not info.is_linear:  # ADPCM, A-law, ...: only libsndfile knows its frames
        if not whole:
            raise HeaderBeyondHead(size)
        return _checked_facts(probe_file(io.BytesIO(data)), "wav")
    facts = {"format": "wav", "subtype": info.subtype, "sample_rate": info.sample_rate,
             "channels": info.channels, "frames": info.frames_present, "frames_declared": info.frames_declared,
             "duration": info.frames_present / info.sample_rate}
    return _checked_facts(facts, "wav")


def _flac_facts(data, size: int, whole: bool, count) -> dict:
    info = parse_flac_header(data, size)
    frames = info.total_samples
    problem = flac_length_problem(info, size)
    if problem is not None:
        raise AudioHeaderError(IMPLAUSIBLE_LENGTH, problem)
    pcm_bytes = frames * info.channels * info.bits // 8
    # unknown, to be proven by a decode, or not what the last frame says: counted by decoding
    if not frames or pcm_bytes > FLAC_RATIO_TO_COUNT * size or whole and flac_frames_total(data, info) != frames:
        frames = _counted_frames(data, size, whole, count, frames)
    facts = {"format": "flac", "subtype": {8: "PCM_S8", 16: "PCM_16", 24: "PCM_24"}.get(info.bits,
                                                                                    f"PCM_{info.bits}"),
             "sample_rate": info.sample_rate, "channels": info.channels, "frames": frames,
             "frames_declared": frames, "duration": frames / info.sample_rate}
    return _checked_facts(facts, "flac")


def _counted_frames(data, size: int, whole: bool, count, claimed: int) -> int:
    """A whole FLAC's frames counted by decoding (``count()``, else libsndfile); a count that is not the
    STREAMINFO claim (when it makes one) is an AudioHeaderError."""
    if not whole:
        raise HeaderBeyondHead(size)
    counted = count() if count is not None else count_frames(io.BytesIO(data))
    if claimed and counted != claimed:
        raise AudioHeaderError(IMPLAUSIBLE_LENGTH if counted < claimed else FLAC_STREAMINFO,
                               f"FLAC STREAMINFO claims {claimed} samples, its frames decode to {counted} "
                               "(decoders disagree on where it ends)")
    return counted


def _checked_facts(facts: dict, fmt: str | None) -> dict:
    if not 1 <= facts["channels"] <= MAX_CHANNELS:
        raise AudioHeaderError(AUDIO_CHANNELS, f"{facts['channels']} channels (decoders read 1 to {MAX_CHANNELS})")
    if facts["sample_rate"] <= 0:
        raise AudioHeaderError(AUDIO_HEADER, f"sample rate {facts['sample_rate']} Hz")
    if facts["frames"] <= 0:
        raise AudioHeaderError(EMPTY_AUDIO, f"{(fmt or 'audio').upper()} holds no audio (0 frames)")
    return facts


def probe(data: bytes) -> dict:
    """Header facts without a full decode: format, subtype, sample_rate, channels, frames, duration.

    For WAV, ``frames`` is what the bytes hold and ``frames_declared`` what the header promises.
    A length the header leaves unknown (a streamed FLAC's STREAMINFO says 0), or a FLAC length its
    bytes could hold only at an unusual compression ratio, is counted by decoding. Raises
    AudioHeaderError (its ``check`` says which) for a header a decoder refuses or reads differently.
    """
    return header_facts(data)


def probe_file(path_or_file) -> dict:
    """``probe`` facts of a whole audio file (a path or a seekable file object), read by soundfile."""
    import soundfile as sf

    try:
        info = sf.info(path_or_file)
    except Exception as err:
        raise AudioError(f"cannot read the audio header ({stable_message(err)})") from err
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
        raise AudioError("cannot decode it to count its frames (its header leaves the length unknown or is not "
                         f"believed; {stable_message(err)})") from err


# Transcoding holds what it writes, and a torchaudio decode all of a member's samples: a member that decodes to
# more than this is refused with a DECODED_TOO_LONG finding (``--max-decoded-seconds`` changes it), and
# transcoding refuses more than MAX_TRANSCODE_PCM_BYTES of samples whatever their duration.
DEFAULT_MAX_DECODED_SECONDS = 3600.0
MAX_TRANSCODE_PCM_BYTES = 192 << 20


def too_long(frames: int, rate: int, max_seconds: float | None) -> str | None:
    """The DECODED_TOO_LONG message for a member of ``frames`` at ``rate``, or None."""
    if max_seconds is None or not rate or frames / rate <= max_seconds:
        return None
    return f"decodes to {frames / rate:.1f} s, above --max-decoded-seconds {max_seconds:g}"


class PcmMd5:
    """FLAC's MD5 signature of decoded samples, fed block by block: each sample little-endian, signed, in
    ``ceil(bits / 8)`` bytes, interleaved. Blocks come as soundfile's int16 (up to 16 bits) or int32
    (left-justified) arrays."""

    def __init__(self, bits: int):
        import hashlib

        self.bits = bits
        self.width = (bits + 7) // 8
        self.hash = hashlib.md5()

    @property
    def dtype(self) -> str:
        """The soundfile dtype to read blocks as: int16 up to 16 bits, int32 (left-justified) above."""
        return "int16" if self.width <= 2 else "int32"

    def update(self, block: np.ndarray) -> None:
        """Add one block of decoded samples (frames x channels, as ``dtype``) to the signature."""
        values = block.reshape(-1)
        if self.width == 1:
            self.hash.update((values >> 8).astype("i1").tobytes())
        elif self.width == 2:
            self.hash.update(values.astype("<i2").tobytes())
        else:
            wide = (values.astype("<i4") >> (32 - 8 * self.width)).astype("<i4")
            self.hash.update(wide.view("u1").reshape(-1, 4)[:, :self.width].tobytes())

    def digest(self) -> bytes:
        """The MD5 of every sample added so far, comparable with STREAMINFO's."""
        return self.hash.digest()


def flac_md5(data) -> bytes | None:
    """The MD5 signature a FLAC member's STREAMINFO carries, None if unset (all zero) or not a FLAC."""
    if len(data) < 42 or data[:4] != b"fLaC":
        return None
    md5 = bytes(data[26:42])
    return md5 if any(md5) else None


def flac_bits(data) -> int:
    """Bits per sample from a FLAC member's STREAMINFO (the caller has checked the ``fLaC`` magic)."""
    return ((int.from_bytes(data[20:22], "big") >> 4) & 31) + 1
