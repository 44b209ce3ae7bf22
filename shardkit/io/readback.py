"""A shard's read-back verification, run while the shard is being written (convert's).

The written file is read through its own descriptor as it grows (what the page cache holds, as a
read-back after the write would see it), decompressed, parsed with the checked tar reader and
hashed member by member in a thread beside the conversion; at the commit, after the last flush,
the rest is read and the (name, sha256) list must equal what was written. The same proof as
reading the file back after closing it (``run.lifecycle.verify_members``), without a second pass
over the shard after its last byte: the read-back's decompression, parsing and hashing overlap
the source's decoding instead of forming each shard's serial tail.
"""

from __future__ import annotations

import os
import threading

from shardkit.io.codecs import iter_decompressed
from shardkit.io.tar import STREAM_MEMBER_BYTES, ChunkReader, check_read_back, iter_tar_members, member_sha256

# the writer tells the reader about new bytes after at least this many (one flush and wake-up each)
NOTIFY_BYTES = 1 << 20


class ReadBackWhileWriting:
    """A verifier over the file at ``path`` that its writer fills: ``wrap(file)`` is where the compressed
    bytes go (counted, flushed and announced), ``verify`` is the ``AtomicFile.commit`` callback that ends
    the read-back and compares, ``close`` stops the thread whatever happened (idempotent).
    """

    def __init__(self, path: str, codec: str, *, shard: str, max_member_bytes: int):
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._codec, self._shard, self._max_member_bytes = codec, shard, max_member_bytes
        self._cond = threading.Condition()
        self._available = 0  # bytes the file holds (flushed by the writer)
        self._complete = False  # the writer flushed its last byte (or gave up)
        self._pos = 0
        self.digests: list[tuple[str, bytes]] | None = None
        self.expected: list[tuple[str, bytes]] = []  # (name, sha256) as written: the caller's, before the commit
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="shardkit-readback", daemon=True)
        self._thread.start()

    # --- the writer's side -----------------------------------------------------------------------

    def wrap(self, f) -> "_AnnouncingFile":
        """``f`` (the temporary file) behind a layer that lets the reader see each MiB as it is written."""
        return _AnnouncingFile(f, self)

    def _announce(self, flushed: int) -> None:
        with self._cond:
            self._available = flushed
            self._cond.notify()

    def verify(self, tmp: str) -> None:
        """``AtomicFile.commit``'s check (the file is flushed and fsynced): read the rest, then compare."""
        self._end()
        if self.error is not None:
            raise self.error
        check_read_back(self.digests, self.expected, shard=self._shard)

    def _end(self) -> None:
        with self._cond:
            self._complete = True
            self._available = os.fstat(self._fd).st_size
            self._cond.notify()
        self._thread.join()

    def close(self) -> None:
        """Stop the reader (a failed or interrupted write ends it too) and close its descriptor."""
        if self._fd < 0:
            return
        self._end()
        os.close(self._fd)
        self._fd = -1

    # --- the reader's side (its thread) ----------------------------------------------------------

    def read(self, n: int) -> bytes:
        """``n`` bytes from where the read-back stands, waiting for the writer; fewer only at the end."""
        with self._cond:
            while self._available - self._pos < n and not self._complete:
                self._cond.wait()
        data = os.pread(self._fd, n, self._pos)
        self._pos += len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False  # a stream that grows: the decoders read it front to back (bz2 through the stdlib's)

    def _run(self) -> None:
        try:
            source = self if self._codec == "none" else ChunkReader(
                iter_decompressed(self, shard=self._shard, codec=self._codec))
            members = iter_tar_members(source, shard=self._shard, max_member_bytes=self._max_member_bytes,
                                       stream_over=STREAM_MEMBER_BYTES)
            self.digests = [(name, member_sha256(data)) for name, data in members]
        except BaseException as err:  # noqa: BLE001 - handed to the committing thread, which raises it
            self.error = err


class _AnnouncingFile:
    """The temporary file as the writer sees it: every write passes through; each MiB is flushed and
    announced to the read-back."""

    __slots__ = ("_f", "_readback", "_written", "_announced")

    def __init__(self, f, readback: ReadBackWhileWriting):
        self._f, self._readback = f, readback
        self._written = self._announced = 0

    def write(self, data) -> int:
        n = self._f.write(data)
        self._written += len(data)
        if self._written - self._announced >= NOTIFY_BYTES:
            self._f.flush()
            self._announced = self._written
            self._readback._announce(self._written)
        return n

    def flush(self) -> None:
        self._f.flush()
