"""Streaming tar: a strict reader for untrusted shards, a deterministic writer, WeNet grouping.

The reader parses 512-byte headers itself (~4.5 GB/s per core on plain speech shards, see
benchmarks/results/tar_hardening.md), reads each member's bytes once, never seeks, never extracts,
and refuses what a shard must not hold: ``..`` or absolute names, links, devices, directories.
Long names (GNU ``L`` and pax ``path``) are understood, so every tar that
``tarfile`` or GNU tar writes for regular files reads back the same.

It is the one tar parser of every command (the sample reader's fast path takes only headers that
``parse_header`` reads the same, and hands everything else here). The contract is the
consumer's reading: a shard reads without error only if Python's ``tarfile`` (``r:*`` as WeNet
opens shards, ``r|*`` as WebDataset streams them) yields exactly the same member names and
bytes. Every header the two could read differently fails the shard with its own check:
``tar_checksum``, ``tar_number_field`` (garbage in a number field, a negative size),
``tar_pax`` (malformed or ambiguous pax records), ``tar_zero_block`` (data after an end
marker), ``tar_name_chain`` (chained long names, an extension header with no member),
``tar_name_encoding`` (a name that is not UTF-8 or holds a NUL). Every loop consumes input and
every size is checked (>= 0, within the stream, within ``max_member_bytes``).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import tarfile
import zlib
from typing import BinaryIO, Callable, Generator, Iterable, Iterator

from shardkit.errors import (
    CorruptStreamError,
    EmptyTarError,
    InputMissingError,
    MemberTooLargeError,
    NonRegularMemberError,
    ShardkitError,
    TarChecksumError,
    TarFormatError,
    TarNameChainError,
    TarNameEncodingError,
    TarNumberFieldError,
    TarPaxError,
    TarZeroBlockError,
    UnsafeNameError,
)
from shardkit.io.codecs import iter_decompressed

BLOCK = 512
RECORD = 20 * BLOCK
ZERO_BLOCK = bytes(BLOCK)
DEFAULT_MAX_MEMBER_BYTES = 2 << 30
# A member above this size is not held whole by the commands that can stream it (copy, digest, index).
STREAM_MEMBER_BYTES = 32 << 20
FIXED_MTIME = 0
AUDIO_EXTENSIONS = frozenset({"wav", "flac", "mp3", "m4a", "ogg", "opus", "wma"})

_REGULAR = (b"0", b"\x00", b"7")
_REFUSED_TYPES = {b"1": "hard link", b"2": "symbolic link", b"3": "character device",
                  b"4": "block device", b"5": "directory", b"6": "FIFO"}


_LARGE_READ = 4 << 20


class ChunkReader:
    """Exact-size reads over an iterator of byte chunks (the decompressors' output)."""

    __slots__ = ("_chunks", "_buf", "_pos")

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._buf = b""
        self._pos = 0

    def read(self, n: int) -> bytes:
        """Exactly ``n`` bytes, or fewer only where the chunks end (the caller checks and names the
        truncation); ValueError for a negative ``n``.
        """
        if n < 0:
            raise ValueError("ChunkReader.read needs a size >= 0")
        buf, pos = self._buf, self._pos
        end = pos + n
        if end <= len(buf):
            self._pos = end
            return buf[pos:end]
        if n >= _LARGE_READ:
            return self._read_large(n)
        parts = [buf[pos:]]
        have = len(buf) - pos
        for chunk in self._chunks:
            need = n - have
            if len(chunk) >= need:
                parts.append(chunk[:need])
                self._buf, self._pos = chunk, need
                return b"".join(parts)
            parts.append(chunk)
            have += len(chunk)
        self._buf, self._pos = b"", 0
        return b"".join(parts)

    def _read_large(self, n: int) -> bytes:
        # chunks go straight into one growing buffer whose bytes object getvalue() hands over without
        # a copy: a large member costs about its size once, not twice (the parts, then their join)
        out = io.BytesIO()
        out.write(memoryview(self._buf)[self._pos:])
        have = len(self._buf) - self._pos
        self._buf, self._pos = b"", 0
        for chunk in self._chunks:
            need = n - have
            if len(chunk) >= need:
                out.write(memoryview(chunk)[:need])
                self._buf, self._pos = chunk, need
                break
            out.write(chunk)
            have += len(chunk)
        return out.getvalue()

    def drain(self) -> None:
        """Consume the rest, so the decompressor checks the stream's end (CRCs, truncation)."""
        for _ in self._chunks:
            pass
        self._buf, self._pos = b"", 0


def parse_number_field(field: bytes, what: str) -> int:
    """A numeric header field, read exactly as ``tarfile`` reads it (GNU base-256 or octal text).

    Octal text is cut at the first NUL, must be ASCII, and is read by ``int(text.strip() or "0", 8)``,
    as in ``tarfile.nti``; anything that does not parse raises ``TarNumberFieldError``.
    """
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256 for sizes over 8 GiB
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[:1] == b"\xff" else value
    try:
        return int(field.split(b"\x00", 1)[0].decode("ascii").strip() or "0", 8)
    except ValueError:  # UnicodeDecodeError included
        raise TarNumberFieldError(f"{what} field {bytes(field)!r} is not a number") from None


def _signed_sum(data: bytes) -> int:
    return sum(b - 256 if b > 127 else b for b in data)


# Every numeric field tarfile parses in each header; garbage in any one makes it stop reading there.
_NUMBER_FIELDS = (("mode", 100, 108), ("uid", 108, 116), ("gid", 116, 124), ("size", 124, 136),
                  ("mtime", 136, 148), ("devmajor", 329, 337), ("devminor", 337, 345))
# The number fields as tarfile, GNU tar and TarWriter write them for a regular member: mode, uid,
# gid (7 octal digits and NUL), size, mtime (11 and NUL), checksum (6, NUL, space). A header whose
# fields match this (and whose device fields are empty or zero) needs no field-by-field parse.
# The test: bytes 100-156 with every octal digit turned into "0" (and nothing else turned into
# "0") equal COMMON_FIELDS, a third of a regular expression's cost.
OCTAL_AS_ZERO = bytes(0x30 if 0x30 <= b <= 0x37 else b for b in range(256))
COMMON_FIELDS = b"0000000\x00" * 3 + b"00000000000\x00" * 2 + b"000000\x00 "
COMMON_DEVICE_FIELDS = frozenset({bytes(16), b"0000000\x000000000\x00"})


def common_checksum(header: bytes) -> int:
    """The unsigned header checksum (byte sum, checksum field counted as spaces), from zlib's C loop.

    adler32's low half is 1 + the byte sum mod 65521; each piece's sum stays below 65521 (at most
    256 * 255), so the pieces give the exact sum: ``a1 + a2 - 2`` for the header, minus
    ``a3 - 1`` for the checksum field, plus 8 spaces (256).
    """
    return ((zlib.adler32(header[:256]) & 0xFFFF) + (zlib.adler32(header[256:]) & 0xFFFF)
            - (zlib.adler32(header[148:156]) & 0xFFFF) + 255)


def header_checksum_ok(header: bytes) -> bool:
    """tarfile's test: the stored checksum equals the unsigned or the signed byte sum (checksum field as spaces)."""
    stored = parse_number_field(header[148:156], "checksum")
    if stored == common_checksum(header):
        return True
    return stored == _signed_sum(header[:148]) + 256 + _signed_sum(header[156:])


def parse_header(header: bytes) -> tuple[bytes, bytes, int]:
    """``(typeflag, name, size)`` of one 512-byte header, read as ``tarfile`` reads it.

    ``name`` is the raw name field cut at its first NUL, with the ustar prefix joined in front
    whenever the prefix field is not empty (tarfile does so whatever the magic says). Raises
    ``TarChecksumError`` or ``TarNumberFieldError`` (no location: the caller adds it) for every
    header tarfile would refuse, and for a negative size.
    """
    if header[100:156].translate(OCTAL_AS_ZERO) == COMMON_FIELDS and header[329:345] in COMMON_DEVICE_FIELDS:
        size = int(header[124:135], 8)
        if int(header[148:154], 8) != common_checksum(header) and not header_checksum_ok(header):
            raise TarChecksumError("checksum mismatch")
    else:
        size = _uncommon_header_size(header)
    typeflag = header[156:157]
    name = header[0:100].split(b"\x00", 1)[0]
    if header[345] and typeflag not in (b"L", b"K", b"S"):
        name = header[345:500].split(b"\x00", 1)[0] + b"/" + name
    return typeflag, name, size


def _uncommon_header_size(header: bytes) -> int:
    """``parse_header``'s slow path, for number fields not written the common way (base-256, spaces, other
    widths): the checksum as tarfile tests it, every number field parsed, the size (never negative)."""
    if not header_checksum_ok(header):
        raise TarChecksumError("checksum mismatch")
    size = 0
    for what, start, end in _NUMBER_FIELDS:
        value = parse_number_field(header[start:end], what)
        if what == "size":
            size = value
    if size < 0:
        raise TarNumberFieldError(f"negative member size ({size})")
    return size


def escape_name(name: bytes | str) -> str:
    """A member name for messages and JSON: UTF-8 as it is, other bytes and NUL as backslash escapes."""
    if isinstance(name, str):
        name = name.encode("utf-8", "surrogateescape")
    return name.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")


def _name_problem(name: bytes) -> str | None:
    if b"\x00" in name:
        return "member name holds a NUL byte (readers cut it there)"
    try:
        name.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"member name is not UTF-8 ({err.reason} at byte {err.start})"
    return None


def _check_name(name: str) -> str | None:
    """Why a member name is unsafe, or None."""
    if not name:
        return "empty member name"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "absolute member name"
    if "\\" in name:
        return "backslash in member name"
    if ".." in name.split("/"):
        return "member name with '..' (path traversal)"
    if name.endswith("/"):
        return "member name ends with '/' (tarfile reads it as a directory)"
    return None


_PAX_RECORD = re.compile(rb"([0-9]{1,20}) ")
_PAX_SIZE = re.compile(rb"[0-9]{1,20}")
# pax keywords tarfile applies to a member: a global header must not set them, an extended one
# only as a plain number (size) or a name (path).
_PAX_APPLIED = (b"path", b"size", b"linkpath")
_PAX_CHARSETS = (b"BINARY", b"ISO-IR 10646 2000 UTF-8")
_PAX_CHARSET_SEARCH = re.compile(rb"\d+ hdrcharset=([^\n]+)\n")


def _parse_pax(data: bytes) -> dict[bytes, bytes]:
    """The records of a pax header's data (padding included), strictly.

    Only what every tarfile version (3.10-3.13 parse pax differently) reads the same is accepted:
    ``LEN KEYWORD=VALUE\\n`` records that fill their length exactly, then only NUL bytes. Raises
    ``TarPaxError``.
    """
    records: dict[bytes, bytes] = {}
    pos, end = 0, len(data)
    while pos < end and data[pos] != 0:
        match = _PAX_RECORD.match(data, pos)
        if match is None:
            raise TarPaxError(f"damaged pax header record at byte {pos} of the header (no length)")
        length = int(match.group(1))
        if length < 5 or pos + length > end:
            raise TarPaxError(f"damaged pax header record at byte {pos} of the header (length {length})")
        if data[pos + length - 1] != 0x0A:
            raise TarPaxError(f"damaged pax header record at byte {pos} of the header (length {length} does "
                              "not end at a newline)")
        keyword, equals, value = data[match.end():pos + length - 1].partition(b"=")
        if not keyword or not equals:
            raise TarPaxError(f"damaged pax header record at byte {pos} of the header (no 'keyword=')")
        if keyword in records:
            raise TarPaxError(f"pax header sets {escape_name(keyword)!r} twice")
        records[keyword] = value
        pos += length
    if data.count(0, pos) != end - pos:
        raise TarPaxError(f"damaged pax header (bytes after its last record at byte {pos})")
    _check_pax_records(data, records)
    return records


def _check_pax_records(data: bytes, records: dict[bytes, bytes]) -> None:
    """What tarfile refuses or reads differently in well-formed pax records: a charset it does not read,
    GNU sparse members, a size that is not a plain decimal number. Raises ``TarPaxError``."""
    charset = _PAX_CHARSET_SEARCH.search(data)  # how tarfile before 3.12.5 finds it: anywhere in the data
    if charset is not None and charset.group(1) not in _PAX_CHARSETS:
        raise TarPaxError(f"pax hdrcharset {escape_name(charset.group(1))!r} is not one tarfile reads")
    for keyword, value in records.items():
        if keyword.startswith(b"GNU.sparse."):
            raise TarPaxError("GNU sparse member refused (pax GNU.sparse records)")
        if keyword == b"hdrcharset" and value not in _PAX_CHARSETS:
            raise TarPaxError(f"pax hdrcharset {escape_name(value)!r} is not one tarfile reads")
    size = records.get(b"size")
    if size is not None and not _PAX_SIZE.fullmatch(size):
        raise TarPaxError(f"pax size {escape_name(size)!r} is not a non-negative decimal number")


# What an ``on_error`` policy may answer for an UnsafeNameError to have that member read after all, under
# its name as it stands (a reader that never extracts, as WebDataset's, can take '..' or '/x' as a name).
KEEP_MEMBER = "keep-member"
EXTENSION_TYPES = (b"L", b"K", b"x", b"g")
MAX_EXTENSION_BYTES = 1 << 20


def iter_tar_members(
    source: BinaryIO | ChunkReader,
    *,
    shard: str = "",
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    on_error: Callable[[ShardkitError], None] | None = None,
    offset: int = 0,
    members: int = 0,
    stream_over: int | None = None,
    position=None,
) -> Generator[tuple[str, bytes], None, bool]:
    """Yield ``(name, data)`` for every regular member of a tar stream, in order.

    ``source.read(n)`` must return exactly n bytes unless the stream ends. The members yielded
    are exactly those Python's ``tarfile`` yields (``r:*`` and ``r|*``), byte for byte, or a
    ``ShardkitError`` is raised: every header tarfile and shardkit (or GNU tar) could read
    differently is refused with its own check (see shardkit.errors). Unsafe, oversized or
    badly named members raise; with ``on_error`` they are passed to it and skipped instead (the
    stream stays in step), except a regular member whose only fault is its name (UnsafeNameError,
    within the size limit) when ``on_error`` answers ``KEEP_MEMBER``: it is yielded under that name.
    Malformed headers and truncation always raise ``TarFormatError`` naming the byte offset. ``offset`` and ``members``: where a caller that parsed the stream's
    start itself hands over. ``stream_over``: a member larger than this many bytes is yielded as
    a ``MemberStream`` (its data read in chunks, never held whole) instead of bytes. ``position``: an
    object whose ``end`` is set, before each member is yielded, to the stream offset just past the
    member's padding (where the next entry's headers begin: a resume point). Returns True
    when the end-of-archive block was read.
    """
    read = source.read
    long_name: bytes | None = None  # a GNU 'L' header's name, waiting for its member
    pax: dict[bytes, bytes] | None = None  # a pax 'x' header's records, waiting for its member
    extension_at = -1  # where the pending extension headers started
    headers = members

    def fail(cls, reason: str, at: int, member: str | None = None):
        return cls(f"{reason} at byte {at}", shard=shard, member=member)

    while True:
        header = read(BLOCK)
        if len(header) < BLOCK:
            if header:
                raise fail(TarFormatError, "stream ends inside a tar header (truncated)", offset)
            if extension_at >= 0:
                raise fail(TarNameChainError, "stream ends after a long-name or pax header, with no member "
                                              "(truncated)", extension_at)
            if not headers:
                raise TarFormatError("empty stream: not a tar archive", shard=shard)
            return False  # no end-of-archive blocks: tolerated, as tarfile and GNU tar do
        if header == ZERO_BLOCK:
            if extension_at >= 0:
                raise fail(TarNameChainError, "end-of-archive block right after a long-name or pax header, "
                                              "with no member", extension_at)
            if not headers:
                raise EmptyTarError("empty tar archive (no members)", shard=shard)
            _check_end(read, offset + BLOCK, shard)
            return True
        at = offset
        offset += BLOCK
        headers += 1
        try:
            typeflag, name, size = parse_header(header)
        except TarFormatError as err:
            if headers == 1 and (isinstance(err, TarChecksumError) or "checksum field" in err.reason):
                raise TarFormatError("not a tar archive (no valid tar header at the start)", shard=shard) from None
            raise type(err)(f"damaged tar header #{headers} ({err.reason}) at byte {at}", shard=shard) from None
        if typeflag in EXTENSION_TYPES:
            if size > MAX_EXTENSION_BYTES:
                raise fail(TarFormatError, f"oversized {typeflag.decode()} extension header ({size} bytes)", at)
            padded = size + (-size % BLOCK)
            data = read(padded)
            if len(data) < padded:
                raise fail(TarFormatError, "stream ends inside a tar extension header (truncated)", at)
            offset += padded
            if extension_at < 0:
                extension_at = at
            if typeflag == b"L":
                if long_name is not None:
                    raise fail(TarNameChainError, "two GNU long-name headers for one member (tarfile takes the "
                                                  "first, GNU tar the last)", at)
                long_name = data.split(b"\x00", 1)[0]  # as tarfile: the padded block, cut at the first NUL
            elif typeflag == b"x":
                if pax is not None:
                    raise fail(TarNameChainError, "two pax headers for one member (readers merge them "
                                                  "differently)", at)
                try:
                    pax = _parse_pax(data)
                except TarPaxError as err:
                    raise fail(TarPaxError, err.reason, at) from None
            elif typeflag == b"g":
                try:
                    records = _parse_pax(data)
                except TarPaxError as err:
                    raise fail(TarPaxError, err.reason, at) from None
                applied = [k.decode() for k in _PAX_APPLIED if k in records]
                if applied:
                    raise fail(TarPaxError, f"global pax header sets {', '.join(applied)} (tarfile applies it to "
                                            "later members, other readers do not)", at)
            if long_name is not None and pax is not None and b"path" in pax:
                raise fail(TarNameChainError, "both a GNU long-name and a pax path for one member (readers "
                                              "disagree on which wins)", extension_at)
            continue
        member_at = extension_at if extension_at >= 0 else at
        extension_at = -1
        directory = typeflag == b"\x00" and header[0:100].split(b"\x00", 1)[0].endswith(b"/")  # tarfile's old style
        if long_name is not None:
            name, long_name = long_name, None
        if pax is not None:
            name = pax.get(b"path", name)
            if b"size" in pax:
                size = int(pax[b"size"])
            pax = None
        members += 1
        text = name.decode("utf-8", "surrogateescape")
        problem: ShardkitError | None = None
        if (why := _name_problem(name)) is not None:
            text = escape_name(name)
            problem = fail(TarNameEncodingError, why, member_at, text)
        elif directory:
            problem = NonRegularMemberError("directory member refused (type '\\0' with a name ending in '/')",
                                            shard=shard, member=text)
        elif typeflag in _REFUSED_TYPES:
            problem = NonRegularMemberError(f"{_REFUSED_TYPES[typeflag]} member refused", shard=shard, member=text)
        elif typeflag not in _REGULAR:
            problem = NonRegularMemberError(f"unsupported member type {typeflag!r}", shard=shard, member=text)
        elif (why := _check_name(text)) is not None:
            problem = UnsafeNameError(why, shard=shard, member=text)
        elif size > max_member_bytes:
            problem = MemberTooLargeError(f"member of {size} bytes exceeds the limit of {max_member_bytes} bytes",
                                          shard=shard, member=text)
        padded = size + (-size % BLOCK)
        if problem is not None:
            if on_error is None:
                raise problem
            problem.member_size = size if typeflag in _REGULAR and size <= max_member_bytes else None
            waived = on_error(problem) is KEEP_MEMBER and isinstance(problem, UnsafeNameError)
            if not (waived and problem.member_size is not None):
                _skip(read, padded, shard, text, offset)
                offset += padded
                continue
        if stream_over is not None and size > stream_over:
            body = MemberStream(read, size, shard, text, offset)
            if position is not None:
                position.end = offset + padded
            yield text, body
            body.finish()
            offset += padded
            continue
        try:
            data = read(size)
        except CorruptStreamError as err:  # the break lies in this member: say which
            raise err.located(shard=shard, member=text)
        if len(data) < size:
            raise fail(TarFormatError, f"stream ends inside member data ({len(data)} of {size} bytes; truncated)",
                       offset, text)
        if padded != size and len(read(padded - size)) < padded - size:
            raise fail(TarFormatError, "stream ends inside the member's padding to 512 bytes (truncated)",
                       offset + size, text)
        offset += padded
        if position is not None:
            position.end = offset
        yield text, data


class MemberStream:
    """A member's data read in chunks straight from the tar stream, for members too large to hold.

    Valid until the reader moves on (the next member is read when the generator resumes); what
    the consumer did not read is skipped then, and the padding checked.
    """

    __slots__ = ("size", "_read", "_left", "_shard", "_member", "_offset")

    def __init__(self, read, size: int, shard: str, member: str, offset: int):
        self.size = size
        self._read, self._left = read, size
        self._shard, self._member, self._offset = shard, member, offset

    def chunks(self, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The member's bytes in order, at most ``chunk_size`` at a time; truncation raises TarFormatError."""
        while self._left > 0:
            want = min(chunk_size, self._left)
            data = self._read(want)
            if len(data) < want:
                got = self.size - self._left + len(data)
                self._left = 0
                raise TarFormatError(f"stream ends inside member data ({got} of {self.size} bytes; truncated) at "
                                     f"byte {self._offset}", shard=self._shard, member=self._member)
            self._left -= want
            yield data

    def finish(self) -> None:
        """Skip what the consumer left unread and check the padding to 512 bytes; TarFormatError
        (naming the shard and member) when the stream ends inside it.
        """
        for _ in self.chunks(1 << 22):
            pass
        pad = -self.size % BLOCK
        if pad and len(self._read(pad)) < pad:
            raise TarFormatError(f"stream ends inside the member's padding to 512 bytes (truncated) at byte "
                                 f"{self._offset + self.size}", shard=self._shard, member=self._member)


def _check_end(read, offset: int, shard: str) -> None:
    """After the first zero block, only zeros may follow (tarfile stops there: anything else is lost)."""
    while True:
        chunk = read(1 << 16)
        if not chunk:
            return
        if chunk.count(0) != len(chunk):
            at = offset + next(i for i, b in enumerate(chunk) if b)
            raise TarZeroBlockError(f"data after the end-of-archive block at byte {offset - BLOCK} (first non-zero "
                                    f"byte at {at}): tarfile stops at the zero block and never reads it",
                                    shard=shard)
        offset += len(chunk)


def _skip(read, nbytes: int, shard: str, member: str, offset: int) -> None:
    while nbytes > 0:
        step = min(nbytes, 1 << 22)
        got = read(step)
        if len(got) < step:
            raise TarFormatError(f"stream ends inside member data (truncated) at byte {offset + len(got)}",
                                 shard=shard, member=member)
        nbytes -= step
        offset += step


def _file_kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def open_regular(path: str) -> int:
    """A file descriptor open for reading on ``path``, which must be a regular file.

    Opened non-blocking first, so a FIFO (or a device) named where a shard file is expected fails
    at once instead of waiting for a writer; the descriptor is blocking again when returned.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputMissingError("no such file", shard=escape_name(path)) from None
    except IsADirectoryError:
        raise ShardkitError("is a directory, not a shard", shard=escape_name(path)) from None
    except OSError as err:
        raise ShardkitError(f"cannot open ({err.strerror or err})", shard=escape_name(path)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ShardkitError(f"is {_file_kind(mode)}, not a regular file (a shard must be a file; give a stream "
                                "as pipe:CMD or -)", shard=escape_name(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_shard(path: str, *, allow_pipes: bool | None = None) -> BinaryIO:
    """Open a shard for reading (a regular file, an fsspec URL or ``pipe:CMD``); failures raise a located error.

    A local path must name a regular file: a FIFO, device or directory fails at once (never blocks).
    A ``pipe:`` command runs only when allowed (``shardkit.io.remote.pipes_allowed``).
    """
    from shardkit.io.remote import is_local, open_input

    if not is_local(path):
        return open_input(path, allow_pipes=allow_pipes)
    return os.fdopen(open_regular(path), "rb", buffering=1 << 20)


def shard_reader(f: BinaryIO, *, shard: str, codec: str | None = None, threads: int = 1) -> BinaryIO | ChunkReader:
    """An exact-read source over a shard: the file itself when plain, else its decompressed chunks."""
    from shardkit.io.codecs import detect_codec

    if codec is None:
        codec = detect_codec(f.peek(16)[:16])
    if codec == "none":
        return f
    return ChunkReader(iter_decompressed(f, shard=shard, codec=codec, threads=threads))


def iter_shard_members(path: str, *, max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES, threads: int = 1,
                       on_error: Callable[[ShardkitError], None] | None = None,
                       stream_over: int | None = None) -> Iterator[tuple[str, bytes]]:
    """``(name, data)`` for each member of the shard at ``path`` (any compression).

    With ``stream_over``, a member above that many bytes comes as a ``MemberStream`` instead of bytes.
    """
    with open_shard(path) as f:
        yield from iter_tar_members(shard_reader(f, shard=path, threads=threads), shard=path,
                                    max_member_bytes=max_member_bytes, on_error=on_error, stream_over=stream_over)


def member_sha256(data: "bytes | MemberStream") -> bytes:
    """The sha256 of a member's data, a streamed member hashed chunk by chunk (never held whole)."""
    if not isinstance(data, MemberStream):
        return hashlib.sha256(data).digest()
    h = hashlib.sha256()
    for chunk in data.chunks():
        h.update(chunk)
    return h.digest()


def check_read_back(back: list[tuple[str, bytes]], expected: list[tuple[str, bytes]], *, shard: str) -> None:
    """A written shard's ``(name, sha256)`` list as read back must be ``expected`` (in order), else a
    VerificationError naming the shard and the first member that differs."""
    if back != expected:
        from shardkit.errors import VerificationError

        mismatch = next((a[0] for a, b in zip(expected, back) if a != b), None)
        raise VerificationError(f"written shard does not read back as written ({len(back)} vs {len(expected)} "
                                "members)", shard=shard, member=mismatch)


class _CountingReader:
    """Counts the bytes read through it, so a member's data offset is known as it is yielded."""

    def __init__(self, f):
        self._read = f.read
        self.count = 0

    def read(self, n: int) -> bytes:
        data = self._read(n)
        self.count += len(data)
        return data


def iter_members_with_offsets(path: str, *, on_error: Callable[[ShardkitError], None] | None = None
                              ) -> Iterator[tuple[str, bytes, int, bool]]:
    """``(name, data, data offset in the decompressed tar, whether the tar is compressed)`` per member of the
    shard at ``path``: in a plain tar the offset is where a positioned read finds the member's bytes."""
    with open_shard(path) as f:
        reader = shard_reader(f, shard=path)
        counting = _CountingReader(reader)
        for name, data in iter_tar_members(counting, shard=path, on_error=on_error):
            yield name, data, counting.count - (-len(data) % 512) - len(data), reader is not f


def split_key(name: str) -> tuple[str, str]:
    """WeNet's rule: key is the prefix before the last '.', extension what follows."""
    pos = name.rfind(".")
    if pos < 0 or "/" in name[pos:]:
        return name, ""
    return name[:pos], name[pos + 1:]


def group_samples(members: Iterable[tuple[str, bytes]], *, shard: str = "",
                  max_bytes: int = DEFAULT_MAX_MEMBER_BYTES) -> Iterator[dict]:
    """Group adjacent members by key into sample dicts, as WeNet does.

    Each sample: ``{"__key__", "__shard__", "__members__": [names in order], ext: bytes, ...}``.
    A later member with an extension already in the sample replaces its bytes (as in WeNet); the
    ``__members__`` list still shows both, so validators can report it. Memory holds one sample:
    members of one key above ``max_bytes`` together raise ``MemberTooLargeError`` (a tuple's
    first item counts as the member's data).
    """
    sample: dict | None = None
    held = 0
    for name, data in members:
        key, ext = split_key(name)
        if sample is None or sample["__key__"] != key:
            if sample is not None:
                yield sample
            sample = {"__key__": key, "__shard__": shard, "__members__": []}
            held = 0
        held += len(data[0] if isinstance(data, tuple) else data)
        if held > max_bytes:
            raise MemberTooLargeError(f"the members of key {key!r} together exceed the limit of {max_bytes} bytes",
                                      shard=shard, member=name)
        sample["__members__"].append(name)
        sample[ext] = data
    if sample is not None:
        yield sample


def tar_header(name: str, size: int) -> bytes:
    """Deterministic header(s) for a regular member: fixed mtime, uid/gid 0, no user names.

    Byte for byte what ``tarfile`` writes in GNU format: a name that fits its 100-byte field and a
    size below 8 GiB fill in a template (name, size, checksum); anything else goes through tarfile.
    """
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= 100 and 0 <= size < _OCTAL_SIZE_LIMIT and b"\x00" not in raw:
        field = b"%011o\x00" % size
        checksum = _TEMPLATE_SUM + sum(raw) + sum(field)
        return b"".join((raw, bytes(100 - len(raw)), _TEMPLATE[100:124], field, _TEMPLATE[136:148],
                         b"%06o\x00 " % checksum, _TEMPLATE[156:]))
    return _tarfile_header(name, size)


def _tarfile_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = FIXED_MTIME
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


_OCTAL_SIZE_LIMIT = 8 ** 11
_TEMPLATE = _tarfile_header("", 0)
# the checksum of a header is the sum of its bytes with the checksum field as 8 spaces
_TEMPLATE_SUM = sum(_TEMPLATE[100:124]) + sum(_TEMPLATE[136:148]) + 8 * 32 + sum(_TEMPLATE[156:])


class TarWriter:
    """Writes members with deterministic headers into a binary stream; ``close`` ends the archive."""

    def __init__(self, out: BinaryIO):
        self._out = out
        self._offset = 0
        self.members = 0

    @property
    def offset(self) -> int:
        """Bytes written so far: a member's data starts at ``offset - size - padding`` once it is added."""
        return self._offset

    def add(self, name: str, data: bytes) -> None:
        """Append one regular member (deterministic header, data, zero padding to 512 bytes)."""
        header = tar_header(name, len(data))
        pad = -len(data) % BLOCK
        self._out.write(header)
        self._out.write(data)
        if pad:
            self._out.write(bytes(pad))
        self._offset += len(header) + len(data) + pad
        self.members += 1

    def add_chunks(self, name: str, size: int, chunks: Iterable[bytes]) -> None:
        """A member of ``size`` bytes given as chunks (never held whole); fewer or more bytes raise."""
        header = tar_header(name, size)
        self._out.write(header)
        written = 0
        for chunk in chunks:
            written += len(chunk)
            if written > size:
                break
            self._out.write(chunk)
        if written != size:
            raise ShardkitError(f"member data is {written} bytes, its header says {size}", member=name)
        pad = -size % BLOCK
        if pad:
            self._out.write(bytes(pad))
        self._offset += len(header) + size + pad
        self.members += 1

    def close(self) -> int:
        """Write the end-of-archive blocks and record padding; returns the tar size in bytes."""
        end = 2 * BLOCK
        end += -(self._offset + end) % RECORD
        self._out.write(bytes(end))
        self._offset += end
        return self._offset


