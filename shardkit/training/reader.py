"""The fast sample reader: shards in, ``{key, txt, audio, sample_rate}`` dicts out.

A pipeline of small generator stages, each over plain values:

    read_members(path)         -> (name, data) per tar member, in order
    group_utterances(members)  -> {key, shard, txt, audio_format, audio_bytes, ...other members}
    decode_utterances(utts)    -> adds audio (frames, channels) and sample_rate

``iter_samples(shards)`` is their composition; when it decodes with shardkit's decoder and keeps no
bytes, a zstd shard's common utterances (``<key>.txt`` and a canonical PCM ``<key>.wav``) take one loop
that fuses the three (shardkit.training.fused), which hands the stages the rest of the shard at its first
other member. Where the time goes (benchmarks/results/reader.md): on plain
tar the int16 -> float32 conversion, on zstd shards the decompressor; everything else is
per-utterance Python overhead, which on 200 KB utterances at 2 GB/s must stay within a few
microseconds. So: zstd is decompressed straight into each member's own buffer
(``stream_reader.readinto``, no chunks to join: shardkit.training.zstd_source); when ``iter_samples``
decodes and keeps no bytes, a canonical WAV member of a zstd shard is decoded as it is read, from one
reused buffer still in cache (int16: its samples decompressed straight into their array), and reaches
the decode stage as a ``DecodedAudio`` (benchmarks/results/2026-11-28-reader.md); the common tar header
and the common 44-byte WAV header are parsed with a few slices (anything unusual goes to the
foundation's strict parsers); 16-bit PCM is converted with one cast and one in-place scale. Other codecs go through
the foundation's readers unchanged (their decompressors are far slower than any copy). Members
are read once, never seeked, never written to disk; memory holds about one utterance.

Errors name the shard and member. The policy is a parameter: ``on_error=None`` raises, a
callable receives each ``ShardkitError`` for a bad utterance and the reader goes on with the next
(a shard whose container is damaged still ends at the damage: nothing after it can be trusted).
"""

from __future__ import annotations

import functools
import io
import logging
import os
from typing import Callable, Iterable, Iterator

import numpy as np

from shardkit.errors import (
    AudioError,
    CorruptStreamError,
    MemberTooLargeError,
    ShardkitError,
    TarFormatError,
    UsageError,
)
from shardkit.io.audio import decode as decode_any
from shardkit.io.audio import decode_soundfile, decode_torchaudio, parse_wav_header
from shardkit.io.codecs import detect_codec, iter_decompressed, zstd_frame_holding
from shardkit.io.tar import (
    AUDIO_EXTENSIONS,
    BLOCK,
    DEFAULT_MAX_MEMBER_BYTES,
    iter_tar_members,
    open_shard,
    shard_reader,
    split_key,
)
from shardkit.training.fused import Handover, common_member, fused_samples, truncated_data, truncated_padding
from shardkit.training.pcm import (  # BufferPool and DEFAULT_POOL: re-exported, public here since before pcm.py
    DEFAULT_POOL,
    LITTLE_ENDIAN,
    BufferPool,
    DecodedAudio,
    canonical_layout,
    converted,
    frames_held,
)
from shardkit.training.zstd_source import ZstdMemberSource

log = logging.getLogger("shardkit.training.reader")

DTYPES = ("float32", "int16", "float64")


def reuse_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse instead of returning it to the kernel (process-wide).

    Every utterance allocates its member bytes and its audio array (hundreds of KB each). With
    glibc's defaults, freeing them shrinks the heap and the next utterance gets fresh pages from
    the kernel, zeroed and faulted in one by one: about a quarter of the plain-WAV read rate.
    Decoded arrays now come from :data:`DEFAULT_POOL` (reused buffers), which removes that cost
    without touching the allocator, so ``iter_samples`` no longer needs this call; the dataset's
    loader workers still make it (their process is the reader's), and it stays for other
    allocation-heavy loops. Process-wide; returns False where the C library is not glibc.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    # both, because setting either one turns off glibc's own threshold adjustment
    return bool(mallopt(m_trim_threshold, 256 << 20)) and bool(mallopt(m_mmap_threshold, 32 << 20))


def warn_and_skip(err: ShardkitError) -> None:
    """An ``on_error`` policy: log the located error as a warning and go on with the next utterance.

    WeNet's reader drops a bad utterance silently; this one logs (``shardkit.training.reader``) which
    shard and member it skipped and why. A module-level function, so it pickles into loader workers.

    Args:
        err: the located error the reader hands over.

    Returns:
        None: the reader goes on.

    Example:
        ```python
        dataset = shardkit.ShardDataset("data/data.list", on_error=shardkit.warn_and_skip)
        ```
    """
    log.warning("skipped: %s", err)


# ---------------------------------------------------------------------------------------------
# Stage 1: members


class _Pushback:
    """A source whose next read returns one block already taken from it (for the hand-over)."""

    __slots__ = ("_block", "_source")

    def __init__(self, block: bytes, source):
        self._block, self._source = block, source

    def read(self, n: int):
        if self._block is not None and n == BLOCK:
            block, self._block = self._block, None
            return block
        return self._source.read(n)


def iter_members_fast(source, *, shard: str = "", max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
                      on_error: Callable[[ShardkitError], None] | None = None, offset: int = 0,
                      position: ReadPosition | None = None, decode_wav: Callable | None = None,
                      header: bytes | None = None, count: int | None = None):
    """``(name, data)`` per member of a tar stream; returns True when the end-of-archive block was read.

    This is ``shardkit.io.tar.iter_tar_members``'s fast path, not another parser: it takes only the
    common member (``shardkit.training.fused.common_member``: regular file, a name under 100 bytes in UTF-8
    without a ustar prefix, number fields as tarfile and GNU tar write them, a matching checksum, a plainly
    safe name within the size limit), which ``tario.parse_header`` reads the same, in ~1.5 us instead of ~7 us.
    Anything else (long names, pax, links, odd names or fields, bad checksums, oversized members,
    the end-of-archive block) hands the rest of the stream to ``iter_tar_members``, which applies
    every check and error policy. tests/io/test_tar_agrees_with_tarfile.py proves the two read alike. ``offset``: where
    in the tar stream ``source`` stands (a resumed read starts past members already read);
    ``position``: its ``end`` is set to the offset past each member before it is yielded; ``decode_wav``: a
    ``.wav`` member of a source that can decode where it decompresses comes as ``decode_wav``'s result;
    ``header`` and ``count``: the block already read at ``offset`` and the members read before it (a hand-over).
    """
    read = source.read
    read_member = getattr(source, "read_member", None)
    read_decoded = getattr(source, "read_decoded_member", None) if decode_wav is not None else None
    if count is None:
        count = 1 if offset else 0  # a resumed read has read members before: an end block there is no empty tar
    if header is None:
        header = read(BLOCK)
    while True:
        member = common_member(header, max_member_bytes)
        if member is not None:
            name, size = member
            padded = size + (-size % BLOCK)
            try:
                if read_decoded is not None and name.endswith(".wav"):
                    data, next_header, padded_whole = read_decoded(size, decode_wav)
                elif read_member is not None:
                    data, next_header, padded_whole = read_member(size)
                else:
                    data = read(size)
                    next_header = None
                    padded_whole = padded == size or len(data) < size or len(read(padded - size)) == padded - size
            except CorruptStreamError as err:  # the break lies in this member: say which
                raise err.located(shard=shard, member=name)
            if len(data) < size:
                raise truncated_data(len(data), size, offset + BLOCK, shard, name)
            if not padded_whole:
                raise truncated_padding(offset + BLOCK + size, shard, name)
            count += 1
            offset += BLOCK + padded
            if position is not None:
                position.end = offset
            yield name, data
            header = read(BLOCK) if next_header is None else next_header
            continue
        if not header and count:
            return False  # no end-of-archive blocks: tolerated, as tarfile and GNU tar do
        # Anything unusual, including every error and the end: the strict parser takes over from this header.
        return (yield from iter_tar_members(_Pushback(header, source), shard=shard, max_member_bytes=max_member_bytes,
                                            on_error=on_error, offset=offset, members=count, position=position))


class ReadPosition:
    """Where a read stands in a shard list, for resuming it (``ShardDataset.state_dict``).

    ``index``: the shard of the list being read; ``end``: the tar-stream offset past the last member
    read (set by the member stages); ``utt_end``: the offset past the last member of the last
    utterance handed on (where a resumed read starts: the next utterance's headers begin there);
    ``finished``: that utterance was the shard's last (a resume starts at the next shard).
    """

    __slots__ = ("index", "end", "utt_end", "finished")

    def __init__(self):
        self.index, self.end, self.utt_end, self.finished = 0, 0, 0, False


def _skip_to(source, start: int, path: str) -> None:
    """Read ``start`` bytes of a tar stream and drop them: decompress only, nothing is parsed or decoded."""
    fill = getattr(source, "fill", None)
    scratch = memoryview(bytearray(min(start, 1 << 20))) if fill is not None else None
    left = start
    while left:
        n = min(left, 1 << 20)
        got = fill(scratch[:n]) if fill is not None else len(source.read(n))
        if got < n:
            raise TarFormatError(f"a resume offset of {start} bytes is past the end of the tar stream "
                                 f"({start - left + got} bytes): the shard changed since the state was saved",
                                 shard=path)
        left -= n


def _open_at(f, path: str, codec: str, start: int, threads: int):
    """An exact-read source over the shard's tar stream standing at byte ``start`` of that stream.

    A plain local shard seeks; a compressed one (or a stream that cannot seek) skips by
    decompressing and dropping the bytes before ``start`` (no tar parsing, no audio decoding).
    """
    if start % BLOCK or start < 0:
        raise UsageError(f"a resume offset must be a multiple of {BLOCK} bytes (got {start}) for {path}")
    if codec == "none" and start and f.seekable():
        return _seeked(f, path, start)
    if codec == "zst":
        return _zstd_at(f, path, start)
    source = shard_reader(f, shard=path, codec=codec, threads=threads)
    if start:
        _skip_to(source, start, path)
    return source


def _zstd_at(f, path: str, start: int):
    """A zstd shard's fast reader at byte ``start``: from the frame a seek table names, else by decompressing
    and dropping the bytes before it."""
    frame = zstd_frame_holding(f, path, start) if start else None
    if frame is not None:
        return _from_zstd_frame(f, path, start, frame)
    source = ZstdMemberSource(f, path)
    if start:
        _skip_to(source, start, path)
    return source


def _seeked(f, path: str, start: int):
    """A plain local shard at byte ``start`` (past its end: the shard changed since the state was saved)."""
    size = f.seek(0, os.SEEK_END)
    if start > size:
        raise TarFormatError(f"a resume offset of {start} bytes is past the end of the shard ({size} bytes): "
                             "the shard changed since the state was saved", shard=path)
    f.seek(start)
    return f


def _from_zstd_frame(f, path: str, start: int, frame: tuple[int, int]):
    """A zstd shard read from the frame its seek table names as holding ``start``: decompression begins
    there, through the same fast reader as a whole read (frames after it are read across, the table skipped)."""
    compressed, decompressed = frame
    f.seek(compressed)
    source = ZstdMemberSource(f, path)
    if start > decompressed:
        _skip_to(source, start - decompressed, path)  # within the one frame: less than ZST_FRAME_BYTES
    return source


def read_members(path: str, *, max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES, threads: int = 1,
                 on_error: Callable[[ShardkitError], None] | None = None, start: int = 0,
                 position: ReadPosition | None = None,
                 allow_pipes: bool | None = None, decode_wav: Callable | None = None) -> Iterator[tuple[str, bytes]]:
    """``(name, data)`` for each member of one shard, any compression (detected by magic bytes).

    ``data`` is bytes-like (``bytes``, or ``bytearray`` for large zstd members). Unsafe or
    oversized members raise, or go to ``on_error`` and are skipped; a damaged container raises.
    ``start``: a tar-stream offset where a member's headers begin (a ``ReadPosition.utt_end`` saved
    earlier): the members before it are skipped unread. ``position``: kept up to date (see ReadPosition).
    A ``pipe:CMD`` shard runs its command only with ``allow_pipes=True`` (or SHARDKIT_ALLOW_PIPES=1).
    ``decode_wav``: see ``iter_members_fast`` (iter_samples' own).
    """
    f, codec, source = _opened(path, start, threads, allow_pipes)
    members = iter_members_fast(source, shard=path, max_member_bytes=max_member_bytes, on_error=on_error,
                                offset=start, position=position, decode_wav=decode_wav)
    yield from _to_the_end(f, source, members, path, codec, allow_pipes)


def _opened(path: str, start: int, threads: int, allow_pipes: bool | None):
    """``(file, codec, exact-read source at tar offset start)`` of one shard; the file is closed if this fails."""
    f = open_shard(path, allow_pipes=allow_pipes)
    try:
        codec = detect_codec(f.peek(16)[:16])
        return f, codec, _open_at(f, path, codec, start, threads)
    except BaseException:
        f.close()
        raise


def _to_the_end(f, source, members: Iterator, path: str, codec: str, allow_pipes: bool | None):
    """``members`` of the open shard ``f`` (closed after them), then the stream's end checked as they end."""
    with f:
        ended = yield from members
        if hasattr(source, "drain"):
            source.drain()  # the decompressor checks the stream's end (CRC, checksum)
        if ended or codec != "zst":
            return
    # A zstd tar without its end-of-archive block: either a writer that omits it (tolerated, as
    # tarfile does) or a stream cut at a member boundary. The strict reader tells which.
    with open_shard(path, allow_pipes=allow_pipes) as f:
        for _ in iter_decompressed(f, shard=path, codec="zst"):
            pass


def read_stream_members(stream, url: str, **read) -> Iterator[tuple[str, bytes]]:
    """``read_members`` over a stream someone else opened (WebDataset's ``gopen``): any compression;
    no resume offset past a seek, and no second pass to tell a zstd stream cut at a member boundary."""
    f = stream if hasattr(stream, "peek") else io.BufferedReader(_RawStream(stream))
    start = read.pop("start", 0)
    source = _open_at(f, url, detect_codec(f.peek(16)[:16]), start, 1)
    yield from iter_members_fast(source, shard=url, offset=start, **read)
    if hasattr(source, "drain"):
        source.drain()


class _RawStream(io.RawIOBase):
    """A file-like object with only ``read`` as a raw stream, so io.BufferedReader can give it ``peek``."""

    def __init__(self, stream):
        self._read = stream.read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


# ---------------------------------------------------------------------------------------------
# Stage 2: utterances

# Sample fields; a member extension with one of these names cannot be carried along.
RESERVED_FIELDS = frozenset({"key", "shard", "txt", "audio", "sample_rate", "audio_format", "audio_bytes"})


def _finish(utt: dict, problem: ShardkitError | None) -> dict:
    """Check and complete one grouped utterance; raises a located ShardkitError."""
    key, shard = utt["key"], utt["shard"]
    if problem is not None:
        raise problem
    if "txt" not in utt:
        raise ShardkitError("utterance has no .txt transcript member", shard=shard, member=key)
    if "audio_bytes" not in utt:
        raise AudioError("utterance has no audio member (.wav, .flac, ...)", shard=shard, member=key)
    try:
        utt["txt"] = utt["txt"].decode("utf-8")
    except UnicodeDecodeError as err:
        raise ShardkitError(f"transcript is not UTF-8 ({err.reason} at byte {err.start})", shard=shard,
                            member=f"{key}.txt") from None
    return utt


def group_utterances(members: Iterable[tuple[str, bytes]], *, shard: str = "",
                     on_error: Callable[[ShardkitError], None] | None = None,
                     max_bytes: int = DEFAULT_MAX_MEMBER_BYTES, position: ReadPosition | None = None) -> Iterator[dict]:
    """Adjacent members with one key -> ``{key, shard, txt, audio_format, audio_bytes, ...}``.

    WeNet's rule (as ``shardkit.io.tar.group_samples``, in one pass without the intermediate
    sample): the key is the name before the last '.', members of an utterance are adjacent;
    ``txt`` is the UTF-8 transcript, the audio member the one with an audio extension (the last
    one when several, as in WeNet), any other extension is carried along as bytes. An utterance
    without transcript or audio is an error (WeNet crashes or drops it), and so is one whose
    members together pass ``max_bytes`` (their data is not kept: memory holds one utterance).
    ``position``: the members' ``ReadPosition``; before an utterance is yielded its ``utt_end`` is set
    to the offset past the utterance's last member (the member stage has already read one further).
    """
    position = position if position is not None else ReadPosition()  # kept up to date whether or not asked
    utt: dict = _NO_UTTERANCE  # no key equals its key: the first member starts an utterance
    problem: ShardkitError | None = None
    held = end = 0
    for name, data in members:
        key, ext = split_key(name)
        if utt["key"] != key:
            if (done := _finished(utt, problem, on_error)) is not None:
                position.utt_end, position.finished = end, False
                yield done
            utt, problem, held = {"key": key, "shard": shard}, None, 0
        end = position.end
        held += len(data)
        if held > max_bytes:
            problem = _too_large(problem, key, max_bytes, shard, name)
            utt.pop("audio_bytes", None)
            continue
        if ext == "txt":
            utt["txt"] = data
        elif ext in AUDIO_EXTENSIONS:
            utt["audio_format"] = ext
            utt["audio_bytes"] = data
        elif ext in RESERVED_FIELDS:
            problem = ShardkitError(f"member extension {ext!r} collides with a sample field", shard=shard,
                                    member=name)
        else:
            utt[ext] = bytes(data)
    if (done := _finished(utt, problem, on_error)) is not None:
        position.utt_end, position.finished = end, True
        yield done


_NO_UTTERANCE = {"key": None}  # before a shard's first member (never changed: the first member replaces it)


def _finished(utt: dict, problem: ShardkitError | None, on_error) -> dict | None:
    """``_finish`` under the error policy: the utterance, or None (none yet, or its error went to ``on_error``)."""
    if utt is _NO_UTTERANCE:
        return None
    try:
        return _finish(utt, problem)
    except ShardkitError as err:
        if on_error is None:
            raise
        on_error(err)
        return None


def _too_large(problem: ShardkitError | None, key: str, max_bytes: int, shard: str, name: str) -> ShardkitError:
    """The problem of an utterance whose members passed ``max_bytes``: the first such, kept once raised."""
    if problem is None or not isinstance(problem, MemberTooLargeError):
        return MemberTooLargeError(f"the members of key {key!r} together exceed the limit of {max_bytes} bytes",
                                   shard=shard, member=name)
    return problem


# ---------------------------------------------------------------------------------------------
# Stage 3: decode


def _canonical_pcm16(data):
    """``(int16 view, channels, rate)`` for the 44-byte-header 16-bit PCM WAV every writer emits.

    One struct unpack instead of walking the chunks (0.4 us instead of 4 us per utterance);
    ``(None, 0, 0)`` for anything else, which then takes ``parse_wav_header``'s full walk.
    """
    layout = canonical_layout(data) if len(data) >= 44 else None
    if layout is None:
        return None, 0, 0
    channels, rate, _ = layout
    return np.frombuffer(data, "<i2", frames_held(layout, len(data)) * channels, 44), channels, rate


def _parsed_pcm16(data):
    """``_canonical_pcm16`` for any other 16-bit PCM RIFF WAV (chunks walked by ``parse_wav_header``);
    ``(None, 0, 0)`` for anything else."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        info = parse_wav_header(data)
        if info.format_tag == 1 and info.bits == 16:
            return np.frombuffer(data, "<i2", info.frames_present * info.channels, info.data_offset), \
                info.channels, info.sample_rate
    return None, 0, 0


def decode_fast(data, dtype: str = "float32", pool: BufferPool | None = DEFAULT_POOL) -> tuple[np.ndarray, int]:
    """shardkit's decoder: 16-bit PCM WAV by one numpy cast and scale, anything else via shardkit.io.audio.

    Returns ``(samples of shape (frames, channels), sample_rate)``; arrays own their memory (for
    PCM WAV, a buffer of ``pool`` that is reused only after the array and its views are gone;
    ``pool=None``: a plain numpy allocation).
    """
    pcm, channels, rate = _canonical_pcm16(data)
    if pcm is None:
        pcm, channels, rate = _parsed_pcm16(data)
    if pcm is not None:
        return converted(pcm, dtype, pool).reshape(-1, channels), rate
    return decode_any(bytes(data) if not isinstance(data, bytes) else data, dtype)


class _WavDecoder:
    """``decode_wav`` for the member stage: a canonical 16-bit PCM WAV member -> its ``DecodedAudio``
    (``decode_fast``'s arrays, from :data:`DEFAULT_POOL`); None for any other, decoded later from its bytes."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: str):
        self.dtype = dtype

    def __call__(self, data) -> DecodedAudio | None:
        pcm, channels, rate = _canonical_pcm16(data)
        if pcm is None:
            return None
        return DecodedAudio(converted(pcm, self.dtype, DEFAULT_POOL).reshape(-1, channels), rate, len(data))

    def direct_target(self, head, size: int) -> tuple[DecodedAudio, memoryview] | None:
        """For int16 from a canonical WAV header (its first 44 bytes, of a ``size``-byte member): the utterance's
        array and the bytes of it that the member's samples fill, so that they are decompressed straight into
        it (no copy at all); None otherwise (other dtypes convert, other layouts go through the bytes)."""
        layout = canonical_layout(head) if self.dtype == "int16" and LITTLE_ENDIAN else None
        if layout is None:
            return None
        channels, rate, _ = layout
        out = DEFAULT_POOL.array(frames_held(layout, size) * channels, np.int16)
        return DecodedAudio(out.reshape(-1, channels), rate, size), memoryview(out).cast("B")


def _decode_soundfile(data, dtype: str) -> tuple[np.ndarray, int]:
    return decode_soundfile(data, dtype)


def _decode_torchaudio(data, dtype: str) -> tuple[np.ndarray, int]:
    samples, rate = decode_torchaudio(bytes(data))
    return samples, rate


# name -> (data, dtype) -> (samples (frames, channels), rate). "torchaudio" is WeNet's call.
DECODERS: dict[str, Callable] = {"shardkit": decode_fast, "soundfile": _decode_soundfile,
                                 "torchaudio": _decode_torchaudio}


def check_decode_settings(decoder: str, dtype: str) -> None:
    """Raise UsageError for an unknown decoder or dtype, or a pair that does not go together."""
    if decoder not in DECODERS:
        raise UsageError(f"unknown decoder {decoder!r}; choose from {', '.join(DECODERS)}")
    if dtype not in DTYPES:
        raise UsageError(f"unsupported dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if decoder == "torchaudio" and dtype != "float32":
        raise UsageError("the torchaudio decoder returns float32 only")


def decode_utterances(utts: Iterable[dict], *, dtype: str = "float32", decoder: str = "shardkit",
                      keep_bytes: bool = False,
                      on_error: Callable[[ShardkitError], None] | None = None) -> Iterator[dict]:
    """Add ``audio`` (array of shape (frames, channels)) and ``sample_rate`` to each utterance.

    The audio bytes are dropped unless ``keep_bytes``. An undecodable member raises AudioError
    naming shard and member, or goes to ``on_error`` and the utterance is skipped.
    """
    check_decode_settings(decoder, dtype)
    decode_fn = DECODERS[decoder]
    for utt in utts:
        data = utt["audio_bytes"] if keep_bytes else utt.pop("audio_bytes")
        if data.__class__ is DecodedAudio:  # decoded as it was read (iter_samples)
            utt["audio"], utt["sample_rate"] = data.samples, data.sample_rate
            yield utt
            continue
        try:
            utt["audio"], utt["sample_rate"] = decode_fn(data, dtype)
        except ShardkitError as err:
            err.located(shard=utt["shard"], member=f"{utt['key']}.{utt['audio_format']}")
            if on_error is None:
                raise
            on_error(err)
            continue
        yield utt


# ---------------------------------------------------------------------------------------------
# The composition


def iter_utterances(shards: Iterable[str], *, max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES, threads: int = 1,
                    on_error: Callable[[ShardkitError], None] | None = None, start: int = 0,
                    position: ReadPosition | None = None,
                    allow_pipes: bool | None = None, decode_wav: Callable | None = None) -> Iterator[dict]:
    """Read and group, no decode: ``{key, shard, txt, audio_format, audio_bytes, ...}`` per utterance.

    With ``on_error``, a shard that cannot be opened or whose container is damaged is reported
    and the reader moves to the next shard (the utterances before the damage were yielded).
    ``start``: the tar-stream offset where the first shard's read begins (a saved ``utt_end``);
    ``position``: kept up to date with the shard index and offsets (see :class:`ReadPosition`);
    ``decode_wav``: iter_samples' own (``audio_bytes`` may then be a ``DecodedAudio``, see ``iter_members_fast``).
    """
    def utterances(path: str, at: int) -> Iterator[dict]:
        members = read_members(path, max_member_bytes=max_member_bytes, threads=threads, on_error=on_error,
                               start=at, position=position, allow_pipes=allow_pipes, decode_wav=decode_wav)
        return group_utterances(members, shard=path, on_error=on_error, max_bytes=max_member_bytes,
                                position=position)

    return _each_shard(shards, utterances, start=start, position=position, on_error=on_error)


def _each_shard(shards: Iterable[str], read_shard: Callable[[str, int], Iterator[dict]], *, start: int,
                position: ReadPosition | None, on_error: Callable[[ShardkitError], None] | None) -> Iterator[dict]:
    """``read_shard(path, offset)``'s utterances for each shard in turn (the first from ``start``), under the
    error policy: with ``on_error``, a shard that cannot be opened or whose container is damaged is reported
    and the read moves to the next shard."""
    for i, path in enumerate(shards):
        if position is not None:
            position.index, position.end = i, (start if i == 0 else 0)
        try:
            yield from read_shard(path, start if i == 0 else 0)
        except ShardkitError as err:
            if on_error is None:
                raise
            on_error(err.located(shard=path))


def _decoded_shard(path: str, start: int, *, dtype: str, position: ReadPosition, max_member_bytes: int, threads: int,
                   on_error: Callable[[ShardkitError], None] | None, allow_pipes: bool | None,
                   decode_wav: _WavDecoder) -> Iterator[dict]:
    """One shard's decoded samples, as the stages give them with ``decode_wav``: a zstd shard's common utterances
    through the fused loop (shardkit.training.fused), the rest from its first other member through the stages."""
    f, codec, source = _opened(path, start, threads, allow_pipes)
    try:
        handover = None
        if isinstance(source, ZstdMemberSource):
            handover = yield from fused_samples(source, shard=path, dtype=dtype, max_member_bytes=max_member_bytes,
                                                offset=start, position=position)
    except BaseException:
        f.close()
        raise
    read = {"shard": path, "max_member_bytes": max_member_bytes, "on_error": on_error, "position": position,
            "decode_wav": decode_wav}
    members = (iter_members_fast(source, offset=start, **read) if handover is None
               else _handed_over(handover, source, read))
    utts = group_utterances(_to_the_end(f, source, members, path, codec, allow_pipes), shard=path,
                            on_error=on_error, max_bytes=max_member_bytes, position=position)
    yield from decode_utterances(utts, dtype=dtype, on_error=on_error)


def _handed_over(handover: Handover, source, read: dict) -> Iterator[tuple[str, bytes]]:
    """The member stage from where the fused loop stopped: the unfinished utterance's members, then the rest."""
    position = read["position"]
    for name, data, end in handover.members:
        position.end = end
        yield name, data
    return (yield from iter_members_fast(source, offset=handover.offset, header=handover.header,
                                         count=handover.count, **read))


def iter_samples(shards: Iterable[str] | str, *, decode: bool = True, dtype: str = "float32",
                 decoder: str = "shardkit", keep_bytes: bool = False,
                 max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES, threads: int = 1,
                 on_error: Callable[[ShardkitError], None] | None = None, start: int = 0,
                 position: ReadPosition | None = None,
                 allow_pipes: bool | None = None) -> Iterator[dict]:
    """Every utterance of the shards, in order, as a plain dict: ``{key, shard, txt, audio, sample_rate}``.

    Members are read once, in tar order, never extracted to disk; memory holds about one utterance.
    Other members come along as bytes under their extension. Decoded PCM arrays come from
    :data:`DEFAULT_POOL`: their memory is reused once they (and every view) are gone, never in use.

    Args:
        shards: shard paths (local, URLs, ``pipe:CMD``), or one shard, folder or data.list path.
        decode: False yields the undecoded ``audio_bytes`` and ``audio_format`` instead of ``audio``.
        dtype: "float32" (scaled to [-1, 1)), "int16" or "float64".
        decoder: "shardkit" (numpy for PCM WAV, soundfile for the rest), "soundfile" or "torchaudio".
        keep_bytes: keep ``audio_bytes`` next to the decoded ``audio``.
        max_member_bytes: refuse a member above this size (memory stays bounded).
        threads: decompression threads for codecs that have them.
        on_error: None raises on the first problem; a callable (e.g. :func:`warn_and_skip`) receives
            each located error and the reader goes on (a damaged container ends its shard there).
        start: the tar-stream offset to resume the first shard at (as :func:`iter_utterances`).
        position: a :class:`ReadPosition` the reader keeps up to date, for a later ``start``.
        allow_pipes: run the commands of ``pipe:CMD`` lines (refused otherwise, as a failure of that
            shard, unless SHARDKIT_ALLOW_PIPES=1: a list can name any command).

    Yields:
        ``{key, shard, txt, audio, sample_rate}``: ``audio`` a numpy array (frames, channels).

    Raises:
        UsageError: an unknown ``decoder`` or ``dtype``, or a missing list.
        ShardkitError: with ``on_error=None``, the first bad shard or utterance, naming the shard,
            the member and the reason (:class:`TarFormatError`, :class:`CorruptStreamError`,
            :class:`MemberTooLargeError`, :class:`AudioError`, :class:`InputError`).

    Example:
        ```python
        import shardkit

        for sample in shardkit.iter_samples("data/data.list", on_error=shardkit.warn_and_skip):
            print(sample["key"], sample["txt"], sample["audio"].shape, sample["sample_rate"])
        ```
    """
    if isinstance(shards, str):
        from shardkit.io.inputs import expand_shards

        shards = expand_shards([shards])
    if decode:
        check_decode_settings(decoder, dtype)
    # PCM WAV decoded where zstd writes it (in cache, from one reused buffer) when the bytes are not kept and
    # shardkit's decoder is the one registered (a replaced one is called for every utterance, as it asks)
    decode_wav = (_WavDecoder(dtype) if decode and DECODERS.get(decoder) is decode_fast and not keep_bytes
                  else None)
    if decode_wav is not None:  # one loop for a zstd shard's common members (shardkit.training.fused)
        position = position if position is not None else ReadPosition()
        read_shard = functools.partial(_decoded_shard, dtype=dtype, position=position, threads=threads,
                                       max_member_bytes=max_member_bytes, on_error=on_error,
                                       allow_pipes=allow_pipes, decode_wav=decode_wav)
        return _each_shard(shards, read_shard, start=start, position=position, on_error=on_error)
    utts = iter_utterances(shards, max_member_bytes=max_member_bytes, threads=threads, on_error=on_error,
                           start=start, position=position, allow_pipes=allow_pipes, decode_wav=decode_wav)
    if not decode:
        return utts
    return decode_utterances(utts, dtype=dtype, decoder=decoder, keep_bytes=keep_bytes, on_error=on_error)
