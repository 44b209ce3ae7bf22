"""shardkit.planning.trainers: NeMo's and Lhotse's dealing, checked against their own code (lhotse's split functions,
driven by the environment variables it reads; NeMo's rules restated from its source in tests/nemo_split.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import nemo_split
from shardkit.planning.trainers import consumer_shards, trainer_figures

GRID = list(itertools.product([1, 3, 8, 12, 13], [1, 2, 4], [1, 2, 3]))


@pytest.mark.parametrize("num_shards,world_size,num_workers", GRID)
def test_nemo_rules_are_nemos(num_shards, world_size, num_workers):
    names = [f"audio_{k}.tar" for k in range(num_shards)]
    pattern = "audio__OP_0.." + str(num_shards - 1) + "_CL_.tar"
    for strategy in ("scatter", "replicate"):
        for rank, worker in itertools.product(range(world_size), range(num_workers)):
            theirs = nemo_split.split_by_workers(
                nemo_split.expand_sharded_filepaths(pattern, strategy, world_size, rank), worker, num_workers)
            ours = [names[k] for k in consumer_shards(f"nemo-{strategy}", rank, worker, num_shards, world_size,
                                                      num_workers)]
            assert ours == theirs


@pytest.mark.parametrize("num_shards,world_size,num_workers", GRID)
def test_shar_rule_is_lhotses(num_shards, world_size, num_workers, monkeypatch):
    from lhotse.shar.readers.utils import split_by_node, split_by_worker

    shards = list(range(num_shards))
    seen = []
    for rank, worker in itertools.product(range(world_size), range(num_workers)):
        for name, value in dict(RANK=rank, WORLD_SIZE=world_size, WORKER=worker, NUM_WORKERS=num_workers).items():
            monkeypatch.setenv(name, str(value))
        theirs = split_by_worker(split_by_node(shards))
        assert consumer_shards("shar", rank, worker, num_shards, world_size, num_workers) == theirs
        seen += theirs
    assert sorted(seen) == shards  # Shar drops nothing


def test_scatter_names_what_it_drops_and_replicate_reads_everything_once_per_rank():
    names = [f"audio_{k}.tar" for k in range(10)]
    utts = np.arange(10) + 5
    secs = utts * 2.5
    scatter = trainer_figures("nemo-scatter", names, utts, secs, world_size=4, num_workers=2, batch_size=4)
    assert not scatter["divides"]
    assert scatter["dropped"] == {"shards": ["audio_8.tar", "audio_9.tar"], "utterances": 13 + 14,
                                  "seconds": 27 * 2.5}
    assert [r["shards"] for r in scatter["ranks"]] == [2, 2, 2, 2]
    # rank 0 reads shards 0 and 1, one a worker: ceil(5 / 4) + ceil(6 / 4) steps
    assert scatter["ranks"][0] == {"rank": 0, "shards": 2, "utterances": 11, "seconds": 27.5, "steps": 4}
    assert scatter["rank_spread"] == pytest.approx((11 + 12) / (5 + 6))  # rank 3 (shards 6, 7) over rank 0
    replicate = trainer_figures("nemo-replicate", names, utts, secs, world_size=4, num_workers=2)
    assert replicate["dropped"]["shards"] == [] and replicate["reads_per_utterance"] == 4
    assert {r["utterances"] for r in replicate["ranks"]} == {int(utts.sum())}


def test_shar_leaves_a_consumer_a_shard_more_when_the_count_does_not_divide():
    figures = trainer_figures("shar", [f"s{k}" for k in range(5)], [10] * 5, [20.0] * 5, world_size=2, num_workers=2)
    assert not figures["divides"] and figures["dropped"]["shards"] == []
    assert [w["shards"] for w in figures["workers"]] == [2, 1, 1, 1]
    assert figures["rank_spread"] == 1.5 and figures["step_spread"] == 10


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        trainer_figures("shar", ["a"], [1], [1.0], world_size=0, num_workers=1)
    with pytest.raises(ValueError):
        consumer_shards("nemo-bucketing", 0, 0, 4, 2, 1)
