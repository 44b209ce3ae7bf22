"""The trainer-batch simulation in blocks (wenet_conf.simulation) equals the one-shot simulation it replaced.

``simulate_epoch`` takes consumers in blocks, orders long consumers one at a time, walks dynamic
batches over a window per step, and ``feature_frames`` computes in chunks: every one of these must
give the same batches, the same counts and the same float seconds, bit for bit, as the one-shot code
(kept here as the reference: every planned utterance at once, the sort of a combined key, the
binary lifting over a table of range maxima).
"""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_wenet_conf import wenet_dynamic_batches

from shardkit.planning.partition import shuffled_order
from shardkit.planning.radix import stable_argsort
from shardkit.wenet_conf import order as worker_order
from shardkit.wenet_conf import simulation
from shardkit.wenet_conf.batches import batch_ids, dynamic_batch_starts
from shardkit.wenet_conf.conf import BatchConf, TrainerConf
from shardkit.wenet_conf.frames import feature_frames
from shardkit.wenet_conf.order import consumer_utterances
from shardkit.wenet_conf.simulation import EpochBatches, Loader, simulate_epoch


def one_shot_epoch(shard_offsets, frames, seconds, *, world_size, num_workers, conf, seed, epoch) -> EpochBatches:
    """``simulate_epoch`` before blocks: every planned utterance of the epoch at once."""
    shard_offsets = np.asarray(shard_offsets, np.int64)
    frames = np.asarray(frames, np.int64)
    seconds = np.asarray(seconds, np.float64)
    consumers = world_size * num_workers
    n_shards = len(shard_offsets) - 1
    order = shuffled_order(n_shards, seed, epoch) if conf.list_shuffle else np.arange(n_shards)
    order = np.tile(order, conf.cycle)
    utts, bounds = consumer_utterances(shard_offsets, order, consumers)
    rng = np.random.default_rng([seed, epoch, 1])
    f = frames[utts]
    with mock.patch.object(worker_order, "_CONSUMER_AT_A_TIME", 1 << 62):  # the combined-key sorts
        perm = worker_order.buffered_order(f, bounds, conf, rng)
    fp = f[perm]
    if conf.batch.batch_type == "dynamic":
        ids = np.cumsum(dynamic_batch_starts(fp, bounds, conf.batch.max_frames_in_batch, precompute=True)) - 1
    else:
        ids = batch_ids(fp, bounds, conf.batch)
    secs = seconds[utts][perm]
    n_batches = int(ids.max()) + 1 if len(ids) else 0
    batch_seconds = np.bincount(ids, weights=secs, minlength=n_batches)
    consumer = np.repeat(np.arange(consumers), np.diff(bounds))
    batch_consumer = np.zeros(n_batches, np.int64)
    batch_consumer[ids] = consumer
    per_consumer = np.bincount(batch_consumer, minlength=consumers) if n_batches else np.zeros(consumers, np.int64)
    first = np.concatenate([[0], np.cumsum(per_consumer)])[:-1]
    nth = np.arange(n_batches) - first[batch_consumer]
    worker_batches = per_consumer.reshape(num_workers, world_size).T
    rank_steps = worker_batches.sum(axis=1)
    rank_seconds = np.bincount(consumer % world_size, weights=secs, minlength=world_size)
    left_b, left_s = simulation._left_out(batch_consumer, nth, batch_seconds, rank_steps, world_size)
    return EpochBatches(epoch, worker_batches, rank_steps, left_b, left_s, rank_seconds)


def in_blocks(shard_offsets, frames, seconds, *, world_size, num_workers, conf, seed, epoch, block_utterances):
    """``simulate_epoch`` called with the one-shot reference's arguments."""
    return simulate_epoch(shard_offsets, frames, seconds, Loader(world_size, num_workers, seed), conf, epoch=epoch,
                          block_utterances=block_utterances)


def assert_same(got: EpochBatches, expected: EpochBatches) -> None:
    assert got.worker_batches.tolist() == expected.worker_batches.tolist()
    assert got.rank_steps.tolist() == expected.rank_steps.tolist()
    assert got.left_out_batches.tolist() == expected.left_out_batches.tolist()
    # the float sums, to the last bit
    assert got.left_out_seconds.tobytes() == expected.left_out_seconds.tobytes()
    assert got.rank_seconds.tobytes() == expected.rank_seconds.tobytes()
    assert got.summary() == expected.summary()


def _batch(rng: np.random.Generator) -> BatchConf:
    kind = int(rng.integers(0, 3))
    if kind == 0:
        return BatchConf("dynamic", max_frames_in_batch=int(rng.integers(1, 6000)))
    if kind == 1:
        return BatchConf("static", batch_size=int(rng.integers(1, 12)))
    return BatchConf("bucket", bucket_boundaries=(300, 900), bucket_batch_sizes=(7, 4, 2))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), block=st.integers(1, 400), one_at_a_time=st.booleans())
def test_block_simulation_equals_the_one_shot_simulation(seed, block, one_at_a_time):
    rng = np.random.default_rng(seed)
    n_shards = int(rng.integers(1, 25))
    sizes = rng.integers(0, 60, n_shards)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    n = int(offsets[-1])
    top = [60, 2500, 80000][int(rng.integers(0, 3))]  # 80000: frames past 16 bits (no radix sort)
    frames = rng.integers(0, top, n)
    if rng.random() < 0.3:  # runs of empty samples: dynamic batches longer than the first window
        for start in rng.integers(0, n + 1, 3):
            frames[start:start + int(rng.integers(5, 80))] = 0
    seconds = rng.random(n) * 20
    conf = TrainerConf(batch=_batch(rng), shuffle=bool(rng.integers(0, 2)),
                       shuffle_size=int(rng.integers(1, 50)), sort=bool(rng.integers(0, 2)),
                       sort_size=int(rng.integers(1, 20)), list_shuffle=bool(rng.integers(0, 2)),
                       cycle=int(rng.integers(1, 3)))
    kw = {"world_size": int(rng.integers(1, 4)), "num_workers": int(rng.integers(1, 4)), "conf": conf,
          "seed": int(rng.integers(0, 100)), "epoch": int(rng.integers(0, 3))}
    expected = one_shot_epoch(offsets, frames, seconds, **kw)
    at_a_time = 1 if one_at_a_time else worker_order._CONSUMER_AT_A_TIME
    with mock.patch.object(worker_order, "_CONSUMER_AT_A_TIME", at_a_time):
        got = in_blocks(offsets, frames.astype(np.int32), seconds, block_utterances=block, **kw)
    assert_same(got, expected)


def test_long_consumers_in_blocks_equal_the_one_shot_simulation():
    # consumers long enough to be ordered one at a time with the default threshold, several per block
    rng = np.random.default_rng(3)
    sizes = rng.integers(200, 1200, 60)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    frames = rng.integers(40, 1700, int(offsets[-1]))
    seconds = frames / 100.0 + rng.random(len(frames))
    for batch, shuffle_size in ((BatchConf("dynamic", max_frames_in_batch=12000), 1500),
                                (BatchConf("static", batch_size=16), 1500),
                                (BatchConf("dynamic", max_frames_in_batch=12000), 60000)):  # leaving times > 2**16
        conf = TrainerConf(batch=batch, shuffle_size=shuffle_size, sort_size=500)
        kw = {"world_size": 2, "num_workers": 2, "conf": conf, "seed": 7, "epoch": 1}
        expected = one_shot_epoch(offsets, frames, seconds, **kw)
        for block in (1, 5000, 20000, 1 << 30):
            assert_same(in_blocks(offsets, frames, seconds, block_utterances=block, **kw), expected)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_window_walk_equals_the_table_walks_and_wenets_window(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    frames = rng.integers(0, [5, 60, 2500][int(rng.integers(0, 3))], n)
    if rng.random() < 0.5:  # long samples with runs of short ones: batches past the first window's width
        frames = rng.integers(500, 2500, n)
        for start in rng.integers(0, n + 1, 4):
            frames[start:start + int(rng.integers(10, 200))] = rng.integers(0, 4)
    cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 6))))
    bounds = np.concatenate([[0], cuts, [n]])
    limit = int(rng.integers(1, 20000))
    window = dynamic_batch_starts(frames.astype(np.uint16), bounds, limit)
    for precompute in (True, False):
        assert window.tolist() == dynamic_batch_starts(frames, bounds, limit, precompute=precompute).tolist()
    for c in range(len(bounds) - 1):
        seg = window[bounds[c]:bounds[c + 1]]
        got = np.diff(np.append(np.flatnonzero(seg), len(seg))).tolist()
        assert got == wenet_dynamic_batches(frames[bounds[c]:bounds[c + 1]].tolist(), limit)


def test_feature_frames_in_chunks_equal_one_pass():
    rng = np.random.default_rng(11)
    samples = rng.integers(0, 600_000, 5000)
    rates = rng.choice([8000, 16000, 22050, 44100], 5000)
    for conf in (TrainerConf(), TrainerConf(speed_perturb=True), TrainerConf(speed_perturb=True, spec_trim=True),
                 TrainerConf(speed_perturb=True, speeds=(0.8, 0.9, 1.0, 1.1, 1.2), spec_trim=True,
                             spec_trim_max_t=300)):
        whole = feature_frames(samples, rates, conf, seed_seq=(3, 1, 2), chunk=1 << 30)
        for chunk in (1, 7, 1000):
            part = feature_frames(samples.astype(np.int32), rates.astype(np.uint16), conf, seed_seq=(3, 1, 2),
                                  chunk=chunk, dtype=np.int32)
            assert part.dtype == np.int32
            assert part.tolist() == whole.tolist()


def test_feature_frames_widen_a_compact_dtype_that_is_too_small():
    samples = np.array([16000, 2**40, 32000], np.int64)  # 2**40 samples: more frames than int32 holds
    frames = feature_frames(samples, np.full(3, 16000), TrainerConf(), dtype=np.int32, chunk=1)
    assert frames.dtype == np.int64
    assert frames.tolist() == feature_frames(samples, np.full(3, 16000), TrainerConf()).tolist()


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), top=st.sampled_from([1, 300, 1 << 16, 1 << 17, 1 << 24, 1 << 25, 1 << 33]),
       n=st.integers(0, 3000), negative=st.booleans())
def test_radix_argsort_equals_numpys_stable_argsort(seed, top, n, negative):
    keys = np.random.default_rng(seed).integers(-5 if negative else 0, top, n)
    for dtype in (np.int64, np.int32):
        if top < (1 << 31):
            assert stable_argsort(keys.astype(dtype)).tolist() == np.argsort(keys, kind="stable").tolist()


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 3000), ties=st.booleans())
def test_radix_argsort_of_float_bits_equals_numpys_stable_argsort_of_the_floats(seed, n, ties):
    """balance's dealing rounds sort shard totals (floats >= 0) by their bits: 64-bit keys, four digits."""
    rng = np.random.default_rng(seed)
    totals = rng.gamma(8, 450, n)
    if ties:
        totals = np.round(totals, 0)
    totals[: n // 10] = 0.0
    assert stable_argsort(totals.view(np.uint64)).tolist() == np.argsort(totals, kind="stable").tolist()
