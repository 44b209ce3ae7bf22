"""A stable argsort of non-negative integers by LSD radix (numpy sorts 8- and 16-bit integers by radix)."""

from __future__ import annotations

import numpy as np


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of integers: for non-negative ones, a radix sort of their 16-bit
    digits, lowest first, each a stable numpy sort (radix for 8- and 16-bit types; the last digit in 8
    bits when it fits): the same order, ties by index, several times faster than timsort on 10-100 k
    keys. Floats >= 0 (never -0.0) sort the same as their bits: pass ``values.view(np.uint64)``."""
    keys = np.asarray(keys)
    if not len(keys):
        return np.zeros(0, np.int64)
    if keys.dtype.kind == "i" and int(keys.min()) < 0:
        return np.argsort(keys, kind="stable")
    keys, top = _from_smallest(keys)
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


def _from_smallest(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """(keys, their largest): as given, or less their smallest when that takes fewer 16-bit digits (the same
    order, ties and all; a dealing round's shard totals, all about an hour, sort in 3 passes instead of 4)."""
    top, low = int(keys.max()), int(keys.min())
    if low > 0 and _digits(top - low) < _digits(top):
        return keys - keys.dtype.type(low), top - low
    return keys, top


def _digits(top: int) -> int:
    """16-bit digits of ``top`` (at least one): the radix passes a sort of keys up to ``top`` takes."""
    return max(1, -(-top.bit_length() // 16))
