"""shardkit.training.reader.BufferPool: decoded arrays reuse memory only once nothing uses it any more."""

import gc

import numpy as np
import pytest

from shardkit.io.synth import encode, speech_like
from shardkit.training.reader import BufferPool, decode_fast, iter_samples


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_buffer_comes_back_only_when_the_array_and_its_views_are_gone():
    pool = BufferPool()
    a = pool.array(50_000, np.float32)
    a[:] = 1.0
    first = _address(a)
    view = a[10:].reshape(-1, 2)
    del a
    gc.collect()
    b = pool.array(50_000, np.float32)  # the view still holds the first buffer
    assert _address(b) != first
    b[:] = 2.0
    assert np.all(view == 1.0)
    del view
    gc.collect()
    c = pool.array(40_000, np.float32)
    assert _address(c) == first  # now it is reused
    assert len(pool._live) == 2


def test_torch_tensors_keep_their_buffer():
    torch = pytest.importorskip("torch")
    pool = BufferPool()
    a = pool.array(30_000, np.int16)
    a[:] = 7
    t = torch.from_numpy(a.reshape(-1, 1))
    first = _address(a)
    del a
    gc.collect()
    b = pool.array(30_000, np.int16)
    b[:] = -1
    assert _address(b) != first and bool((t == 7).all())


def test_sizes_fit_and_unused_buffers_are_bounded():
    pool = BufferPool(max_free_bytes=3 << 20)
    arrays = [pool.array(n, np.float32) for n in (1, 16_384, 16_385, 100_000, 300_000)]
    for a, n in zip(arrays, (1, 16_384, 16_385, 100_000, 300_000)):
        assert a.shape == (n,) and a.dtype == np.float32 and a.flags.writeable
    del arrays, a
    gc.collect()
    assert sum(map(len, pool._free)) <= 3 << 20 and pool._free and not pool._live
    big = pool.array(2_000_000, np.float32)  # nothing free is big enough: a new buffer
    assert big.nbytes == 8_000_000


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_pooled_decode_equals_plain_decode(dtype):
    pool = BufferPool()
    kept = []
    for i in range(20):
        wav = encode(speech_like(1 + i % 5, 16000, seed=i), 16000, "wav")
        ref, rate = decode_fast(wav, dtype, pool=None)
        out, rate2 = decode_fast(wav, dtype, pool=pool)
        assert rate == rate2 == 16000 and out.dtype == ref.dtype and np.array_equal(out, ref)
        if i % 3 == 0:
            kept.append((out, ref))  # held arrays must never be overwritten by later decodes
    assert all(np.array_equal(a, b) for a, b in kept)


def test_samples_held_by_the_caller_stay_intact(make_shards):
    paths = make_shards("none", utts_per_shard=7)
    held = list(iter_samples(paths))
    again = list(iter_samples(paths, decoder="soundfile"))
    assert len(held) == 14 and all(np.array_equal(a["audio"], b["audio"]) for a, b in zip(held, again))
