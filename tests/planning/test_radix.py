"""planning.radix.stable_argsort on keys far from zero: sorted as their distance from the smallest (fewer
16-bit digits, so fewer passes), in the same order as numpy's stable argsort, ties by index."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.planning.radix import _digits, stable_argsort


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 3000), spread=st.sampled_from([0.0, 1e-9, 0.5, 30.0]),
       ties=st.booleans())
def test_late_dealing_rounds_shard_totals_sort_as_numpys_stable_argsort(seed, n, spread, ties):
    # balance's later rounds: every shard holds ~an hour, the totals a few seconds (or ulps) apart, many equal
    rng = np.random.default_rng(seed)
    totals = 3600.0 + rng.random(n) * spread
    if ties:
        totals = totals[rng.integers(0, max(1, n // 20), n)]
    assert stable_argsort(totals.view(np.uint64)).tolist() == np.argsort(totals, kind="stable").tolist()


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 3000), offset=st.sampled_from([1, 1 << 20, 1 << 40, 2**62]),
       width=st.sampled_from([1, 200, 1 << 16, 1 << 20]))
def test_integer_keys_above_an_offset_sort_as_numpys_stable_argsort(seed, n, offset, width):
    keys = (offset + np.random.default_rng(seed).integers(0, width, n)).astype(np.uint64)
    assert stable_argsort(keys).tolist() == np.argsort(keys, kind="stable").tolist()


def test_narrow_keys_far_from_zero_take_fewer_digits():
    totals = 3600.0 + np.arange(5) * 1e-3
    bits = totals.view(np.uint64)
    assert _digits(int(bits.max() - bits.min())) < _digits(int(bits.max())) == 4


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 3000), spare=st.sampled_from([-1, 0, 1]),
       ties=st.booleans())
def test_keys_at_the_edge_of_a_packed_word_sort_as_numpys_stable_argsort(seed, n, spare, ties):
    # the keys less the smallest take 64 - index bits + spare bits: one packed sort when they fit (spare <= 0),
    # radix passes when they do not; the same order either way
    rng = np.random.default_rng(seed)
    span_bits = 64 - (n - 1).bit_length() + spare
    keys = rng.integers(0, 2**64, n, dtype=np.uint64) >> np.uint64(64 - span_bits)
    keys[rng.integers(0, n)] = np.uint64((1 << span_bits) - 1)  # the span is exactly span_bits wide
    keys[rng.integers(0, n)] = 0
    if ties:
        keys = keys[rng.integers(0, max(1, n // 20), n)]
    keys += np.uint64(7 if span_bits < 64 else 0)
    assert stable_argsort(keys).tolist() == np.argsort(keys, kind="stable").tolist()
