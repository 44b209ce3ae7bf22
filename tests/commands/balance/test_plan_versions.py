"""Plan version 2 (issue 25): the same dealing and tolerance as version 1, with seeded choices drawn without
full permutations and the deal order from one sort of packed keys; version 1 stays reachable, byte for byte.
Version 3 (issue 39, the default; its planner in tests/planning/test_balance_plan_v3.py) on the command line."""

import dataclasses
import hashlib
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from support import SMALL_CORPORA
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.cli import main
from shardkit.planning.balance import PlanSettings, plan_balance, plan_digest
from shardkit.planning.balance import deal as planner
from shardkit.planning.balance.deal import TieOrder
from shardkit.errors import UsageError
from shardkit.io.synth import corpus_utterances, write_shards

# mixes shaped like the (3.6 s Mandarin, 12.3 s English, 5 s accented); the cases of
# test_indexfile.GOLDEN, whose version-1 digests pin the planner before issue 25
CASES = [
    dict(sizes=(3000, 2000, 1000), weights=(1, 1, 1), ws=4, nw=2, dur=600, rem="pad", seed=0),
    dict(sizes=(5000, 700), weights=(0.5, 2.0), ws=2, nw=4, dur=300, rem="pad", seed=3),
    dict(sizes=(2500, 2500, 900), weights=(1.5, 1, 1), ws=8, nw=1, dur=900, rem="drop", seed=7),
    dict(sizes=(20000, 15000, 8000), weights=(1, 1, 1), ws=16, nw=4, dur=3600, rem="pad", seed=1),
]
# what version 2 plans for them (digest of corpus/utt/copy, and of the seconds): a change of these is a
# change of every plan balance makes, which needs a new version, not an edit here
V2_DIGESTS = [
    ("a5c0428f86867a1f6b0ef5910c25088258dacc73f1ca2b57d795c8b56bf20370",
     "fff66883d52bee39"),
    ("aecb9ed159c6e109fff6b85ac25b213a6a9325fb6d782ec228b532987a5159fa",
     "560b7d2b2996ee96"),
    ("78c848734e40c7da5ecb015c1500126a777ee9739d97c18fc00cb8226b04a7fb",
     "fc3c506ae244c5a9"),
    ("4df2ec4ce3193ed72c9d41ae20014905dcfe7fd2c69d45522e22d97b2083d92f",
     "00e6307f919851ec"),
]


def _durations(case):
    rng = np.random.default_rng(case["seed"])
    return [np.round(rng.gamma(8, m / 8, n), 3) for n, m in zip(case["sizes"], (3.6, 12.3, 5.0))]


def _plan(case, threads=2, version=2):
    return plan_balance(_durations(case), case["weights"], PlanSettings(
        world_size=case["ws"], num_workers=case["nw"], shard_duration=case["dur"], remainder=case["rem"],
        seed=case["seed"], version=version), threads=threads)


def _seconds_digest(plan):
    return hashlib.sha256(np.ascontiguousarray(plan.seconds).tobytes()).hexdigest()[:16]


# --- the tie order --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), corpus=st.integers(0, 200),
       values=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=200))
def test_the_tie_order_is_a_bijection_read_back_exactly(seed, corpus, values):
    ties = TieOrder(seed, corpus)
    x = np.array(values + [0, 2**32 - 1], np.uint32)
    image = ties.forward(x.copy())
    assert np.array_equal(ties.inverse(image.copy()), x)


def test_the_tie_order_maps_a_range_onto_distinct_values_that_look_shuffled():
    ties = TieOrder(0, 1)
    image = ties.forward(np.arange(1 << 20, dtype=np.uint32))
    assert len(np.unique(image)) == 1 << 20
    ranks = np.argsort(np.argsort(image))
    # the order of the indexes by their image is uncorrelated with the indexes (a shuffle, not a shift)
    assert abs(np.corrcoef(ranks, np.arange(1 << 20))[0, 1]) < 0.01
    assert not np.array_equal(TieOrder(0, 2).forward(np.arange(100, dtype=np.uint32)), image[:100])
    assert not np.array_equal(TieOrder(1, 1).forward(np.arange(100, dtype=np.uint32)), image[:100])


# --- the deal order ---------------------------------------------------------------------------------


def _deal_order(seconds, seed=5, c=2, run=planner.SORT_RUN):
    from concurrent.futures import ThreadPoolExecutor

    old = planner.SORT_RUN
    planner.SORT_RUN = run
    try:
        with ThreadPoolExecutor(2) as pool:
            return planner._packed_deal_key(pool, None, seconds, seed, c)()
    finally:
        planner.SORT_RUN = old


@pytest.mark.parametrize("run", [1 << 21, 97])  # one run, and many runs merged
def test_version_2_deals_longest_first_and_equal_durations_in_the_tie_order(run):
    rng = np.random.default_rng(4)
    seconds = np.round(rng.gamma(8, 0.5, 5000), 1)  # many equal durations
    order = _deal_order(seconds, run=run)
    assert sorted(order.tolist()) == list(range(5000))
    dealt = seconds[order]
    assert (np.diff(dealt) <= 0).all()
    image = TieOrder(5, 2).forward(order.astype(np.uint32))
    for value in np.unique(seconds):
        assert (np.diff(image[dealt == value].astype(np.int64)) > 0).all()


def test_version_2_orders_by_float32_and_minus_zero_as_zero():
    seconds = np.array([1.0, -0.0, 2.5, 1.0 + 1e-12, 0.0, 2.5 + 1e-3])
    dealt = seconds[_deal_order(seconds)]
    assert dealt[:2].tolist() == [2.5 + 1e-3, 2.5]
    assert set(dealt[2:4].tolist()) == {1.0, 1.0 + 1e-12}  # equal as float32: a tie, in the tie order
    assert [abs(x) for x in dealt[4:]] == [0.0, 0.0]


# --- plans ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case,digests", list(zip(CASES, V2_DIGESTS)))
def test_version_2_plans_are_balanced_deterministic_and_pinned(case, digests):
    plans = [_plan(case, threads=t) for t in (1, 3)]
    assert plan_digest(plans[0]) == plan_digest(plans[1])
    assert np.array_equal(plans[0].seconds, plans[1].seconds)
    plan = plans[0]
    assert plan.version == 2 and plan.summary()["plan_version"] == 2
    assert plan.balanced and plan.max_deviation <= plan.tolerance / 2 + 1e-9
    assert (plan_digest(plan), _seconds_digest(plan)) == digests


@pytest.mark.parametrize("case", CASES)
def test_version_2_keeps_what_version_1_promises(case):
    """The same shard count and counts of copies per corpus and per shard; every copy of an utterance
    placed once, copies numbered 0, 1, ... without a gap; only which copies go where differs."""
    one, two = _plan(case, version=1), _plan(case, version=2)
    assert plan_digest(one) != plan_digest(two)
    s1, s2 = one.summary(), two.summary()
    for key in ("num_shards", "utterances_per_shard", "utterances", "balanced"):
        assert s1[key] == s2[key], key
    counts = ("utterances", "kept", "repeated", "dropped", "padded", "remainder_dropped", "copies_out")
    assert [[c[k] for k in counts] for c in s1["corpora"]] == [[c[k] for k in counts] for c in s2["corpora"]]
    assert np.array_equal(one.shard_corpus_counts, two.shard_corpus_counts)
    for c in range(len(two.names)):
        mine = two.corpus == c
        utt, copy = two.utt[mine].astype(np.int64), two.copy[mine].astype(np.int64)
        assert len(np.unique(utt * 2**20 + copy)) == len(utt)  # (utterance, copy) once each
        held = np.bincount(utt)
        most = np.zeros(len(held), np.int64)
        np.maximum.at(most, utt, copy)
        assert np.array_equal(held[held > 0], most[held > 0] + 1)  # copies 0..k-1 of an utterance held k times


@pytest.mark.parametrize("version", [2, 3])
def test_fractional_weights_keep_a_seeded_subset_and_padding_repeats_distinct_copies(version):
    durations = [np.full(1000, 4.0), np.full(30, 9.0)]
    settings = PlanSettings(world_size=4, num_workers=2, num_shards=64, seed=11, version=version)
    plan = plan_balance(durations, [0.37, 1.0], settings)
    kept = np.unique(plan.utt[(plan.corpus == 0) & (plan.copy == 0)])
    assert len(kept) == 370
    again = plan_balance(durations, [0.37, 1.0], dataclasses.replace(settings, seed=12))
    assert not np.array_equal(np.unique(again.utt[(again.corpus == 0) & (again.copy == 0)]), kept)
    for c in (0, 1):
        padded = plan.utt[(plan.corpus == c) & (plan.copy == 1)]
        assert len(padded) == plan.corpora[c]["padded"] > 0 and len(np.unique(padded)) == len(padded)
    assert np.isin(plan.utt[(plan.corpus == 0) & (plan.copy == 1)], kept).all()  # repeats of kept copies only


def test_an_unknown_version_and_a_corpus_too_large_for_version_2_are_usage_errors(monkeypatch):
    with pytest.raises(UsageError, match=r"--plan-version must be one of 1, 2, 3 \(got 4\)"):
        plan_balance([np.ones(10)], [1.0], PlanSettings(world_size=1, num_workers=1, version=4))
    monkeypatch.setattr(planner, "TIE_BITS", 8)  # 2**7 copies stand for 2**31
    with pytest.raises(UsageError, match=r"corpus 'big': plan version 2 deals fewer than 2\*\*31 copies of a "
                                         r"corpus \(200 utterances at weight 1\); plan it with --plan-version 1"):
        plan_balance([np.ones(200)], [1.0], PlanSettings(world_size=1, num_workers=1, num_shards=1, version=2),
                     names=["big"])
    with pytest.raises(UsageError, match=r"corpus 'big': plan version 3 deals fewer than 2\*\*31 copies"):
        plan_balance([np.ones(100)], [2.0], PlanSettings(world_size=1, num_workers=1, num_shards=1), names=["big"])


# --- balance --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpora")
    for spec in SMALL_CORPORA:
        write_shards(list(corpus_utterances(spec, seed=5)), str(root / spec.name), utts_per_shard=2, codec="none")
    return root


def _balance_four_shards(corpora, out, *args):
    corpus_args = [a for spec in SMALL_CORPORA for a in ("--corpus", f"{spec.name}={corpora / spec.name}")]
    return CliRunner().invoke(main, ["balance", *corpus_args, "--world-size", "2", "--num-workers", "1",
                                     "--num-shards", "4", "--codec", "none", "-o", str(out), "-q", "-j", "1",
                                     *map(str, args)])


def _listed_keys(out):
    from shardkit.io.tar import group_samples, iter_shard_members

    return [[s["__key__"] for s in group_samples(iter_shard_members(p))] for p in open(out / "data.list").read().split()]


def test_balance_plans_version_3_by_default_and_versions_1_and_2_when_asked(corpora, tmp_path):
    runs = {}
    for version in (None, "1", "2", "3"):
        out = tmp_path / f"v{version}"
        result = _balance_four_shards(corpora, out, "--json", *(("--plan-version", version) if version else ()))
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        report = json.load(open(out / "balance.json"))
        assert summary["plan_version"] == report["summary"]["plan_version"] == int(version or 3)
        assert report["settings"]["plan_version"] == int(version or 3)
        runs[version] = _listed_keys(out)
    assert runs[None] == runs["3"]
    originals = [sorted(k for k in sum(runs[v], []) if "-rep" not in k) for v in ("1", "2", "3")]
    assert originals[0] == originals[1] == originals[2]  # the same utterances, dealt otherwise
    assert len(sum(runs["1"], [])) == len(sum(runs["2"], [])) == len(sum(runs["3"], []))
    result = _balance_four_shards(corpora, tmp_path / "bad", "--plan-version", "4")
    assert result.exit_code == 2 and "'4' is not one of '1', '2', '3'" in result.output


def test_a_rerun_with_another_version_rewrites_what_the_plan_changed(corpora, tmp_path):
    out = tmp_path / "out"
    assert _balance_four_shards(corpora, out, "--plan-version", "1").exit_code == 0
    result = _balance_four_shards(corpora, out, "--json")  # the default, version 3, over version 1's shards
    assert result.exit_code == 0, result.output
    fresh = tmp_path / "fresh"
    assert _balance_four_shards(corpora, fresh).exit_code == 0
    names = sorted(n for n in os.listdir(fresh) if n.startswith("shards_"))
    assert [open(out / n, "rb").read() for n in names] == [open(fresh / n, "rb").read() for n in names]
    assert json.loads(result.stdout)["written"]["ok"] >= 1


def test_slices_planned_with_different_versions_are_not_merged(corpora, tmp_path):
    out = tmp_path / "out"
    assert _balance_four_shards(corpora, out, "--split", "1/2", "--plan-version", "1").exit_code == 0
    assert _balance_four_shards(corpora, out, "--split", "2/2").exit_code == 0
    result = CliRunner().invoke(main, ["merge-reports", str(out), "--command", "balance"])
    assert result.exit_code == 1
    assert not (out / "data.list").exists()
