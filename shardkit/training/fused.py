"""The training reader's one loop for the common zstd shard: the member, grouping and decode stages fused.

``iter_samples`` reads a shard through three generator stages (shardkit.training.reader: members ->
utterances -> decode). On a zstd shard of ``<key>.txt`` and canonical 16-bit PCM ``<key>.wav`` pairs (what
shardkit and WeNet's tools write), the stages' Python per member is most of what the reader adds to zstd
alone (benchmarks/results/2026-11-28-reader.md). ``fused_samples`` does their work in one loop: the member
stage's header test (``common_member``), its reads (the WAV header first; int16 samples decompressed
straight into their array, other dtypes converted from the source's reused buffer), WeNet's grouping and the
canonical WAV test of ``decode_fast``; it yields the same sample dicts, keys in the same order, with the same
``ReadPosition`` at every yield, and raises the member stage's errors for a truncated or corrupt member.

At the first thing outside that case (the end-of-archive block, pax or long-name headers, another type,
extension or name, a FLAC or non-canonical WAV, a member twice or a third member for a key, an utterance over
the byte limit, a transcript that is not UTF-8) it returns a ``Handover``: the unfinished utterance's members,
read exactly as the member stage reads them, and the header in hand. The reader feeds them to its stages,
which read the rest of the shard and raise or report what they always did (the end's checks included).
"""

from __future__ import annotations

from typing import Generator
from zlib import adler32

import numpy as np

from shardkit.errors import CorruptStreamError, TarFormatError
from shardkit.io.tar import BLOCK, COMMON_DEVICE_FIELDS, COMMON_FIELDS, OCTAL_AS_ZERO
from shardkit.training import zstd_source
from shardkit.training.pcm import DEFAULT_POOL, LITTLE_ENDIAN, DecodedAudio, canonical_layout, converted, frames_held
from shardkit.training.zstd_source import ZstdMemberSource

_FAST_TYPES = frozenset(b"0\x00")
_WAV_HEADER = 44  # a canonical WAV's header: RIFF, fmt and data chunk headers
# Transcripts above this take the stages' path (the source's read_member); shardkit's are a few hundred bytes.
_TXT_BYTES = 1 << 16


def common_member(header: bytes, max_member_bytes: int) -> tuple[str, int] | None:
    """``(name, size)`` of a regular member whose header shardkit.io.tar's strict parser and ``tarfile`` read
    alike (number fields as tarfile and GNU tar write them, no ustar prefix, a matching checksum) and whose name
    and size pass its checks (UTF-8, relative, no '..' or backslash, within the limit); None for any other block
    (long names, pax, links, odd fields or names, a bad checksum, an oversized member, the end), which the strict
    parser then takes. ~1.5 us where the strict parse takes ~7."""
    if (len(header) == BLOCK and header[156] in _FAST_TYPES and not header[345]
            and header[100:156].translate(OCTAL_AS_ZERO) == COMMON_FIELDS
            and header[329:345] in COMMON_DEVICE_FIELDS
            # shardkit.io.tar.common_checksum's sum, written out: a call less per member of every fast read
            and int(header[148:154], 8) == ((adler32(header[:256]) & 0xFFFF) + (adler32(header[256:]) & 0xFFFF)
                                            - (adler32(header[148:156]) & 0xFFFF) + 255)):
        size = int(header[124:135], 8)
        try:
            name = header[:100].split(b"\x00", 1)[0].decode("utf-8")
        except UnicodeDecodeError:
            return None
        if (size <= max_member_bytes and name and name[0] != "/" and ".." not in name and "\\" not in name
                and name[1:2] != ":" and name[-1] != "/"):
            return name, size
    return None


def truncated_data(got: int, size: int, at: int, shard: str, name: str) -> TarFormatError:
    """The member stage's error for a stream that ends inside a member's data (``at``: where the data starts)."""
    return TarFormatError(f"stream ends inside member data ({got} of {size} bytes; truncated) at byte {at}",
                          shard=shard, member=name)


def truncated_padding(at: int, shard: str, name: str) -> TarFormatError:
    """The member stage's error for a stream that ends inside a member's padding (``at``: where it starts)."""
    return TarFormatError(f"stream ends inside the member's padding to 512 bytes (truncated) at byte {at}",
                          shard=shard, member=name)


class Handover:
    """Where ``fused_samples`` stopped: ``members``, the unfinished utterance's ``(name, data, end)`` as the
    member stage yields them (``end``: the stream offset past the member); ``header``, the block in hand (b""
    at the stream's end); ``offset``, where that block starts; ``count``, the members read before it."""

    __slots__ = ("members", "header", "offset", "count")

    def __init__(self, members: list, header: bytes, offset: int, count: int):
        self.members, self.header, self.offset, self.count = members, header, offset, count


def fused_samples(source: ZstdMemberSource, *, shard: str, dtype: str, max_member_bytes: int, offset: int,
                  position) -> Generator[dict, None, Handover]:
    """``{key, shard, txt, audio_format, audio, sample_rate}`` per utterance of a zstd shard's tar stream, read
    from ``offset`` (where ``source`` stands), until the first member outside the common case: then returns the
    ``Handover``. ``position``: a ReadPosition kept as the stages keep it (``end`` past each member read,
    ``utt_end`` past the utterance yielded)."""
    readinto, fill, zstd_error = source.readinto, source.fill, source.zstd_error
    largest = zstd_source.SCRATCH_BYTES  # a WAV above it takes the stages (read_member: a buffer of its own)
    view = source.scratch(BLOCK)
    count = 1 if offset else 0  # as the member stage: a resumed read has read members before
    header = view[:fill(view[:BLOCK])].tobytes()
    key: str | None = None
    utt: list = []  # the current utterance's (name, data, end), for a handover
    txt = audio = None
    txt_first = False  # the key order of the sample dict follows the members' (as the stages')
    held = utt_end = 0
    while True:
        member = common_member(header, max_member_bytes)
        if member is None:
            break
        name, size = member
        dot = name.rfind(".")
        ext = name[dot + 1:]
        padded = size + (-size % BLOCK)
        wanted = padded + BLOCK  # the member, its padding and the next header, in one read where possible
        if dot < 0 or not (ext == "txt" and padded <= _TXT_BYTES
                           or ext == "wav" and _WAV_HEADER < size and padded <= largest):
            break
        if len(view) < wanted:
            view = source.scratch(wanted)
        at = offset + BLOCK
        try:
            if ext == "txt":
                got = _fill(readinto, fill, view, wanted)
                if got < size:
                    raise truncated_data(got, size, at, shard, name)
                data, pad_end = view[:size].tobytes(), padded
            else:
                data, got, pad_end = _read_wav(readinto, fill, view, size, padded, dtype, at, shard, name)
        except zstd_error as err:
            raise source.corrupt(err).located(shard=shard, member=name) from err
        except CorruptStreamError as err:  # from ``fill``: the break lies in this member, say which
            raise err.located(shard=shard, member=name)
        if got < pad_end:
            raise truncated_padding(at + size, shard, name)
        header = view[pad_end:got].tobytes()
        count += 1
        offset = at + padded
        position.end = offset
        if name[:dot] != key:
            if key is not None:
                if txt is None or audio is None:
                    utt.append((name, data, offset))
                    return Handover(utt, header, offset, count)
                try:
                    text = txt.decode("utf-8")
                except UnicodeDecodeError:
                    utt.append((name, data, offset))
                    return Handover(utt, header, offset, count)
                position.utt_end, position.finished = utt_end, False
                if txt_first:
                    yield {"key": key, "shard": shard, "txt": text, "audio_format": "wav", "audio": audio.samples,
                           "sample_rate": audio.sample_rate}
                else:
                    yield {"key": key, "shard": shard, "audio_format": "wav", "txt": text, "audio": audio.samples,
                           "sample_rate": audio.sample_rate}
            key, utt, held, txt, audio = name[:dot], [], 0, None, None
        utt.append((name, data, offset))
        held += size
        utt_end = offset
        if ext == "txt":
            if txt is not None or held > max_member_bytes:
                break
            txt, txt_first = data, len(utt) == 1
        else:
            if audio is not None or held > max_member_bytes or data.__class__ is not DecodedAudio:
                break
            audio = data
    return Handover(utt, header, offset, count)


def _fill(readinto, fill, view: memoryview, want: int) -> int:
    """``view[:want]`` decompressed (zstd fills it in one call unless the stream ends); the bytes written."""
    got = readinto(view[:want])
    return got if got == want else got + fill(view[got:want])


def _read_wav(readinto, fill, view: memoryview, size: int, padded: int, dtype: str, at: int, shard: str,
              name: str) -> tuple:
    """``(data, bytes in view, where its padding ends in view)`` of a ``.wav`` member read as the member stage
    reads it with iter_samples' ``decode_wav``: a canonical 16-bit PCM WAV as its ``DecodedAudio`` (int16: the
    samples decompressed straight into their array), any other as its bytes; the next header follows in view."""
    wanted = padded + BLOCK
    if dtype == "int16" and LITTLE_ENDIAN:
        got = _fill(readinto, fill, view, _WAV_HEADER)
        layout = canonical_layout(view) if got == _WAV_HEADER else None
        if layout is not None:
            return _read_samples_into_array(readinto, fill, view, layout, size, padded, at, shard, name)
        if got == _WAV_HEADER:  # not canonical: the rest of it, as the member stage reads it
            got += fill(view[_WAV_HEADER:wanted])
    else:
        got = _fill(readinto, fill, view, wanted)
        layout = canonical_layout(view) if got >= _WAV_HEADER else None
    if got < size:
        raise truncated_data(got, size, at, shard, name)
    if layout is None:
        return view[:size].tobytes(), got, padded  # decoded by the stages (the member stage's copy)
    channels, rate, _ = layout
    pcm = np.frombuffer(view, "<i2", frames_held(layout, size) * channels, _WAV_HEADER)
    return DecodedAudio(converted(pcm, dtype, DEFAULT_POOL).reshape(-1, channels), rate, size), got, padded


def _read_samples_into_array(readinto, fill, view: memoryview, layout: tuple, size: int, padded: int, at: int,
                             shard: str, name: str) -> tuple:
    """``_read_wav`` for int16 from a canonical header already in ``view``: the samples decompressed into the
    utterance's array, the rest of the member (bytes after the samples, the padding) and the next header into
    ``view``."""
    channels, rate, _ = layout
    samples = DEFAULT_POOL.array(frames_held(layout, size) * channels, np.int16)
    target = memoryview(samples).cast("B")
    n = _fill(readinto, fill, target, len(target))
    if n < len(target):
        raise truncated_data(_WAV_HEADER + n, size, at, shard, name)
    held_back = _WAV_HEADER + n  # the member's bytes that are not in ``view``
    pad_end = padded - held_back
    got = _fill(readinto, fill, view, pad_end + BLOCK)
    if got < size - held_back:
        raise truncated_data(held_back + got, size, at, shard, name)
    return DecodedAudio(samples.reshape(-1, channels), rate, size), got, pad_end
