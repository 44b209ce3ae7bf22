"""A stable argsort of non-negative integers: by LSD radix (numpy sorts 8- and 16-bit integers by radix), or
by one sort of (key, index) packed in 64 bits when they fit."""

from __future__ import annotations

import numpy as np


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of integers: for non-negative ones, a radix sort of their 16-bit
    digits, lowest first, each a stable numpy sort (radix for 8- and 16-bit types; the last digit in 8
    bits when it fits), or, when the keys less the smallest take two or more digits and fit above their
    index in 64 bits, one sort of those packed words: the same order, ties by index, several times faster
    than timsort on 10-100 k keys. Floats >= 0 (never -0.0) sort the same as their bits: pass
    ``values.view(np.uint64)``."""
    keys = np.asarray(keys)
    if not len(keys):
        return np.zeros(0, np.int64)
    if keys.dtype.kind == "i" and int(keys.min()) < 0:
        return np.argsort(keys, kind="stable")
    index_bits = max(1, (len(keys) - 1).bit_length())
    top, low = int(keys.max()), int(keys.min())
    if _digits(top - low) > 1 and (top - low).bit_length() + index_bits <= 64:
        return _packed_argsort(keys, low, index_bits)
    return _radix_argsort(*_from_smallest(keys, top, low))


def _radix_argsort(keys: np.ndarray, top: int) -> np.ndarray:
    """The stable order of keys up to ``top``: a stable numpy sort of each 16-bit digit, lowest first."""
    order = None
    shift = 0
    while True:
        left = top >> shift
        # cast, then gather: 1-2 bytes a key moved, not 8
        digit = ((keys >> shift) if shift else keys).astype(np.uint8 if left < (1 << 8) else np.uint16)
        step = np.argsort(digit if order is None else digit[order], kind="stable")
        order = step if order is None else order[step]
        shift += 16
        if left < (1 << 16):
            return order


def _packed_argsort(keys: np.ndarray, low: int, index_bits: int) -> np.ndarray:
    """The stable order of keys that take two or more 16-bit digits, when each key less the smallest fits above
    its index in 64 bits: one sort of those distinct words gives the order, ties by index, with no gathers
    (a dealing round's 36 k shard totals: ~3x less CPU than three radix passes)."""
    packed = keys.astype(np.uint64)
    packed -= np.uint64(low)
    packed <<= np.uint64(index_bits)
    packed |= np.arange(len(keys), dtype=np.uint64)
    packed.sort()  # the words are distinct, so any sort gives the one order
    packed &= np.uint64((1 << index_bits) - 1)
    return packed.view(np.int64)


def _from_smallest(keys: np.ndarray, top: int, low: int) -> tuple[np.ndarray, int]:
    """(keys, their largest): as given, or less their smallest (``low``; ``top`` the largest) when that takes
    fewer 16-bit digits (the same order, ties and all)."""
    if low > 0 and _digits(top - low) < _digits(top):
        return keys - keys.dtype.type(low), top - low
    return keys, top


def _digits(top: int) -> int:
    """16-bit digits of ``top`` (at least one): the radix passes a sort of keys up to ``top`` takes."""
    return max(1, -(-top.bit_length() // 16))
