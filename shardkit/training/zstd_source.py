"""The training reader's zstd source: exact-size member reads decompressed straight into their buffers.

zstandard's ``stream_reader`` decompresses into a caller's buffer (``readinto``), so a member's bytes are
written once, where they are used. shardkit.training.reader's member stage reads through it.
"""

from __future__ import annotations

import io
from typing import Callable

from shardkit.errors import CorruptStreamError
from shardkit.io.tar import BLOCK

# Compressed bytes handed to zstd per read. 1 MiB, the shard file's buffer size (shardkit.io.tar.open_shard):
# a read of the buffer's size goes straight from the file into zstd's input, where a smaller one is first
# copied out of the buffer (one memory copy of every compressed byte, ~2% of a zst:3 WAV read).
ZSTD_READ_SIZE = 1 << 20
# A zstd member above this is read in pieces into a growing buffer instead of one preallocated one.
_LARGE_MEMBER = 64 << 20
# The largest member decoded from the source's reused buffer (read_decoded_member); larger ones get their own.
SCRATCH_BYTES = 16 << 20


class ZstdMemberSource:
    """Exact-size reads from a zstd shard, decompressed straight into a buffer per read.

    ``read_member(size)`` returns a member's data together with the header that follows it, in
    one decompressor call (one call per member instead of three: header, data, padding), and
    the data is a ``bytearray`` that zstd filled in place, so member bytes are written once.
    Small reads return ``bytes``.

    zstandard's ``stream_reader`` ends silently on a truncated frame. The tar layer notices every
    truncation that loses a header or member byte; what it cannot see, a stream cut exactly at a
    member boundary, shows as a tar without its end-of-archive block, and only then is the stream
    checked end to end with the foundation's strict reader (see shardkit.training.reader.read_members).
    """

    __slots__ = ("readinto", "_shard", "zstd_error", "_scratch")

    def __init__(self, f, shard: str):
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=ZSTD_READ_SIZE, read_across_frames=True)
        # zstd's own call (it fills the buffer unless the stream ends) and error, for the fused loop
        # (shardkit.training.fused), which turns an error into ``corrupt``'s as ``fill`` does
        self.readinto = reader.readinto
        self._shard = shard
        self.zstd_error = zstandard.ZstdError
        self._scratch = bytearray()

    def corrupt(self, err: Exception) -> CorruptStreamError:
        """The located error for a zstd error inside this shard's stream."""
        return CorruptStreamError(f"zst stream is corrupt ({err})", shard=self._shard)

    def scratch(self, nbytes: int) -> memoryview:
        """The source's reused buffer, at least ``nbytes`` (at most SCRATCH_BYTES + 2 blocks asked for)."""
        if len(self._scratch) < nbytes:
            # grown in 1 MiB steps, never shrunk: at most SCRATCH_BYTES for the whole read
            self._scratch = bytearray(min(SCRATCH_BYTES, nbytes + (1 << 20)) + BLOCK)
        return memoryview(self._scratch)  # the buffer is replaced, never resized: views of it need no release

    def fill(self, view: memoryview) -> int:
        """Decompress into ``view`` until it is full or the stream ends; the bytes written."""
        got, want = 0, len(view)
        try:
            while got < want:
                n = self.readinto(view[got:])
                if not n:
                    break
                got += n
        except self.zstd_error as err:
            raise self.corrupt(err) from err
        return got

    def read(self, n: int):
        buf = bytearray(n)
        got = self.fill(memoryview(buf))
        return bytes(buf[:got]) if n <= BLOCK or got < n else buf

    def read_member(self, size: int):
        """``(data, next_header, padded_whole)``: a member's data (short if the stream ends), the block
        after it (empty at the end of the stream), and whether its padding to 512 bytes was all there."""
        padded = size + (-size % BLOCK)
        if padded > _LARGE_MEMBER:
            return self._read_large_member(size, padded)
        buf = bytearray(padded + BLOCK)
        got = self.fill(memoryview(buf))
        header = bytes(buf[padded:got]) if got > padded else b""
        if got < size:
            return bytes(buf[:got]), b"", False
        if size <= BLOCK:
            return bytes(buf[:size]), header, got >= padded
        del buf[size:]  # shrinking by less than half keeps the buffer in place
        return buf, header, got >= padded

    def read_decoded_member(self, size: int, decode: Callable):
        """``read_member`` for a member that ``decode`` turns into its samples while zstd's output is still in
        cache: decompressed into one reused buffer instead of a fresh one per member, then converted from it.
        The member's data is ``decode``'s result, or a copy of the bytes when it returns None (not a canonical
        PCM WAV: decoded later, as any member)."""
        padded = size + (-size % BLOCK)
        if padded > SCRATCH_BYTES:
            return self.read_member(size)
        view = self.scratch(padded + BLOCK)
        start = 0
        direct = getattr(decode, "direct_target", None)
        if direct is not None and size > 44:  # a WAV header first: its samples may go straight to their array
            start = self.fill(view[:44])
            target = direct(view[:44], size) if start == 44 else None
            if target is not None:
                return self._read_into(target, bytes(view[:44]), size, padded, view)
        got = start + self.fill(view[start:padded + BLOCK])  # (after a short header read, the stream has ended)
        header = bytes(view[padded:got]) if got > padded else b""
        if got < size:
            return bytes(view[:got]), b"", False
        data = view[:size]
        decoded = decode(data)
        return (bytes(data) if decoded is None else decoded), header, got >= padded

    def _read_into(self, target, head: bytes, size: int, padded: int, scratch: memoryview):
        """``read_decoded_member`` with the samples decompressed into ``target``'s memory and the rest of the
        member (bytes after the samples, padding) and the next header into ``scratch``."""
        decoded, samples = target
        got = self.fill(samples)
        if got < len(samples):  # cut short: the bytes that came, as any short member (the tar layer says where)
            return head + bytes(samples[:got]), b"", False
        rest, pad_end = size - 44 - got, padded - 44 - got
        tail = self.fill(scratch[:pad_end + BLOCK])
        if tail < rest:
            return head + bytes(samples) + bytes(scratch[:tail]), b"", False
        return decoded, (bytes(scratch[pad_end:tail]) if tail > pad_end else b""), tail >= pad_end

    def _read_large_member(self, size: int, padded: int):
        # grown as the data arrives: a header claiming a huge size costs what the stream holds, not the claim
        out = io.BytesIO()
        left = size
        while left:
            chunk = self.read(min(left, 1 << 22))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)
        data = out.getvalue()
        if left:
            return data, b"", False
        pad = self.read(padded - size) if padded > size else b""
        whole = len(pad) == padded - size
        return data, (self.read(BLOCK) if whole else b""), whole

    def drain(self) -> None:
        """Decompress the rest (record padding), so zstd verifies the frame checksum at its end."""
        scratch = memoryview(bytearray(1 << 16))
        while self.fill(scratch):
            pass
