"""Batches out of DataLoader workers through reused shared memory, without a file descriptor per batch.

A tensor that leaves a torch DataLoader worker is moved to a fresh shared-memory segment, and its
file descriptor crosses to the trainer through a new socket connection (multiprocessing's
``resource_sharer``: connect, authenticate, ``sendmsg``) for every tensor of every batch; the
worker then writes into fresh, zero-filled pages and the trainer maps them again, page by page.
Measured on a 2-core machine, that cost about twice what reading and decoding the batch did.

Here each worker keeps a few segments (``memfd``) and builds a batch's tensors as views of one of
them. Its descriptor crosses once, with the first batch that uses it; later batches in that
segment cross as a few numbers (segment, generation, offset, shape, dtype), and the trainer's
tensors are views of its own long-lived mapping of the segment: no new pages on either side.

A segment is reused only once the trainer is done with it: its first byte is a busy flag that the
worker sets when it fills the segment and the trainer clears when the last tensor (or view, or
numpy array) made from that batch is gone (a weak reference on the mapping's export, as in
:class:`shardkit.training.reader.BufferPool`). A trainer that holds batches makes the worker use another
segment, and when all are busy the batch takes torch's ordinary path: nothing is ever
overwritten while in use. Linux only (``os.memfd_create``); elsewhere every batch takes
torch's path.
"""

from __future__ import annotations

import mmap
import os
import weakref

import numpy as np

from shardkit.io.files import pid_alive

HEADER = 64  # the busy flag, padded to a cache line
ALIGN = 64
MIN_SEGMENT = 1 << 20


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _segment_size(nbytes: int) -> int:
    """Half-octave size classes of at least 1 MiB, so batches of similar size reuse one segment."""
    units = -(-max(nbytes, 1) // MIN_SEGMENT)
    k = (units - 1).bit_length()
    return MIN_SEGMENT * (3 << (k - 2) if k >= 2 and 3 << (k - 2) >= units else 1 << k)


class _Segment:
    __slots__ = ("serial", "fd", "mm", "size", "generation", "fd_sent", "view")

    def __init__(self, serial: int, size: int):
        self.serial, self.size = serial, size
        self.fd = os.memfd_create(f"shardkit-batch-{serial}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, HEADER + size)
        self.mm = mmap.mmap(self.fd, HEADER + size)
        self.view = np.frombuffer(self.mm, np.uint8)
        self.generation = 0
        self.fd_sent = False

    @property
    def busy(self) -> bool:
        return self.view[0] != 0


class WorkerArena:
    """The segments of one worker process (made on first use, in the worker)."""

    def __init__(self, max_segments: int = 8, max_bytes: int = 512 << 20):
        self.nonce = os.urandom(8).hex()
        self.pid = os.getpid()
        self.segments: list[_Segment] = []
        self.made = 0
        self.max_segments, self.max_bytes = max_segments, max_bytes

    def take(self, nbytes: int) -> _Segment | None:
        """A free segment that fits ``nbytes`` (marked busy), a new one, or None when all are busy."""
        seg = next((s for s in self.segments if not s.busy and nbytes <= s.size <= 4 * nbytes + MIN_SEGMENT), None)
        if seg is None:
            seg = self._new_segment(nbytes)
            if seg is None:
                return None
        seg.generation += 1
        seg.view[0] = 1
        return seg

    def _new_segment(self, nbytes: int) -> _Segment | None:
        """A new segment for ``nbytes``, closing a free one of the wrong size when the arena is full; None
        when it is full of busy segments (or the kernel refuses the memory)."""
        size = _segment_size(nbytes)
        if len(self.segments) >= self.max_segments or sum(s.size for s in self.segments) + size > self.max_bytes:
            free = [s for s in self.segments if not s.busy]
            if not free:
                return None
            self.segments.remove(free[0])  # a free segment of the wrong size makes room
            _close(free[0])
        try:
            seg = _Segment(self.made, size)  # serials never repeat: the trainer keys its mappings by them
        except OSError:
            return None
        self.made += 1
        self.segments.append(seg)
        return seg


def _close(seg: _Segment) -> None:
    seg.view = None
    try:
        seg.mm.close()
    except BufferError:  # a view is still alive in this process; the mapping goes with it
        pass
    os.close(seg.fd)


_ARENA: WorkerArena | None = None


def _arena() -> WorkerArena | None:
    global _ARENA
    if not hasattr(os, "memfd_create"):
        return None
    if _ARENA is None or _ARENA.pid != os.getpid():
        _ARENA = WorkerArena()
    return _ARENA


def shared_tensors(specs: list[tuple[tuple[int, ...], str]]):
    """Uninitialised tensors ``[(shape, dtype), ...]`` for one batch in one reused segment, or None.

    Call inside a DataLoader worker; the tensors pickle (for the trip to the trainer) as
    references to the segment. None when no segment is free: the caller allocates as usual.
    """
    import torch

    arena = _arena()
    if arena is None:
        return None
    sizes = [int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in specs]
    seg = arena.take(sum(_aligned(n) for n in sizes))
    if seg is None:
        return None
    cls = _tensor_class()
    out, offset = [], HEADER
    for (shape, dtype), n in zip(specs, sizes):
        array = seg.view[offset:offset + n].view(dtype).reshape(shape)
        tensor = torch.from_numpy(array).as_subclass(cls)
        tensor._shardkit_ref = (arena, seg, seg.generation, offset, tuple(shape), dtype)
        out.append(tensor)
        offset += _aligned(n)
    return out


_SEGMENT_TENSOR = None


def _tensor_class():
    """``SegmentTensor``: a plain tensor (operations on it return plain tensors) that multiprocessing
    pickles as a reference to its segment while it still is the untouched view made for the batch."""
    global _SEGMENT_TENSOR
    if _SEGMENT_TENSOR is None:
        from multiprocessing.reduction import ForkingPickler

        import torch

        class SegmentTensor(torch.Tensor):
            __torch_function__ = torch._C._disabled_torch_function_impl

        ForkingPickler.register(SegmentTensor, _reduce)  # only multiprocessing's pickler: torch.save is unchanged
        _SEGMENT_TENSOR = SegmentTensor
    return _SEGMENT_TENSOR


def _reduce(tensor):
    from multiprocessing.reduction import DupFd

    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    arena, seg, generation, offset, shape, dtype = tensor._shardkit_ref
    plain = tensor.as_subclass(torch.Tensor)
    if (seg.view is None or seg.generation != generation or tuple(plain.shape) != shape
            or not plain.is_contiguous() or plain.data_ptr() != seg.view.ctypes.data + offset):
        return reduce_tensor(plain)  # no longer the batch's view (resized, reused): torch's own path
    fd = None
    if not seg.fd_sent:  # the descriptor crosses once per segment
        fd = DupFd(seg.fd)
        seg.fd_sent = True
    return _attach, ((arena.nonce, arena.pid, seg.serial), fd, HEADER + seg.size, generation, offset, shape, dtype)


# ---------------------------------------------------------------------------------------------
# The trainer's side


class _Mapping:
    __slots__ = ("mm", "pid", "generation", "base", "export", "__weakref__")

    def __init__(self, fd: int, size: int, pid: int):
        try:
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)  # the mapping keeps the memory
        self.pid = pid
        self.generation = -1
        self.base = lambda: None
        self.export = None

    def array_for(self, generation: int) -> np.ndarray:
        base = self.base() if self.generation == generation else None
        if base is None:
            base = np.frombuffer(self.mm, np.uint8)
            self.generation = generation
            self.base = weakref.ref(base)
            self.export = weakref.ref(base.base, self._released)  # every view of this batch keeps it alive
        return base

    def _released(self, ref) -> None:
        if ref is self.export:
            self.mm[0] = 0  # the worker may fill this segment again

    def idle(self) -> bool:
        return self.base() is None


_MAPPINGS: dict[tuple, _Mapping] = {}


def _attach(key, fd, size, generation, offset, shape, dtype):
    """Unpickling in the trainer: the tensor as a view of this process's mapping of the segment."""
    import torch

    from shardkit.errors import ShardkitError

    mapping = _MAPPINGS.get(key)
    if mapping is None:
        if fd is None:
            raise ShardkitError(f"a batch refers to shared-memory segment {key} that this process never received "
                                "(batches of a DataLoader worker must go to one process)")
        for old_key, old in list(_MAPPINGS.items()):  # segments of workers that have exited
            if old.idle() and not pid_alive(old.pid):
                del _MAPPINGS[old_key]
                old.mm.close()
        mapping = _MAPPINGS[key] = _Mapping(fd.detach(), size, key[1])
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    array = mapping.array_for(generation)[offset:offset + n].view(dtype).reshape(shape)
    return torch.from_numpy(array)
