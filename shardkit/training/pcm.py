"""16-bit PCM WAV as the training reader decodes it: the canonical header, and the buffers decoded arrays live in.

Shared by the reader's stages (shardkit.training.reader) and its fused loop for zstd shards
(shardkit.training.fused), which decode the same members to the same arrays.
"""

from __future__ import annotations

import struct
import sys
import weakref

import numpy as np

INT16_SCALE = np.float32(1 / 32768)


# RIFF, size, then "WAVEfmt " + fmt size 16 + tag 1 (PCM) as one field, channels, rate, byte rate, block
# align, then bits 16 + "data" as one field, data size: the fixed parts are compared as bytes, in one go
_CANONICAL_WAV = struct.Struct("<4sI14sHIIH6sI")
_CANONICAL_FMT = b"WAVEfmt \x10\x00\x00\x00\x01\x00"
_CANONICAL_DATA = b"\x10\x00data"


def canonical_layout(head):
    """``(channels, rate, samples)`` of a canonical 44-byte-header 16-bit PCM WAV, else None."""
    riff, _, fmt, channels, rate, _, align, data_id, size = _CANONICAL_WAV.unpack_from(head)
    if (riff != b"RIFF" or fmt != _CANONICAL_FMT or data_id != _CANONICAL_DATA or channels < 1 or rate < 1
            or align != 2 * channels or size in (0, 0xFFFFFFFF) or size % align):
        return None
    return channels, rate, size // 2


def frames_held(layout: tuple[int, int, int], size: int) -> int:
    """Frames of a canonical WAV (``canonical_layout``) that its ``size`` bytes hold: like parse_wav_header,
    what the bytes hold when the header claims more."""
    channels, _, count = layout
    return min(2 * count, size - 44) // (2 * channels)


_ITEMSIZE = {np.float32: 4, np.int16: 2, np.float64: 8, np.int64: 8}


class BufferPool:
    """Output buffers for decoded audio, reused once every array made from one is gone.

    Each decoded utterance needs a fresh array of hundreds of KB. glibc (by default) returns such
    blocks to the kernel when they are freed, and the next utterance then gets fresh pages,
    zero-filled and faulted in one by one: a quarter of the plain-WAV read rate. The pool keeps
    the memory instead, without changing the process's allocator: ``array(count, dtype)`` returns
    an array over a pooled buffer, and a weak reference on the buffer's export (which every view
    of the array keeps alive) hands the buffer back when the last array, view or tensor made
    from it is collected. Arrays stay valid as long as anything uses them; only dead buffers are
    reused. Sizes come in half-octave classes (at most 1.5x the request, 64 KB at least), the
    most recently freed buffer that fits first (still in cache); at most ``max_free_bytes`` of
    unused buffers are kept.
    """

    __slots__ = ("_free", "_free_bytes", "_live", "max_free_bytes")

    GRAIN = 1 << 16

    def __init__(self, max_free_bytes: int = 64 << 20):
        self._free: list[bytearray] = []  # unused buffers, the most recently freed last
        self._free_bytes = 0
        self._live: dict[int, tuple] = {}  # id(weakref) -> (weakref, buffer), until the buffer comes back
        self.max_free_bytes = max_free_bytes

    def _release(self, ref) -> None:
        _, buf = self._live.pop(id(ref))
        free = self._free
        free.append(buf)
        self._free_bytes += len(buf)
        while self._free_bytes > self.max_free_bytes:
            self._free_bytes -= len(free.pop(0))  # the least recently freed

    def array(self, count: int, dtype) -> np.ndarray:
        """An uninitialised 1-d array of ``count`` items over a pooled buffer."""
        nbytes = count * (_ITEMSIZE.get(dtype) or np.dtype(dtype).itemsize)
        free = self._free
        if free and nbytes <= len(free[-1]) <= 4 * nbytes + 65536:  # the most recently freed: in cache
            buf = free.pop()
            self._free_bytes -= len(buf)
            if len(buf) < nbytes:  # another thread's release came between the check and the pop
                buf = self._take(nbytes)
        else:
            buf = self._take(nbytes)
        out = np.frombuffer(buf, dtype, count)
        ref = weakref.ref(out.base, self._release)  # the export every view of ``out`` keeps alive
        self._live[id(ref)] = (ref, buf)
        return out

    def _take(self, nbytes: int) -> bytearray:
        free = self._free
        for i in range(len(free) - 2, -1, -1):
            if nbytes <= len(free[i]) <= 4 * nbytes + self.GRAIN:
                buf = free.pop(i)
                self._free_bytes -= len(buf)
                if len(buf) >= nbytes:  # (a release from another thread may have shifted the list)
                    return buf
                break
        grains = (nbytes - 1) // self.GRAIN + 1
        k = (grains - 1).bit_length()  # 2**k >= grains: sizes in half-octave classes
        return bytearray(self.GRAIN * (3 << (k - 2) if k >= 2 and 3 << (k - 2) >= grains else 1 << k))

    def clear(self) -> None:
        """Drop the free buffers (arrays still in use keep theirs; they come back when released)."""
        self._free.clear()
        self._free_bytes = 0


# one per process: decoded arrays come from it unless ``pool=None`` is passed
# (``DEFAULT_POOL.max_free_bytes = 0`` keeps nothing back: plain allocations, as before)
DEFAULT_POOL = BufferPool()


def converted(pcm: np.ndarray, dtype: str, pool: BufferPool | None) -> np.ndarray:
    """16-bit samples as ``dtype`` in memory of their own (a buffer of ``pool``, or a plain allocation)."""
    if dtype == "float32":
        if pool is None:
            out = pcm.astype(np.float32)
        else:
            out = pool.array(len(pcm), np.float32)
            np.copyto(out, pcm)  # two SIMD passes beat one mixed-type multiply
        out *= INT16_SCALE  # a power of two: the same values as dividing in float64
    elif dtype == "int16":
        if pool is None:
            out = pcm.copy()  # own the memory, so the member's buffer can go
        else:
            out = pool.array(len(pcm), np.int16)
            out[:] = pcm
    else:
        out = pcm.astype(np.float64)
        out *= 1 / 32768
    return out


class DecodedAudio:
    """An audio member decoded as it was read (``iter_samples``' own): its samples, rate and size in bytes.

    It stands in for the member's bytes between the member and decode stages; ``len`` is the member's
    size, so the grouping stage's byte limit counts it as it counts bytes.
    """

    __slots__ = ("samples", "sample_rate", "nbytes")

    def __init__(self, samples: np.ndarray, sample_rate: int, nbytes: int):
        self.samples, self.sample_rate, self.nbytes = samples, sample_rate, nbytes

    def __len__(self) -> int:
        return self.nbytes


LITTLE_ENDIAN = sys.byteorder == "little"  # a WAV's samples are little-endian: written as they are into int16
