"""Compression codecs: detection by magic bytes, streaming readers and writers, one registry.

Readers are generators of decompressed chunks (``iter_decompressed``); writers are file-like
objects that compress into a caller's binary file and leave it open (``open_writer``).
Every codec's reader detects a truncated or damaged stream and raises ``CorruptStreamError``.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

import zstandard

from shardkit.errors import CorruptStreamError, TarFormatError, UsageError

READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Codec:
    """One output compression: its name, the suffix after ``.tar``, its default level and range, and how to
    open a writer over a binary file.
    """
    name: str
    suffix: str  # appended to ".tar"
    default_level: int | None
    levels: tuple[int, int] | None
    open_writer: Callable[[BinaryIO, int | None], BinaryIO]
    iter_chunks: Callable[[BinaryIO, int], Iterator[bytes]]


class _NoCloseWriter(io.RawIOBase):
    """Plain output: writes straight through, and closing it leaves the target open."""

    def __init__(self, target: BinaryIO):
        self._target = target

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self._target.write(data)


def _plain_chunks(f: BinaryIO, threads: int) -> Iterator[bytes]:
    while chunk := f.read(READ_CHUNK):
        yield chunk


def _stream_chunks(reader: BinaryIO) -> Iterator[bytes]:
    # read1 hands over what is decoded so far, so the bytes before a damaged spot still arrive
    read = getattr(reader, "read1", reader.read)
    with reader:
        while chunk := read(READ_CHUNK):
            yield chunk


def _gz_chunks(f: BinaryIO, threads: int) -> Iterator[bytes]:
    try:
        from isal import isal_zlib as deflate
    except ImportError:  # isal is a speed-up, not a requirement
        import zlib as deflate
    # A decompressor object rather than isal's IGzipFile: that one drops the bytes it decoded in the
    # read that meets a truncated end, so the members complete before the break would be lost.
    decompressor = deflate.decompressobj(_GZIP_WBITS)
    started = False
    while raw := f.read(READ_CHUNK):
        while raw:
            if not started and not raw.strip(b"\0"):
                break  # zero padding after the last gzip member, as gzip.GzipFile allows
            started = True
            chunk = decompressor.decompress(raw, READ_CHUNK)
            if chunk:
                yield chunk
            if decompressor.eof:  # one gzip member ended: another may follow (concatenated gzip)
                raw, decompressor, started = decompressor.unused_data, deflate.decompressobj(_GZIP_WBITS), False
            else:
                raw = decompressor.unconsumed_tail
    if started:
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")


_GZIP_WBITS = 16 + 15  # a gzip header and trailer around a deflate stream with a 32 KiB window


def _bz2_chunks(f: BinaryIO, threads: int) -> Iterator[bytes]:
    try:
        import indexed_bzip2
    except ImportError:
        yield from _stream_chunks(bz2.BZ2File(f, mode="rb"))
        return
    if not f.seekable():  # a pipe or a stream: indexed_bzip2 needs to seek, the stdlib does not
        yield from _stream_chunks(bz2.BZ2File(f, mode="rb"))
        return
    start = f.tell()
    yielded = False
    try:
        for chunk in _stream_chunks(indexed_bzip2.open(f, parallelization=max(1, threads))):
            yielded = True
            yield chunk
    except RuntimeError:
        if yielded:
            raise
        # indexed_bzip2 scans ahead and refuses a damaged file before its first byte; the stdlib
        # decoder streams up to the damage, so what precedes it can still be read (and salvaged)
        f.seek(start)
        yield from _stream_chunks(bz2.BZ2File(f, mode="rb"))


def _xz_chunks(f: BinaryIO, threads: int) -> Iterator[bytes]:
    yield from _stream_chunks(lzma.LZMAFile(f, mode="rb"))


def _zst_chunks(f: BinaryIO, threads: int) -> Iterator[bytes]:
    # The loop of the stdlib-style ZstdFile's reader (Python 3.14's compression.zstd, or its backport:
    # _streams.DecompressReader), driven here with 1 MiB reads instead of 8 KiB ones and without the
    # BufferedReader that ZstdFile puts above it (two copies of every decompressed byte). What it keeps:
    # the output of each call is bounded (a highly repetitive stream cannot balloon memory); a frame cut
    # short raises EOFError after every byte decoded before the cut; frames follow one another (skippable
    # ones, the seekable format's seek table, give nothing). zstandard's stream_reader would end silently
    # at a truncated frame.
    zstd = _zstd_module()
    decompressor = zstd.ZstdDecompressor()
    while True:
        if decompressor.eof:
            raw = decompressor.unused_data or f.read(READ_CHUNK)
            if not raw:
                return
            decompressor = zstd.ZstdDecompressor()
            chunk = decompressor.decompress(raw, READ_CHUNK)  # trailing bytes that are no frame raise, as in ZstdFile
        elif decompressor.needs_input:
            raw = f.read(READ_CHUNK)
            if not raw:
                raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            chunk = decompressor.decompress(raw, READ_CHUNK)
        else:
            chunk = decompressor.decompress(b"", READ_CHUNK)
        if chunk:
            yield chunk


def _zstd_module():
    try:
        from compression import zstd  # Python 3.14+
    except ImportError:
        from backports import zstd
    return zstd


# zst output is zstd's seekable format: independent frames of ZST_FRAME_BYTES decompressed bytes (each
# with its content checksum) and, at the end, a seek table in a skippable frame. Any zstd decoder reads
# it as one stream (frames back to back, the table skipped); a reader resuming mid-shard jumps to the
# frame holding its offset instead of decompressing the shard up to it. 1 MiB bounds that skip to about
# a millisecond of decompression; the frames cost nothing measurable in size or speed at level 3
# (measured with frames of 256 KiB to 4 MiB: benchmarks/results/zst_seekable.md).
ZST_FRAME_BYTES = 1 << 20


def _zst_writer(f: BinaryIO, level: int | None) -> BinaryIO:
    # pyzstd cuts frames at exact multiples of ZST_FRAME_BYTES of input, whatever the write sizes, and
    # compresses in this thread (zstd's worker threads cannot split a 1 MiB frame, cost CPU, and give
    # other bytes than one thread: the output must not depend on --threads or -j)
    import pyzstd

    options = {pyzstd.CParameter.compressionLevel: 3 if level is None else level, pyzstd.CParameter.checksumFlag: 1}
    return pyzstd.SeekableZstdFile(f, "w", level_or_option=options, max_frame_content_size=ZST_FRAME_BYTES)


def _gz_writer(f: BinaryIO, level: int | None) -> BinaryIO:
    # mtime=0 and no file name keep the gzip header deterministic
    return gzip.GzipFile(filename="", fileobj=f, mode="wb", compresslevel=6 if level is None else level, mtime=0)


def _bz2_writer(f: BinaryIO, level: int | None) -> BinaryIO:
    return bz2.BZ2File(f, mode="wb", compresslevel=9 if level is None else level)


def _xz_writer(f: BinaryIO, level: int | None) -> BinaryIO:
    return lzma.LZMAFile(f, mode="wb", preset=6 if level is None else level, check=lzma.CHECK_CRC64)


CODECS: dict[str, Codec] = {
    "none": Codec("none", "", None, None, lambda f, level: _NoCloseWriter(f), _plain_chunks),
    "gz": Codec("gz", ".gz", 6, (1, 9), _gz_writer, _gz_chunks),
    "bz2": Codec("bz2", ".bz2", 9, (1, 9), _bz2_writer, _bz2_chunks),
    "xz": Codec("xz", ".xz", 6, (0, 9), _xz_writer, _xz_chunks),
    "zst": Codec("zst", ".zst", 3, (-7, 22), _zst_writer, _zst_chunks),
}

COMPRESSED_SUFFIXES = {".gz": "gz", ".tgz": "gz", ".bz2": "bz2", ".tbz2": "bz2", ".xz": "xz",
                       ".txz": "xz", ".zst": "zst", ".zstd": "zst", ".tzst": "zst"}

_MAGIC = (
    (b"\x1f\x8b", "gz"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zst"),
)


def detect_codec(head: bytes) -> str:
    """Name of the compression of a stream from its first bytes; "none" for anything else."""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[3:4] != b"0" and head[4:10] in (
        b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90"):
        return "bz2"
    return "none"


# The one codec grammar of every command (convert, balance, make, bench): CODEC[:LEVEL], a codec of
# the registry or one of these aliases; parse_codec_spec is the only parser.
CODEC_ALIASES = {"zstd": "zst", "gzip": "gz", "plain": "none", "tar": "none"}
CODEC_GRAMMAR = "none, zst[:LEVEL], bz2[:LEVEL], gz[:LEVEL] or xz[:LEVEL] (zstd = zst)"


def parse_codec_spec(spec: str, level: int | None = None) -> tuple[str, int | None]:
    """``"zst:19"`` -> ``("zst", 19)``; ``"none"`` -> ``("none", None)``; ``"zstd"`` -> ``("zst", 3)``.

    ``level`` (a separate ``--level`` option) applies when ``spec`` names none; both is a UsageError,
    as is an unknown codec or a level out of the codec's range.
    """
    name, colon, level_text = spec.strip().lower().partition(":")
    name = CODEC_ALIASES.get(name, name)
    if name not in CODECS:
        raise UsageError(f"unknown codec {spec!r}; give {CODEC_GRAMMAR}")
    if level is not None:
        if colon:
            raise UsageError(f"codec {spec!r} names a level and --level gives another: give one")
        level_text = str(level)
    codec = CODECS[name]
    if not level_text:
        return name, codec.default_level
    if codec.levels is None:
        raise UsageError(f"codec {name!r} takes no level (got {spec!r})")
    try:
        level = int(level_text)
    except ValueError:
        raise UsageError(f"level in {spec!r} is not an integer") from None
    low, high = codec.levels
    if not low <= level <= high:
        raise UsageError(f"{name} level must be in {low}..{high} (got {level})")
    return name, level


try:  # isal raises its own error class (not an OSError) on a damaged deflate stream
    from isal.igzip_lib import IsalError as _IsalError
except ImportError:
    _IsalError = ValueError
_DECODE_ERRORS = (EOFError, OSError, lzma.LZMAError, zstandard.ZstdError, _zstd_module().ZstdError, RuntimeError,
                  ValueError, _IsalError)


def iter_decompressed(f: BinaryIO, *, shard: str, codec: str | None = None, threads: int = 1) -> Iterator[bytes]:
    """Decompressed chunks of a shard file opened for binary reading.

    The codec is detected from the magic bytes unless given. Any decompressor error, and a
    stream that ends early, becomes ``CorruptStreamError`` naming the shard.
    """
    head = f.peek(16)[:16] if hasattr(f, "peek") else b""
    if codec is None:
        if not head:
            head = f.read(16)
            f.seek(0)
        codec = detect_codec(head)
    try:
        yield from CODECS[codec].iter_chunks(f, threads)
    except CorruptStreamError as err:
        raise err.located(shard=shard)
    except _DECODE_ERRORS as err:
        raise CorruptStreamError(f"{codec} stream is truncated or corrupt ({type(err).__name__}: {err})",
                                 shard=shard) from err


# A run of local bz2 files small enough decodes each shard on every core in turn, in one process (as lbzip2
# spreads one file over the cores), rather than one shard per core in a pool of processes. In one process a
# shard's serial part (tar parse, digests, zstd, read-back) runs on one core while the others wait, so it
# costs (1 - 1/cores) of that serial time against the pool; the pool costs its start-up (a forkserver
# importing the task's modules: 0.5-0.8 CPU-s on 2 cores, about as much wall on 16). One process wins while
# serial x (1 - 1/cores) < start-up, i.e. below a total of ONE_PROCESS_BZ2_BYTES / (1 - 1/cores): 64 MiB on
# 2 cores (benchmarks/results/2026-11-28-convert-reader.md), 34 MiB on 16, where a limit growing with the
# cores had kept 16 shards of 232 MB in one process at 0.61-0.67x the lbzip2 | zstd pipeline
# (benchmarks/results/2026-11-28-sixteen-cores.md).
ONE_PROCESS_BZ2_BYTES = 32 << 20


def local_file_sizes(paths: list[str]) -> list[int] | None:
    """The byte sizes of ``paths``, or None unless every one is a local regular file (not "-", a URL, a FIFO:
    a stat, never an open, so a FIFO is not waited on)."""
    import stat

    sizes = []
    for path in paths:
        try:
            st = os.stat(path) if path != "-" else None
        except (OSError, ValueError):  # a URL, a missing or unreadable file
            return None
        if st is None or not stat.S_ISREG(st.st_mode):
            return None
        sizes.append(st.st_size)
    return sizes


def bz2_fits_one_process(paths: list[str], cores: int) -> bool:
    """Whether ``paths`` are all local bz2 files (by their magic bytes) holding together at most
    ``ONE_PROCESS_BZ2_BYTES / (1 - 1/cores)``: a run of them is best decoded in one process."""
    sizes = local_file_sizes(paths)
    if not sizes or sum(sizes) * (cores - 1) > ONE_PROCESS_BZ2_BYTES * cores:
        return False
    for path in paths:
        try:
            with open(path, "rb") as f:
                head = f.read(16)
        except OSError:  # unreadable: not for this rule
            return False
        if detect_codec(head) != "bz2":
            return False
    return True


def open_writer(f: BinaryIO, codec: str, level: int | None = None) -> BinaryIO:
    """A writable file object that compresses into ``f``; closing it finishes the stream only."""
    return CODECS[codec].open_writer(f, level)


def codec_of_path(path: str) -> str:
    """Codec named by a file's suffix (for naming outputs only; reading always sniffs magic)."""
    lower = path.lower()
    for suffix, name in COMPRESSED_SUFFIXES.items():
        if lower.endswith(suffix):
            return name
    return "none"


_SEEK_TABLE_FOOTER = struct.Struct("<IBI")  # number of frames, descriptor, magic
_SEEK_TABLE_ENTRY = struct.Struct("<II")  # compressed size, decompressed size (then a checksum if flagged)


def zstd_frame_holding(f, path: str, start: int) -> tuple[int, int] | None:
    """Compressed and decompressed offsets where the frame holding byte ``start`` of the decompressed
    stream begins, when the zstd shard carries a seek table (zstd's seekable format, as shardkit and
    pyzstd's SeekableZstdFile or t2sz write it). None when there is none (or pyzstd is not installed):
    the caller skips by decompressing from the start.

    pyzstd checks the format (the table's frame sizes add up to the file's); it exposes no frame
    offsets, so the entries are read here (the format's footer and 8- or 12-byte entries).

    Raises:
        TarFormatError: ``start`` lies past the end of the decompressed stream (the shard changed
            since the offset was taken)."""
    try:
        import pyzstd
    except ImportError:
        return None
    if not f.seekable() or not pyzstd.SeekableZstdFile.is_seekable_format_file(f):
        return None
    size = f.seek(0, os.SEEK_END)
    f.seek(size - _SEEK_TABLE_FOOTER.size)
    frames, descriptor, _ = _SEEK_TABLE_FOOTER.unpack(f.read(_SEEK_TABLE_FOOTER.size))
    entry = 12 if descriptor & 0x80 else 8
    f.seek(size - _SEEK_TABLE_FOOTER.size - frames * entry)
    table = f.read(frames * entry)
    compressed = decompressed = 0
    for i in range(frames):
        frame_c, frame_d = _SEEK_TABLE_ENTRY.unpack_from(table, i * entry)
        if start < decompressed + frame_d:
            return compressed, decompressed
        compressed, decompressed = compressed + frame_c, decompressed + frame_d
    raise TarFormatError(f"a resume offset of {start} bytes is past the end of the tar stream ({decompressed} "
                         "bytes): the shard changed since the state was saved", shard=path)
