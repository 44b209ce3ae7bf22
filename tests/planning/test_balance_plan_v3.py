"""Plan version 3 (issue 39, the default): copies described rather than listed, dealt straight to their places,
swaps on the output, each shard shuffled. The same promises as versions 1 and 2 (which stay, byte for byte:
their digests are pinned in tests/commands/balance/test_plan_versions.py and tests/io/test_index_files.py)."""

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.planning.balance import PLAN_VERSION, PlanSettings, direct, plan_balance, plan_digest
from shardkit.planning.balance.deal import TIE_BITS, TieOrder
from shardkit.planning.balance.direct import Copies, SwappedRows, median_seconds, tolerance_seconds
from shardkit.planning.balance.swaps import refine

# the mixes of test_plan_versions.CASES (shaped like the issue's: 3.6 s, 12.3 s, 5 s), plus fractional and
# whole weights with both remainders, and a corpus dropped below its whole copies
CASES = [
    dict(sizes=(3000, 2000, 1000), weights=(1, 1, 1), ws=4, nw=2, dur=600, rem="pad", seed=0),
    dict(sizes=(5000, 700), weights=(0.5, 2.0), ws=2, nw=4, dur=300, rem="pad", seed=3),
    dict(sizes=(2500, 2500, 900), weights=(1.5, 1, 1), ws=8, nw=1, dur=900, rem="drop", seed=7),
    dict(sizes=(20000, 15000, 8000), weights=(1, 1, 1), ws=16, nw=4, dur=3600, rem="pad", seed=1),
    dict(sizes=(700, 50), weights=(0.3, 2.6), ws=2, nw=2, dur=100, rem="drop", seed=2),
    dict(sizes=(1001,), weights=(2.0,), ws=2, nw=2, num_shards=4, rem="drop", seed=4),
]
# what version 3 plans for them (digest of corpus/utt/copy, and of the seconds): a change of these is a
# change of every plan balance makes, which needs a new version, not an edit here
V3_DIGESTS = [
    ("8781148a3ba339d4a875b78057177e56e2f7711854c5ed93f671d83a373bd9a7", "c3db539148c7c96c"),
    ("16011aba0b16c7e5164a8891244efc623a93f2d025a63e168e44ba42697fe89d", "20f385226aa69ecd"),
    ("6633331ca42378a215a9c13c61d1431653745dac16172d6347f08d6350c39c33", "1c8b5f511c693bdd"),
    ("61b5a294ee009efdf88071ebc69ba6bf608f17f9e5002d2cfb4ac594466b87aa", "602fbddca1d11d80"),
    ("dbf66a6d3721d782b7ef52554a1fa57dac2846b3f6c50e131b8e5025056badae", "b193707f5ac68b63"),
    ("96e5603bdd869ab16dd9dc220d51b0d1856ccca621ee2278d775cf15565a059c", "d30e69513aaa73af"),
]


def _durations(case):
    rng = np.random.default_rng(case["seed"])
    return [np.round(rng.gamma(8, m / 8, n), 3) for n, m in zip(case["sizes"], (3.6, 12.3, 5.0))]


def _plan(case, threads=2, version=3):
    return plan_balance(_durations(case), case["weights"], PlanSettings(
        world_size=case["ws"], num_workers=case["nw"], shard_duration=case.get("dur"),
        num_shards=case.get("num_shards"), remainder=case["rem"], seed=case["seed"], version=version),
        threads=threads)


def _seconds_digest(plan):
    return hashlib.sha256(np.ascontiguousarray(plan.seconds).tobytes()).hexdigest()[:16]


def test_version_3_is_the_default():
    assert PLAN_VERSION == 3 and PlanSettings(world_size=1, num_workers=1).version == 3


@pytest.mark.parametrize("case,digests", list(zip(CASES, V3_DIGESTS)))
def test_version_3_plans_are_balanced_deterministic_and_pinned(case, digests):
    plans = [_plan(case, threads=t) for t in (1, 3)]
    assert plan_digest(plans[0]) == plan_digest(plans[1])
    assert np.array_equal(plans[0].seconds, plans[1].seconds)
    plan = plans[0]
    assert plan.version == 3 and plan.summary()["plan_version"] == 3
    assert plan.balanced and plan.max_deviation <= plan.tolerance / 2 + 1e-9
    assert (plan_digest(plan), _seconds_digest(plan)) == digests


@pytest.mark.parametrize("case,digests", list(zip(CASES, V3_DIGESTS)))
@pytest.mark.parametrize("chunk", [1, 64, 1000])
def test_the_deal_in_batches_gives_the_same_plan(monkeypatch, case, digests, chunk):
    # the deal works out a batch of rounds ahead and writes the last one in the pool while dealing the next:
    # with batches of one round (or a few) instead of ~1 M copies, each corpus is dealt in many batches
    # (the last round of a corpus apart), and the plan must be the pinned one, byte for byte
    monkeypatch.setattr(direct, "_DEAL_BATCH", chunk)
    for threads in (1, 2):
        plan = _plan(case, threads=threads)
        assert (plan_digest(plan), _seconds_digest(plan)) == digests


def _deal_order_whole(d, copies, seed, c):
    """Version 3's deal order as one pass over the corpus' copies would build it (the order the blocks must give)."""
    ties = TieOrder(seed, c)
    bits = np.invert((d.astype(np.float32) + np.float32(0.0)).view(np.uint32))
    key = np.concatenate([np.tile(bits, copies.whole), bits[copies.tail_utt]]).astype(np.uint64)
    key = (key << np.uint64(TIE_BITS)) | ties.forward(np.arange(len(key), dtype=np.uint32))
    return ties.inverse(np.sort(key).astype(np.uint32)).view(np.int32)


@pytest.mark.parametrize("chunk", [7, 1000, 1 << 20])
@pytest.mark.parametrize("n,whole,tail", [(5000, 1, 300), (3000, 3, 1000), (2000, 0, 1500), (1, 2, 0), (9000, 2, 0)])
def test_the_deal_order_built_in_blocks_is_the_whole_corpus_order(monkeypatch, chunk, n, whole, tail):
    monkeypatch.setattr(direct, "_CHUNK", chunk)
    rng = np.random.default_rng(n + whole)
    d = np.round(rng.gamma(8, 0.5, n), 2)  # ties of equal seconds, ordered by the seeded bijection
    d[: min(n, 2)] = [-0.0, 0.0][: min(n, 2)]  # -0.0 sorts as 0.0
    tail_utt = np.sort(rng.choice(n, min(tail, n), replace=False)).astype(np.int32)
    copies = Copies(n, whole, tail_utt, np.full(len(tail_utt), whole, np.int32))
    assert direct.deal_order(d, copies, 5, 1).tolist() == _deal_order_whole(d, copies, 5, 1).tolist()


@pytest.mark.parametrize("case", CASES)
def test_version_3_keeps_what_versions_1_and_2_promise(case):
    """The same shard count, counts per corpus and per shard, tolerance rule; every (utterance, copy) once,
    copies numbered 0, 1, ... without a gap, each copy's seconds its utterance's; only which copy goes where
    (and in which order within a shard) differs."""
    two, three = _plan(case, version=2), _plan(case)
    assert plan_digest(two) != plan_digest(three)
    s2, s3 = two.summary(), three.summary()
    for key in ("num_shards", "utterances_per_shard", "utterances", "balanced"):
        assert s2[key] == s3[key], key
    mean_shard = three.seconds.sum() / three.num_shards
    assert three.tolerance == pytest.approx(max(0.005 * mean_shard, np.median(three.seconds)), rel=1e-12)
    assert s2["corpora"] == s3["corpora"]
    assert np.array_equal(two.shard_corpus_counts, three.shard_corpus_counts)
    durations = _durations(case)
    for c in range(len(three.names)):
        mine = three.corpus == c
        utt, copy = three.utt[mine].astype(np.int64), three.copy[mine].astype(np.int64)
        assert len(np.unique(utt * 2**20 + copy)) == len(utt)  # (utterance, copy) once each
        held = np.bincount(utt)
        most = np.zeros(len(held), np.int64)
        np.maximum.at(most, utt, copy)
        assert np.array_equal(held[held > 0], most[held > 0] + 1)  # copies 0..k-1 of an utterance held k times
        assert np.array_equal(three.seconds[mine], durations[c][utt])


def test_drop_below_the_whole_copies_drops_repeats_first():
    plan = _plan(CASES[-1])
    assert plan.num_shards == 4 and plan.utts_per_shard == 500 and plan.corpora[0]["remainder_dropped"] == 2
    assert (np.bincount(plan.utt, minlength=1001) >= 1).all()  # every utterance's copy 0 stays
    assert np.count_nonzero(plan.copy == 1) == 1001 - 2
    assert plan.copy.dtype == np.int8  # the narrowest type that holds the copy numbers


def test_copy_numbers_past_int8_widen_the_column():
    plan = plan_balance([np.full(3, 2.0)], [200.0], PlanSettings(world_size=1, num_workers=1, num_shards=6))
    assert plan.copy.dtype == np.int16 and int(plan.copy.max()) == 199
    assert sorted(zip(plan.utt.tolist(), plan.copy.tolist())) == [(u, k) for u in range(3) for k in range(200)]


def test_each_shard_is_shuffled_by_the_seed_not_left_in_deal_order():
    case = CASES[3]
    plan = _plan(case)
    rows = plan.seconds.reshape(plan.num_shards, plan.utts_per_shard)
    corpus = plan.corpus.reshape(rows.shape)
    # dealt longest first, a shard's copies of one corpus would be in falling order; shuffled, about half fall
    falls = [np.mean(np.diff(row[kind == 0]) < 0) for row, kind in zip(rows, corpus)]
    assert 0.35 < np.mean(falls) < 0.65
    other = _plan(dict(case, seed=case["seed"] + 1))
    assert plan_digest(other) != plan_digest(plan)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0, 60, allow_nan=False, width=64), min_size=1, max_size=300), st.integers(0, 3))
def test_the_median_is_numpys_exactly(values, copies):
    seconds = np.array(values * (copies + 1))  # repeated values: ties across the middle
    assert median_seconds(seconds) == np.median(seconds)


def test_the_median_is_exact_where_float32_cannot_tell_values_apart():
    seconds = np.array([1.0, 1.0 + 1e-12, 1.0 + 2e-12, 1.0 + 3e-12, 5.0, 0.5])
    assert median_seconds(seconds) == np.median(seconds)
    assert median_seconds(seconds[:5]) == np.median(seconds[:5])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0, 60, allow_nan=False, width=64), min_size=1, max_size=300), st.integers(0, 3),
       st.integers(0, 310))
def test_the_tolerance_is_the_floor_or_the_median_whichever_is_larger(values, copies, rank):
    # the floor at (or next to) a value of the copies themselves: the median equal to it, or a value off it
    seconds = np.array(values * (copies + 1))
    ordered = np.sort(seconds)
    for floor in {float(ordered[min(rank, len(ordered) - 1)]), float(np.median(seconds)), 0.0, 61.0}:
        expected = max(floor, float(np.median(seconds)))
        assert tolerance_seconds(seconds, floor) == expected


def test_copies_are_read_as_a_listed_plan_would_list_them():
    copies = Copies(n=5, whole=2, tail_utt=np.array([1, 3, 1], np.int32), tail_copy=np.array([2, 2, 3], np.int32))
    assert len(copies) == 13
    utt, copy = copies.utt_copy(np.arange(13, dtype=np.int64))
    assert utt.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 1, 3, 1]
    assert copy.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 3]
    assert copies.repeated().tolist() == [0, 1, 2, 3, 4, 1, 3, 1]


@pytest.mark.parametrize("seed", range(4))
def test_swaps_on_the_output_equal_swaps_on_listed_rows(seed):
    """refine over SwappedRows (rows held only where a swap changed them) makes the swaps refine makes over the
    rows as an array of places; apply() then moves every column's copies as the rows say."""
    rng = np.random.default_rng(seed)
    shards, per = 40, 25
    seconds = np.round(rng.gamma(4, 1.0, shards * per), 2)
    corpus = rng.integers(0, 3, shards * per).astype(np.int8)
    listed = np.arange(shards * per).reshape(shards, per)
    totals = seconds.reshape(shards, per).sum(axis=1)
    refine(listed, seconds, corpus, goal=0.05, totals=totals.copy())
    swapped = SwappedRows(shards, per)
    refine(swapped, seconds, corpus, goal=0.05, totals=totals.copy())
    assert swapped.changed
    assert all(np.array_equal(swapped[a], listed[a]) for a in range(shards))
    columns = {"seconds": seconds.copy(), "corpus": corpus.copy()}
    swapped.apply(columns)
    assert np.array_equal(columns["seconds"], seconds[listed.reshape(-1)])
    assert np.array_equal(columns["corpus"], corpus[listed.reshape(-1)])


def test_a_seed_changes_the_weights_subset():
    case = CASES[1]
    plan = _plan(case)
    again = _plan(dict(case, seed=9))
    kept = [np.unique(p.utt[(p.corpus == 0) & (p.copy == 0)]) for p in (plan, again)]
    assert len(kept[0]) == len(kept[1]) == 2500 and not np.array_equal(*kept)
